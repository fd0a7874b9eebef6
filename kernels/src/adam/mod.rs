//! Optimizer update kernels with bitsandbytes' semantics: 32-bit and 8-bit blockwise Adam and
//! AdamW (`adam32`, `adamw32`, `adam8bit`, `adamw8bit`). The formulas and their sources are in
//! `docs/optimizers.md`; every operation below is one `f32` operation with its own rounding
//! (round to nearest even) unless it says `fma`.
//!
//! Layout: the flattened parameter of `n` elements in blocks of [`OPTIM_BLOCKSIZE`] (256)
//! elements, block `b` = elements `b*256 .. min((b+1)*256, n)`; one work item per block. The
//! hyperparameters arrive as `f32` scalars computed on the host in `f64` ([`AdamHyper::scalars`]).
//!
//! Per element, with `g` the gradient widened to `f32`:
//! * moments: `m = fma(g, one_minus_beta1, m * beta1)`,
//!   `v = fma(one_minus_beta2 * g, g, v * beta2)`;
//! * a non-finite `g` (NaN or ±inf) sets `m = v = +0.0` and leaves the parameter unchanged (no
//!   weight decay either), as bitsandbytes' blockwise kernels do: both widths select the old
//!   value and store it back (a straight-line loop body), so an `f16`/`bf16` NaN parameter
//!   comes back as the format's NaN of the same sign;
//! * AdamW only (decoupled weight decay, before the update): `p = p * decay`;
//! * 32-bit step: `p = fma(m / (sqrt(v) + eps_c2), step_size, p)`;
//! * 8-bit step: `p = p + (step_size * m) / (sqrt(v) / c2 + eps)`;
//! * the parameter is stored rounded to nearest even in its dtype.
//!
//! 8-bit state: `state1` holds codes of the signed dynamic map with one `f32` `absmax1` per block,
//! `state2` codes of the unsigned dynamic map with `absmax2`. A work item dequantizes its block
//! (`code[q] * absmax`) and updates the moments twice, bit-identically: a first pass finds the
//! new absmax (the NaN-ignoring `max |x|` of the updated moments); a second, straight-line pass
//! (no branch, so a vectorizing backend can take it whole) updates the parameter (selecting the
//! old value where the gradient is not finite) and requantizes the moments exactly as
//! [`crate::blockwise8`] does (`x * (1 / max(absmax, 1e-38))`, exact nearest code in
//! O(1) by [`crate::nearest`], ties to the lower code). The staged form
//! ([`crate::optim_staged`]) keeps the first pass's moments in two `f32` workspace
//! buffers instead of recomputing them (same bits; what the runtime runs on CPUs).
//!
//! The `_gs` variants ([`crate::optim_ext`]) add `gnorm_scale` (and, for 32-bit state,
//! `skip_zeros`) scalars after the others: `g` is multiplied by `gnorm_scale` first, and a skipped
//! element keeps its parameter and moments (selected, so the loops stay straight-line).
//!
//! Parameter order (`[decay]` only for AdamW):
//! * 32-bit `adam{,w}32_{dtype}`: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, beta2,
//!   one_minus_beta2, [decay], step_size, eps_c2: f32, p: dtype[n] readwrite, g: dtype[n] read,
//!   state1: f32[n] readwrite, state2: f32[n] readwrite)`.
//! * 8-bit `adam{,w}8bit_{dtype}`: `(n: u32, n_blocks: u32, beta1, one_minus_beta1, beta2,
//!   one_minus_beta2, [decay], step_size, c2, eps: f32, p: dtype[n] readwrite, g: dtype[n] read,
//!   state1: u8[n] readwrite, absmax1: f32[n_blocks] readwrite, state2: u8[n] readwrite,
//!   absmax2: f32[n_blocks] readwrite)`.

mod catalog;
pub(crate) mod host;
pub mod optim8;
#[cfg(test)]
mod tests;

use crate::adam::optim8::build8;
use crate::emit::block_range;
#[cfg(test)]
use crate::emit::inv_absmax;
use crate::nearest::{self, Nearest8Tables};
use crate::{check_float_dtype, BlockwiseMap};
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, ParamId, TableId, Value};
use qforge_ir::{DType, Scalar, ScalarType};
use qforge_ir::{Error, Result};

