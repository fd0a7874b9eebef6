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
//!
//! Both kernels are written in the kernel language ([`adam32::adam32`], [`optim8::adam8bit`],
//! every form); the host ops launch them through their typed arguments ([`Adam32Args`],
//! [`Adam8bitArgs`]). The builder versions they replaced are kept for the tests in
//! `reference.rs`.

pub mod adam32;
mod catalog;
pub(crate) use catalog::{example_args_gs, example_args_staged};
pub(crate) mod host;
pub mod optim8;
#[cfg(test)]
mod reference;
#[cfg(test)]
pub(crate) mod tests;

pub use crate::adam::adam32::{Adam32, Adam32Args};
pub use crate::adam::optim8::{Adam8bit, Adam8bitArgs};

use crate::adam::optim8::build8;
use crate::check_float_dtype;
use crate::nearest::{self, Nearest8Tables};
use crate::BlockwiseMap;
use qforge_ir::dsl::TypedKernel;
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::{DType, Scalar, ScalarType};
use qforge_ir::{Error, Result};
use qforge_ir::{Kernel, ParamId, TableId, Value};

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
            StateBits::Bits32 => {
                adam32::adam32(self, &self.name(), false).map(TypedKernel::into_kernel)
            }
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
            StateBits::Bits32 => adam32::adam32(self, name, true).map(TypedKernel::into_kernel),
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

    /// The typed 32-bit kernel named `name` ([`adam32::adam32`]); `gs`: the `_gs` variant
    /// ([`OptimSpec::build_ext`]).
    ///
    /// # Errors
    /// As [`OptimSpec::build`]; [`Error::Unsupported`] for 8-bit state.
    pub fn typed32(&self, name: &str, gs: bool) -> Result<TypedKernel<Adam32>> {
        check_float_dtype(self.dtype)?;
        match self.state {
            StateBits::Bits32 => adam32::adam32(self, name, gs),
            StateBits::Bits8 => Err(Error::Unsupported(format!(
                "{name}: {} has 8-bit state, not 32-bit",
                self.name()
            ))),
        }
    }

    /// The typed 8-bit kernel named `name` in the variant `form` ([`optim8::adam8bit`]).
    ///
    /// # Errors
    /// As [`OptimSpec::build`]; [`Error::Unsupported`] for 32-bit state.
    pub(crate) fn typed8(&self, name: &str, form: Form) -> Result<TypedKernel<Adam8bit>> {
        check_float_dtype(self.dtype)?;
        match self.state {
            StateBits::Bits8 => optim8::adam8bit(self, name, form),
            StateBits::Bits32 => Err(Error::Unsupported(format!(
                "{name}: {} has 32-bit state, not 8-bit",
                self.name()
            ))),
        }
    }
}

// The builder fragments below build the optimizer kernels' builder versions (the test-only
// references in each family's `reference.rs`), and any optimizer kernel still on the builder.

/// The gradient options of a `_gs` kernel variant, as values: `g` is multiplied by
/// `gnorm_scale` first; `skip` is the `skip_zeros != 0` flag (`None` where the kernel ignores
/// `skip_zeros`).
#[derive(Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct GradOpts {
    /// `gnorm_scale`.
    pub(crate) scale: Value,
    /// `skip_zeros != 0`.
    pub(crate) skip: Option<Value>,
}

/// Declares the `_gs` scalars (`gnorm_scale: f32`, then `skip_zeros: u32` when `with_skip`).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn declare_grad_opts(
    b: &mut KernelBuilder,
    with_skip: bool,
) -> (ParamId, Option<ParamId>) {
    let scale = b.scalar_param("gnorm_scale", ScalarType::F32);
    let skip = with_skip.then(|| b.scalar_param("skip_zeros", ScalarType::U32));
    (scale, skip)
}

/// Reads the `_gs` scalars declared by [`declare_grad_opts`].
#[cfg_attr(not(test), allow(dead_code))]
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
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn skipped(b: &mut KernelBuilder, skip: Value, x: Value) -> Value {
    let zero = b.const_f32(0.0);
    let is_zero = b.cmp(CmpOp::Eq, x, zero);
    b.and(skip, is_zero)
}

/// The Adam moments of one element before the non-finite rule, from
/// `[beta1, one_minus_beta1, beta2, one_minus_beta2]`: `m = fma(g, one_minus_beta1, m * beta1)`,
/// `v = fma(one_minus_beta2 * g, g, v * beta2)` (also LAMB's, `optim_norm.rs`).
#[cfg_attr(not(test), allow(dead_code))]
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

/// The 8-bit state tables of one map: the code values and the nearest-code search.
// Used by the builder reference versions of the optimizer kernels (tests).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct StateTables {
    /// The code values.
    pub(crate) code: TableId,
    /// The exact nearest-code search ([`crate::nearest`]).
    pub(crate) nearest: Nearest8Tables,
}

/// Declares the code and search tables of `map` (names suffixed with `which`).
#[cfg_attr(not(test), allow(dead_code))]
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
pub(crate) const EXAMPLE_STEP: u32 = 3;