/// Elements per work item and per 8-bit absmax block (bitsandbytes' optimizer blocksize).
pub const OPTIM_BLOCKSIZE: u32 = 256;

/// Checks a 1-based step number and returns it as the exponent `t` of the bias corrections
/// `beta^t` (`f64::powi` takes an `i32`).
///
/// # Errors
/// [`Error::Unsupported`] for step 0 or a step above `i32::MAX`.
pub(crate) fn step_exponent(step: u32) -> Result<i32> {
    if step == 0 {
        return Err(Error::Unsupported(
            "optimizer step counts start at 1, got 0".into(),
        ));
    }
    i32::try_from(step).map_err(|_| {
        Error::Unsupported(format!(
            "optimizer step {step} is above the largest supported step count {}",
            i32::MAX
        ))
    })
}

/// Checks the `f32` kernel scalars derived from the hyperparameters: each must be finite (a
/// finite `f64` value such as `lr * weight_decay` can overflow `f32`), and the `positive` ones
/// (denominators such as `eps`) above 0 (a tiny `eps` can round to 0 in `f32`).
///
/// # Errors
/// [`Error::Unsupported`] naming the first bad scalar.
pub(crate) fn check_f32_scalars(values: &[(&str, f32)], positive: &[&str]) -> Result<()> {
    for (name, v) in values {
        let must_be_positive = positive.contains(name);
        if !v.is_finite() || (must_be_positive && *v <= 0.0) {
            let want = if must_be_positive {
                "finite and above 0"
            } else {
                "finite"
            };
            return Err(Error::Unsupported(format!(
                "optimizer hyperparameters give the f32 kernel value {name} = {v:e}, which must \
                 be {want}: the hyperparameters it is computed from are out of f32 range"
            )));
        }
    }
    Ok(())
}

/// The update rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptimAlgo {
    /// Adam without weight decay.
    Adam,
    /// Adam with decoupled weight decay `p *= 1 - lr * weight_decay` before the update.
    AdamW,
}

impl OptimAlgo {
    /// `adam` or `adamw`.
    pub const fn name(self) -> &'static str {
        match self {
            OptimAlgo::Adam => "adam",
            OptimAlgo::AdamW => "adamw",
        }
    }
}

/// How the two moments are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateBits {
    /// `f32` moments.
    Bits32,
    /// 8-bit blockwise codes (signed dynamic map for `m`, unsigned for `v`) and absmax per block.
    Bits8,
}

impl StateBits {
    /// `32` or `8bit` (the kernel-name suffix).
    pub const fn name(self) -> &'static str {
        match self {
            StateBits::Bits32 => "32",
            StateBits::Bits8 => "8bit",
        }
    }
}

/// One optimizer kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OptimSpec {
    /// Adam or AdamW.
    pub algo: OptimAlgo,
    /// 32-bit or 8-bit state.
    pub state: StateBits,
    /// Dtype of the parameter and the gradient: `f32`, `f16` or `bf16`.
    pub dtype: DType,
}

/// Hyperparameters as the user gives them (bitsandbytes' names), in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamHyper {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (AdamW only; must be 0 for Adam).
    pub weight_decay: f64,
}

impl Default for AdamHyper {
    /// bitsandbytes' defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.
    fn default() -> Self {
        AdamHyper {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// The `f32` kernel scalars of one step, derived on the host in `f64` and rounded once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamScalars {
    /// `f32(beta1)`.
    pub beta1: f32,
    /// `f32(1 - beta1)`.
    pub one_minus_beta1: f32,
    /// `f32(beta2)`.
    pub beta2: f32,
    /// `f32(1 - beta2)`.
    pub one_minus_beta2: f32,
    /// `f32(1 - lr * weight_decay)`.
    pub decay: f32,
    /// 32-bit: `f32(-lr * c2 / c1)`; 8-bit: `f32(-lr / c1)`.
    pub step_size: f32,
    /// `f32(c2)` with `c2 = sqrt(1 - beta2^t)` (8-bit).
    pub c2: f32,
    /// `f32(eps)` (8-bit).
    pub eps: f32,
    /// `f32(eps * c2)` (32-bit).
    pub eps_c2: f32,
}

impl AdamHyper {
    /// Checks the values: finite, `lr >= 0`, betas in `[0, 1)`, `eps > 0`, `weight_decay >= 0`,
    /// and `weight_decay == 0` for Adam.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the first bad value.
    pub fn check(&self, algo: OptimAlgo) -> Result<()> {
        let bad = |what: &str, v: f64, need: &str| {
            Err(Error::Unsupported(format!(
                "optimizer hyperparameter {what} = {v} is invalid: it must be {need}"
            )))
        };
        let AdamHyper {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = *self;
        if !(lr.is_finite() && lr >= 0.0) {
            return bad("lr", lr, "finite and >= 0");
        }
        for (name, b) in [("beta1", beta1), ("beta2", beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(name, b, "in [0, 1)");
            }
        }
        if !(eps.is_finite() && eps > 0.0) {
            return bad("eps", eps, "finite and > 0");
        }
        if !(weight_decay.is_finite() && weight_decay >= 0.0) {
            return bad("weight_decay", weight_decay, "finite and >= 0");
        }
        if algo == OptimAlgo::Adam && weight_decay != 0.0 {
            return bad(
                "weight_decay",
                weight_decay,
                "0 for Adam (use AdamW for decoupled weight decay)",
            );
        }
        Ok(())
    }

    /// The kernel scalars of step `step` (1-based): `c1 = 1 - beta1^t`, `c2 = sqrt(1 - beta2^t)`
    /// and every derived value in `f64`, each rounded once to `f32`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or above `i32::MAX`, invalid hyperparameters
    /// ([`AdamHyper::check`]), or hyperparameters whose `f32` scalars overflow or whose `eps`
    /// rounds to 0.
    pub fn scalars(&self, spec: &OptimSpec, step: u32) -> Result<AdamScalars> {
        self.check(spec.algo)?;
        let t = step_exponent(step)?;
        let c1 = 1.0 - self.beta1.powi(t);
        let c2 = (1.0 - self.beta2.powi(t)).sqrt();
        let step_size = match spec.state {
            StateBits::Bits32 => -self.lr * c2 / c1,
            StateBits::Bits8 => -self.lr / c1,
        };
        let s = AdamScalars {
            beta1: self.beta1 as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            decay: (1.0 - self.lr * self.weight_decay) as f32,
            step_size: step_size as f32,
            c2: c2 as f32,
            eps: self.eps as f32,
            eps_c2: (self.eps * c2) as f32,
        };
        check_f32_scalars(
            &[
                ("decay", s.decay),
                ("step_size", s.step_size),
                ("c2", s.c2),
                ("eps", s.eps),
                ("eps_c2", s.eps_c2),
            ],
            &["eps", "eps_c2"],
        )?;
        Ok(s)
    }
}

impl AdamScalars {
    /// The `f32` scalar arguments of `spec`'s kernel, in parameter order (after `n` and
    /// `n_blocks`).
    pub fn kernel_args(&self, spec: &OptimSpec) -> Vec<Scalar> {
        let mut out = vec![
            self.beta1,
            self.one_minus_beta1,
            self.beta2,
            self.one_minus_beta2,
        ];
        if spec.algo == OptimAlgo::AdamW {
            out.push(self.decay);
        }
        match spec.state {
            StateBits::Bits32 => out.extend([self.step_size, self.eps_c2]),
            StateBits::Bits8 => out.extend([self.step_size, self.c2, self.eps]),
        }
        out.into_iter().map(Scalar::f32).collect()
    }
}

impl OptimSpec {
    /// The kernel name, e.g. `adamw8bit_bf16`, `adam32_f32`.
    pub fn name(&self) -> String {
        format!("{}{}_{}", self.algo.name(), self.state.name(), self.dtype)
    }

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a parameter dtype other than f32, f16, bf16.
    pub fn build(&self) -> Result<Kernel> {
        check_float_dtype(self.dtype)?;
        match self.state {
            StateBits::Bits32 => build32(self, None),
            StateBits::Bits8 => build8(self, &self.name(), Form::default()),
        }
    }

    /// Builds the `_gs` variant named `name` ([`crate::optim_ext`]): the same kernel
    /// with the scalars `gnorm_scale: f32` (and, for 32-bit state, `skip_zeros: u32`) after the
    /// others.
    ///
    /// # Errors
    /// As [`OptimSpec::build`].
    pub(crate) fn build_ext(&self, name: &str) -> Result<Kernel> {
        check_float_dtype(self.dtype)?;
        match self.state {
            StateBits::Bits32 => build32(self, Some(name)),
            StateBits::Bits8 => build8(
                self,
                name,
                Form {
                    grad_opts: true,
                    ..Form::default()
                },
            ),
        }
    }

    /// Builds the 8-bit kernel named `name` whose step is multiplied by a trust-ratio scale: one
    /// more buffer `scale: f32[1] read` after the others, and `step_size` replaced by
    /// `scale[0] * step_size` (one rounding, once per work item), as `lamb32_{dtype}` does
    /// ([`crate::optim_norm8`]). With `scale = 1` it equals the plain kernel bit for
    /// bit. `gs`: also the `_gs` scalar `gnorm_scale` ([`OptimSpec::build_ext`]).
    ///
    /// # Errors
    /// As [`OptimSpec::build`]; [`Error::Unsupported`] for 32-bit state.
    pub(crate) fn build_scaled(&self, name: &str, gs: bool) -> Result<Kernel> {
        check_float_dtype(self.dtype)?;
        match self.state {
            StateBits::Bits8 => build8(
                self,
                name,
                Form {
                    grad_opts: gs,
                    scaled: true,
                    staged: false,
                },
            ),
            StateBits::Bits32 => Err(Error::Unsupported(format!(
                "{name}: the scaled Adam kernel needs 8-bit state (32-bit: optim_norm)"
            ))),
        }
    }
}

/// The gradient options of a `_gs` kernel variant, as values: `g` is multiplied by
/// `gnorm_scale` first; `skip` is the `skip_zeros != 0` flag (`None` where the kernel ignores
/// `skip_zeros`).
#[derive(Clone, Copy)]
pub(crate) struct GradOpts {
    /// `gnorm_scale`.
    pub(crate) scale: Value,
    /// `skip_zeros != 0`.
    pub(crate) skip: Option<Value>,
}

/// Declares the `_gs` scalars (`gnorm_scale: f32`, then `skip_zeros: u32` when `with_skip`).
pub(crate) fn declare_grad_opts(
    b: &mut KernelBuilder,
    with_skip: bool,
) -> (ParamId, Option<ParamId>) {
    let scale = b.scalar_param("gnorm_scale", ScalarType::F32);
    let skip = with_skip.then(|| b.scalar_param("skip_zeros", ScalarType::U32));
    (scale, skip)
}

/// Reads the `_gs` scalars declared by [`declare_grad_opts`].
pub(crate) fn read_grad_opts(
    b: &mut KernelBuilder,
    (scale, skip): (ParamId, Option<ParamId>),
) -> GradOpts {
    let scale = b.param(scale);
    let skip = skip.map(|s| {
        let v = b.param(s);
        let zero = b.const_u32(0);
        b.cmp(CmpOp::Ne, v, zero)
    });
    GradOpts { scale, skip }
}

/// `skip && x == 0` (`x` is `+0` or `-0`): the element is skipped.
pub(crate) fn skipped(b: &mut KernelBuilder, skip: Value, x: Value) -> Value {
    let zero = b.const_f32(0.0);
    let is_zero = b.cmp(CmpOp::Eq, x, zero);
    b.and(skip, is_zero)
}

/// The scalar parameters shared by both state widths, as values.
struct Hyper {
    beta1: Value,
    one_minus_beta1: Value,
    beta2: Value,
    one_minus_beta2: Value,
    decay: Option<Value>,
}

/// Declares `n`, `n_blocks` and the hyperparameter scalars; the remaining (width-specific)
/// scalar names follow in `tail`.
fn declare_scalars(
    b: &mut KernelBuilder,
    spec: &OptimSpec,
    tail: &[&str],
) -> (ParamId, ParamId, Vec<ParamId>) {
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let mut names = vec!["beta1", "one_minus_beta1", "beta2", "one_minus_beta2"];
    if spec.algo == OptimAlgo::AdamW {
        names.push("decay");
    }
    names.extend_from_slice(tail);
    let ps = names
        .iter()
        .map(|s| b.scalar_param(s, ScalarType::F32))
        .collect();
    (n, n_blocks, ps)
}

/// Reads the shared scalars; returns them and the width-specific rest.
fn read_scalars(b: &mut KernelBuilder, spec: &OptimSpec, ps: &[ParamId]) -> (Hyper, Vec<Value>) {
    let vals: Vec<Value> = ps.iter().map(|p| b.param(*p)).collect();
    let wd = usize::from(spec.algo == OptimAlgo::AdamW);
    let h = Hyper {
        beta1: vals[0],
        one_minus_beta1: vals[1],
        beta2: vals[2],
        one_minus_beta2: vals[3],
        decay: (wd == 1).then(|| vals[4]),
    };
    (h, vals[4 + wd..].to_vec())
}

/// The moment update of one element: `(finite, m, v)` where a non-finite `g` gives `+0.0` for
/// both moments.
fn moments(b: &mut KernelBuilder, h: &Hyper, g: Value, m_old: Value, v_old: Value) -> [Value; 3] {
    let betas = [h.beta1, h.one_minus_beta1, h.beta2, h.one_minus_beta2];
    let [m, v] = moment_update(b, betas, g, m_old, v_old);
    let finite = is_finite(b, g);
    let zero = b.const_f32(0.0);
    let m = b.select(finite, m, zero);
    let v = b.select(finite, v, zero);
    [finite, m, v]
}

/// `|g| < inf`: `g` is neither NaN nor ±inf.
fn is_finite(b: &mut KernelBuilder, g: Value) -> Value {
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    b.cmp(CmpOp::Lt, ag, inf)
}

/// The Adam moments of one element before the non-finite rule, from
/// `[beta1, one_minus_beta1, beta2, one_minus_beta2]`: `m = fma(g, one_minus_beta1, m * beta1)`,
/// `v = fma(one_minus_beta2 * g, g, v * beta2)` (also LAMB's, `optim_norm.rs`).
pub(crate) fn moment_update(
    b: &mut KernelBuilder,
    [beta1, one_minus_beta1, beta2, one_minus_beta2]: [Value; 4],
    g: Value,
    m_old: Value,
    v_old: Value,
) -> [Value; 2] {
    let mb = b.mul(m_old, beta1);
    let m = b.fma(g, one_minus_beta1, mb);
    let gs = b.mul(one_minus_beta2, g);
    let vb = b.mul(v_old, beta2);
    let v = b.fma(gs, g, vb);
    [m, v]
}

/// `p * decay` for AdamW, `p` for Adam.
fn decayed(b: &mut KernelBuilder, h: &Hyper, p: Value) -> Value {
    match h.decay {
        Some(d) => b.mul(p, d),
        None => p,
    }
}

fn build32(spec: &OptimSpec, ext: Option<&str>) -> Result<Kernel> {
    let mut b = KernelBuilder::new(&ext.map_or_else(|| spec.name(), str::to_string));
    let (n, n_blocks, ps) = declare_scalars(&mut b, spec, &["step_size", "eps_c2"]);
    let opts = ext.map(|_| declare_grad_opts(&mut b, true));
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", spec.dtype, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", spec.dtype, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::F32, &shape, Access::ReadWrite);
    let s2 = b.buffer_param("state2", DType::F32, &shape, Access::ReadWrite);
    b.set_grid(Dim::Param(n_blocks));
    let (h, rest) = read_scalars(&mut b, spec, &ps);
    let opts = opts.map(|o| read_grad_opts(&mut b, o));
    let (step_size, eps_c2) = (rest[0], rest[1]);
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    b.for_range(start, end, 1, |b, e| {
        let mut gv = b.load(g, e);
        let m_old = b.load(s1, e);
        let v_old = b.load(s2, e);
        if let Some(o) = opts {
            gv = b.mul(gv, o.scale);
        }
        let [mut finite, mut m, mut v] = moments(b, &h, gv, m_old, v_old);
        // `_gs`: a skipped element (scaled gradient exactly zero) keeps its moments and its
        // parameter (no weight decay either).
        if let Some(skip) = opts.and_then(|o| o.skip) {
            let sk = skipped(b, skip, gv);
            m = b.select(sk, m_old, m);
            v = b.select(sk, v_old, v);
            let keep = b.not(sk);
            finite = b.and(finite, keep);
        }
        b.store(s1, e, m);
        b.store(s2, e, v);
        // Straight-line (no branch, so a vectorizing backend takes the loop whole): a
        // non-finite gradient keeps the old parameter value.
        let pv = b.load(p, e);
        let pd = decayed(b, &h, pv);
        let sv = b.sqrt(v);
        let den = b.add(sv, eps_c2);
        let r = b.div(m, den);
        let stepped = b.fma(r, step_size, pd);
        let out = b.select(finite, stepped, pv);
        b.store_auto(p, e, out);
    });
    Ok(b.finish())
}

/// The 8-bit state tables of one map: the code values and the nearest-code search.
pub(crate) struct StateTables {
    /// The code values.
    pub(crate) code: TableId,
    /// The exact nearest-code search ([`crate::nearest`]).
    pub(crate) nearest: Nearest8Tables,
}

/// Declares the code and search tables of `map` (names suffixed with `which`).
pub(crate) fn state_tables(
    b: &mut KernelBuilder,
    map: BlockwiseMap,
    which: &str,
) -> Result<StateTables> {
    let code = map.code();
    Ok(StateTables {
        code: b.table_f32(&format!("code{which}"), &code),
        nearest: nearest::declare(b, &code, which)?,
    })
}

/// The variant of an 8-bit kernel [`build8`] builds.
#[derive(Clone, Copy, Default)]
pub struct Form {
    /// The `_gs` scalar `gnorm_scale` ([`OptimSpec::build_ext`]).
    pub(crate) grad_opts: bool,
    /// The trust-ratio buffer `scale: f32[1]` last ([`OptimSpec::build_scaled`]).
    pub(crate) scaled: bool,
    /// The staged form ([`crate::optim_staged`]): the first pass stores the updated
    /// moments in the workspace buffers `m_stage`, `v_stage` (`f32[n]`, after the others) and the
    /// second pass reads them back instead of decoding the codes again.
    pub(crate) staged: bool,
}

/// The builder version of the 8-bit kernel named `name` in the variant `form`, as it was before
/// the kernel moved to the kernel language ([`crate::adam::optim8`]); tests prove the two
/// equal.
#[cfg(test)]
pub(crate) fn build8_builder(spec: &OptimSpec, name: &str, form: Form) -> Result<Kernel> {
    let mut b = KernelBuilder::new(name);
    let (n, n_blocks, ps) = declare_scalars(&mut b, spec, &["step_size", "c2", "eps"]);
    // bitsandbytes' 8-bit two-state kernel ignores `skip_zeros`: only `gnorm_scale`.
    let opts = form.grad_opts.then(|| declare_grad_opts(&mut b, false));
    let shape = [Dim::Param(n)];
    let blocks = [Dim::Param(n_blocks)];
    let p = b.buffer_param("p", spec.dtype, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", spec.dtype, &shape, Access::Read);
    let s1 = b.buffer_param("state1", DType::U8, &shape, Access::ReadWrite);
    let a1 = b.buffer_param("absmax1", DType::F32, &blocks, Access::ReadWrite);
    let s2 = b.buffer_param("state2", DType::U8, &shape, Access::ReadWrite);
    let a2 = b.buffer_param("absmax2", DType::F32, &blocks, Access::ReadWrite);
    let scale = form
        .scaled
        .then(|| b.buffer_param("scale", DType::F32, &[Dim::Const(1)], Access::Read));
    let stage = form.staged.then(|| {
        ["m_stage", "v_stage"].map(|s| b.buffer_param(s, DType::F32, &shape, Access::ReadWrite))
    });
    b.set_grid(Dim::Param(n_blocks));
    let t1 = state_tables(&mut b, BlockwiseMap::Dynamic, "1")?;
    let t2 = state_tables(&mut b, BlockwiseMap::DynamicUnsigned, "2")?;
    let (h, rest) = read_scalars(&mut b, spec, &ps);
    let opts = opts.map(|o| read_grad_opts(&mut b, o));
    let (mut step_size, c2, eps) = (rest[0], rest[1], rest[2]);
    // 8-bit LAMB: `ss = scale[0] * step_size`, where `lamb32` multiplies it.
    if let Some(scale) = scale {
        let zero = b.const_u32(0);
        let sc = b.load(scale, zero);
        step_size = b.mul(sc, step_size);
    }
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    let old_a1 = b.load(a1, block);
    let old_a2 = b.load(a2, block);
    // The gradient of element `e` (scaled by `gnorm_scale` in a `_gs` kernel).
    let grad = |b: &mut KernelBuilder, e: Value| -> Value {
        let gv = b.load(g, e);
        match opts {
            Some(o) => b.mul(gv, o.scale),
            None => gv,
        }
    };
    // The updated moments of element `e`, from the (unchanged) old codes.
    let update = |b: &mut KernelBuilder, e: Value| -> [Value; 3] {
        let gv = grad(b, e);
        let q1 = b.load(s1, e);
        let c1 = b.lookup(t1.code, q1);
        let m_old = b.mul(c1, old_a1);
        let q2 = b.load(s2, e);
        let c2v = b.lookup(t2.code, q2);
        let v_old = b.mul(c2v, old_a2);
        moments(b, &h, gv, m_old, v_old)
    };
    let acc1 = b.var("absmax1_acc", ScalarType::F32);
    let acc2 = b.var("absmax2_acc", ScalarType::F32);
    // Pass 1: the new absmax of each moment (and, staged, the moments themselves).
    b.for_range(start, end, 1, |b, e| {
        let [_, m, v] = update(b, e);
        if let Some([ms, vs]) = stage {
            b.store(ms, e, m);
            b.store(vs, e, v);
        }
        for (acc, x) in [(acc1, m), (acc2, v)] {
            let a = b.abs(x);
            let cur = b.read_var(acc);
            // max(cur, a) = select(a > cur, a, cur): a NaN moment is skipped.
            let mx = b.max(cur, a);
            b.assign(acc, mx);
        }
    });
    let new_a1 = b.read_var(acc1);
    let new_a2 = b.read_var(acc2);
    b.store(a1, block, new_a1);
    b.store(a2, block, new_a2);
    let inv1 = inv_absmax(&mut b, new_a1);
    let inv2 = inv_absmax(&mut b, new_a2);
    // Pass 2 (straight-line): the same moments again (recomputed bit-identically, or read back
    // from the stage), the parameter, and the moments requantized with the new absmax.
    b.for_range(start, end, 1, |b, e| {
        let [finite, m, v] = match stage {
            None => update(b, e),
            Some([ms, vs]) => {
                let gv = grad(b, e);
                let finite = is_finite(b, gv);
                [finite, b.load(ms, e), b.load(vs, e)]
            }
        };
        let pv = b.load(p, e);
        let pd = decayed(b, &h, pv);
        let num = b.mul(step_size, m);
        let sv = b.sqrt(v);
        let d = b.div(sv, c2);
        let den = b.add(d, eps);
        let upd = b.div(num, den);
        let stepped = b.add(pd, upd);
        // A non-finite gradient leaves the parameter as it was.
        let out = b.select(finite, stepped, pv);
        b.store_auto(p, e, out);
        let sm = b.mul(m, inv1);
        let q1 = nearest::emit_code(b, sm, &t1.nearest);
        let sv = b.mul(v, inv2);
        let q2 = nearest::emit_code(b, sv, &t2.nearest);
        b.store(s1, e, q1);
        b.store(s2, e, q2);
    });
    Ok(b.finish())
}

/// The gradient of the optimizers' example arguments: `values` rotated by one, with a NaN at
/// the last element (n >= 2) and `+inf` at the middle one (n >= 3).
pub(crate) fn example_grad(values: &[f32]) -> Vec<f32> {
    let n = values.len();
    let mut grad: Vec<f32> = (0..n).map(|i| values[(i + 1) % n]).collect();
    if n >= 2 {
        grad[n - 1] = f32::NAN;
    }
    if n >= 3 {
        grad[n / 2] = f32::INFINITY;
    }
    grad
}

/// The 8-bit absmax of the optimizers' example arguments: the NaN-ignoring `max |x|` of each
/// block of `values`.
pub(crate) fn example_absmax(values: &[f32]) -> Vec<f32> {
    values
        .chunks(OPTIM_BLOCKSIZE as usize)
        .map(|c| {
            c.iter()
                .filter(|x| !x.is_nan())
                .fold(0.0f32, |a, x| a.max(x.abs()))
        })
        .collect()
}

/// The hyperparameters of the catalog's example arguments: AdamW-like values at step 3.
const EXAMPLE_STEP: u32 = 3;

/// [`crate::KernelSpec::example_args`] of an optimizer kernel on `values` (`n >= 1`):
/// the parameter is `values`; the gradient is `values` rotated by one with a NaN at the last
/// element (n >= 2) and `+inf` at the middle one (n >= 3); 32-bit state is
/// `m = values[i] * 0.5`, `v = |values[i]|`; 8-bit codes are mixed from the values and each
/// absmax is the NaN-ignoring `max |x|` of the block's values (0, inf and NaN-only blocks
/// included).
pub(crate) fn example_args(
    spec: &OptimSpec,
    values: &[f32],
    mix: impl Fn(usize, f32) -> u32,
    float_bytes: impl Fn(DType, &[f32]) -> Vec<u8>,
) -> Result<Vec<qforge_ir::OwnedArg>> {
    use qforge_ir::OwnedArg;
    let n = values.len();
    let bs = OPTIM_BLOCKSIZE as usize;
    let n_blocks = n.div_ceil(bs);
    let grad = example_grad(values);
    let hyper = AdamHyper {
        weight_decay: if spec.algo == OptimAlgo::AdamW {
            0.01
        } else {
            0.0
        },
        ..AdamHyper::default()
    };
    let scalars = hyper.scalars(spec, EXAMPLE_STEP)?;
    let mut args = vec![
        OwnedArg::Scalar(Scalar::U32(n as u32)),
        OwnedArg::Scalar(Scalar::U32(n_blocks as u32)),
    ];
    args.extend(scalars.kernel_args(spec).into_iter().map(OwnedArg::Scalar));
    args.push(OwnedArg::Write(float_bytes(spec.dtype, values)));
    args.push(OwnedArg::Read(float_bytes(spec.dtype, &grad)));
    match spec.state {
        StateBits::Bits32 => {
            let m: Vec<f32> = values.iter().map(|v| v * 0.5).collect();
            let v: Vec<f32> = values.iter().map(|v| v.abs()).collect();
            args.push(OwnedArg::Write(float_bytes(DType::F32, &m)));
            args.push(OwnedArg::Write(float_bytes(DType::F32, &v)));
        }
        StateBits::Bits8 => {
            let absmax = example_absmax(values);
            let codes = |salt: usize| -> Vec<u8> {
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| mix(i + salt, *v) as u8)
                    .collect()
            };
            args.push(OwnedArg::Write(codes(0)));
            args.push(OwnedArg::Write(float_bytes(DType::F32, &absmax)));
            args.push(OwnedArg::Write(codes(7919)));
            let absmax2: Vec<f32> = absmax.iter().map(|a| a * a).collect();
            args.push(OwnedArg::Write(float_bytes(DType::F32, &absmax2)));
        }
    }
    Ok(args)
}
