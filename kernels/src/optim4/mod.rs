//! Low-bit AdamW with per-moment quantization schemes, as the adamw4bit library (nubank,
//! `QuantizedAdamW`, `ZEEDENAdamW4Bit`, `ZIPSRAdamW4Bit`) computes it: NF4 first moment, 4-bit
//! dynamic (Dyn4) second moment with EDEN scale calibration (ZE-EDEN) or stochastic rounding in
//! preconditioner space (ZIP-SR), 8-bit linear, or `f32`. Every formula and its source is in
//! `docs/optimizers.md` ("4-bit AdamW"); each operation below is one `f32` operation with its own
//! rounding unless it says `fma`.
//!
//! # One step, per element (`g` the gradient widened to `f32`)
//! * load: `m = table[code] * absmax[block]` (8-bit linear: `f32(code / 127) * absmax`);
//! * moments (torch `lerp_`, one rounding): `m1 = fma(w1, g - m1, m1)`,
//!   `m2 = fma(w2, g * g - m2, m2)` with `w1 = f32(1 - beta1)`, `w2 = f32(1 - beta2)`;
//! * a non-finite `g` (NaN or ±inf) sets `m1 = m2 = +0.0` and leaves the parameter unchanged
//!   (qforge's policy, as its 8-bit optimizers: the reference library instead poisons the block);
//! * `p = p * decay`, then `p = p + (neg_step * m1) / (sqrt(m2) / sqrt_c2 + eps)` with the
//!   unquantized moments of this step; stored rounded to nearest even in the parameter dtype;
//! * store: each quantized moment is requantized per block with `absmax = max(max |x|, floor)`
//!   (NaN propagating; floor `1e-12` for 4-bit, `1e-8` for 8-bit) and `s = x / absmax`.
//!
//! # Layout
//! The flattened tensor of `n` elements; 4-bit moments use blocks of 128 elements with codes
//! packed two per byte, **element `2i` in the low nibble** of byte `i` (as adamw4bit stores them;
//! the opposite of bitsandbytes' weights); 8-bit linear moments use blocks of 256 with one `i8`
//! code per element. One work item covers [`QAdamSpec::item_size`] elements (256 when a moment is
//! 8-bit, else 128), i.e. one or two blocks of each moment. A last, partial block (only reached
//! when `n` is not a multiple of the block, which the runtime never launches for quantized
//! moments) simply has fewer elements; its odd pad nibble is 0.
//!
//! # Parameters, in order
//! `(n, n_items, n_packed, n_blocks1, n_blocks2: u32, w1, w2, decay, neg_step, sqrt_c2, eps,
//! c2: f32, seed_lo, seed_hi, param_id, step, offset: u32, p: dtype[n] readwrite, g: dtype[n] read,` then for each
//! moment `k` in 1, 2: `m{k}: f32[n]` (fp32), or `m{k}_code: u8[n_packed]` and
//! `m{k}_absmax: f32[n_blocks{k}]` (4-bit), or `m{k}_code: i8[n]` and `m{k}_absmax:
//! f32[n_blocks{k}]` (8-bit), all readwrite; then, with [`UniformSource::Buffer`] only,
//! `m{k}_uniform: f32[n] read` for each stochastically rounded moment `k`; then, in the staged
//! form ([`QAdamSpec::staged`]), `m{k}_stage: f32[n] readwrite` for each quantized moment `k`
//! (contents on entry never read; on exit the updated values))`. Grid `n_items`.
//!
//! # Random bits
//! A stochastically rounded element `e` of moment `k`, at `i = offset + e` in the whole tensor,
//! uses the uniform `(w >> 8) * 2^-24` of word `w = x[i % 2]` of Philox4x32-10
//! `x = philox(counter = (i / 2, step, param_id, k), key = (seed_lo, seed_hi))` (`offset`, the
//! launch's first element within the whole tensor, must be even; one call serves the two
//! elements of a byte): the code depends only on the seed, the parameter id, the step and the
//! element index, never on the backend, the chunking or the thread layout. [`UniformSource::Buffer`] (tests only) reads the uniform from a
//! buffer instead, so the arithmetic can be checked against the reference's mt19937 stream.

mod catalog;
pub(crate) mod host;
pub(crate) mod launch;
pub mod quant;
mod scheme;
#[cfg(test)]
mod tests;

use crate::check_float_dtype;
use crate::emit::{block_range, load_f32_or_zero};
use crate::optim4::quant::{self as q, Neighbours, Precond};
use qforge_ir::routines::philox::{philox4x32_10, uniform_f32};
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, ParamId, TableId, Value, VarId};
use qforge_ir::{DType, ScalarType};
use qforge_ir::{Error, Result};

pub use crate::optim4::scheme::{
    MomentScheme, QAdamScalars, QAdamSizes, ABSMAX_FLOOR4, ABSMAX_FLOOR8, EDEN_DOT_FLOOR,
    QADAM_BLOCK4, QADAM_BLOCK8, QADAM_MIN_NUMEL,
};

/// Where stochastic rounding takes its uniforms from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UniformSource {
    /// Philox4x32-10 keyed by (seed, parameter id, step, element index): the real kernels.
    Philox,
    /// A `f32[n]` buffer per stochastic moment (tests: replaying the reference's mt19937 stream).
    Buffer,
}

/// One quantized-AdamW kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QAdamSpec {
    /// First-moment scheme (`fp32`, `nf4`, `nf4_sr`, `linear8`).
    pub m1: MomentScheme,
    /// Second-moment scheme (`fp32`, `dyn4`, `dyn4_nz`, `dyn4_nz_eden`, `dyn4_sr`, `linear8`).
    pub m2: MomentScheme,
    /// Dtype of the parameter and the gradient: `f32`, `f16` or `bf16`.
    pub dtype: DType,
    /// Where stochastic rounding draws its uniforms.
    pub uniforms: UniformSource,
    /// The staged form: pass 1 also stores each quantized moment's updated values in a
    /// workspace buffer `m{k}_stage: f32[n] readwrite` (after the other parameters), and the
    /// absmax, EDEN and code passes read them back instead of decoding and updating the moment
    /// again. Same bits as the plain kernel; what the runtime runs on CPUs.
    pub staged: bool,
}

impl QAdamSpec {
    /// A spec with Philox uniforms.
    pub fn new(m1: MomentScheme, m2: MomentScheme, dtype: DType) -> QAdamSpec {
        QAdamSpec {
            m1,
            m2,
            dtype,
            uniforms: UniformSource::Philox,
            staged: false,
        }
    }

    /// This spec in the staged form ([`QAdamSpec::staged`]).
    pub fn staged(self) -> QAdamSpec {
        QAdamSpec {
            staged: true,
            ..self
        }
    }

    /// The kernel name, e.g. `qadamw_nf4_dyn4_sr_f32` (`_staged` appended for the staged form,
    /// then `_ubuf` for [`UniformSource::Buffer`]).
    pub fn name(&self) -> String {
        let staged = if self.staged { "_staged" } else { "" };
        let tail = match self.uniforms {
            UniformSource::Philox => "",
            UniformSource::Buffer => "_ubuf",
        };
        format!(
            "qadamw_{}_{}_{}{staged}{tail}",
            self.m1, self.m2, self.dtype
        )
    }

    /// Elements per work item: 256 when a moment is 8-bit linear, else 128.
    pub fn item_size(&self) -> u32 {
        self.m1.block().max(self.m2.block()).max(QADAM_BLOCK4)
    }

    /// The size scalars for `n` elements.
    pub fn sizes(&self, n: u32) -> QAdamSizes {
        let blocks = |s: MomentScheme| match s.block() {
            0 => 0,
            bs => n.div_ceil(bs),
        };
        QAdamSizes {
            n,
            n_items: n.div_ceil(self.item_size()),
            n_packed: n.div_ceil(2),
            n_blocks1: blocks(self.m1),
            n_blocks2: blocks(self.m2),
        }
    }

    /// Checks the spec: a float dtype, a signed scheme for m1 and an unsigned one for m2.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the bad value and the allowed set.
    pub fn check(&self) -> Result<()> {
        check_float_dtype(self.dtype)?;
        if !self.m1.signed() {
            return Err(Error::Unsupported(format!(
                "first-moment scheme '{}' is not supported; allowed: fp32, nf4, nf4_sr, linear8",
                self.m1
            )));
        }
        if !self.m2.unsigned() {
            return Err(Error::Unsupported(format!(
                "second-moment scheme '{}' is not supported; allowed: fp32, dyn4, dyn4_nz, \
                 dyn4_nz_eden, dyn4_sr, linear8",
                self.m2
            )));
        }
        Ok(())
    }

    /// Builds the kernel (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when [`QAdamSpec::check`] fails.
    pub fn build(&self) -> Result<Kernel> {
        self.check()?;
        build(self)
    }
}

/// The buffers and tables of one moment.
#[derive(Clone, Copy)]
struct Moment {
    scheme: MomentScheme,
    /// 1 or 2 (Philox stream word and names).
    which: u32,
    /// `f32` state, or the codes.
    state: ParamId,
    absmax: Option<ParamId>,
    uniform: Option<ParamId>,
    table: Option<TableId>,
    n_blocks: ParamId,
    /// The staged form's workspace of the updated values.
    stage: Option<ParamId>,
}

/// Values every element computation reads.
struct Ctx {
    g: ParamId,
    n: Value,
    w1: Value,
    w2: Value,
    seed: [Value; 2],
    param_id: Value,
    step: Value,
    offset: Value,
    base: Value,
    item_size: u32,
}

fn declare_moment(
    b: &mut KernelBuilder,
    scheme: MomentScheme,
    which: u32,
    n: ParamId,
    n_packed: ParamId,
    n_blocks: ParamId,
) -> Moment {
    let rw = Access::ReadWrite;
    let (state, absmax) = match scheme.bits() {
        4 => (
            b.buffer_param(
                &format!("m{which}_code"),
                DType::U8,
                &[Dim::Param(n_packed)],
                rw,
            ),
            Some(b.buffer_param(
                &format!("m{which}_absmax"),
                DType::F32,
                &[Dim::Param(n_blocks)],
                rw,
            )),
        ),
        8 => (
            b.buffer_param(&format!("m{which}_code"), DType::I8, &[Dim::Param(n)], rw),
            Some(b.buffer_param(
                &format!("m{which}_absmax"),
                DType::F32,
                &[Dim::Param(n_blocks)],
                rw,
            )),
        ),
        _ => (
            b.buffer_param(&format!("m{which}"), DType::F32, &[Dim::Param(n)], rw),
            None,
        ),
    };
    let table = scheme
        .table()
        .map(|t| b.table_f32(&format!("code{which}"), &t));
    Moment {
        scheme,
        which,
        state,
        absmax,
        uniform: None,
        table,
        n_blocks,
        stage: None,
    }
}

/// The old absmax of each block of the current work item, loaded before any store.
fn old_absmax(b: &mut KernelBuilder, m: &Moment, item: Value, item_size: u32) -> Vec<Value> {
    let (Some(absmax), bs) = (m.absmax, m.scheme.block()) else {
        return Vec::new();
    };
    let per = item_size / bs;
    let per_v = b.const_u32(per);
    let first = b.mul(item, per_v);
    let limit = b.param(m.n_blocks);
    (0..per)
        .map(|j| {
            let off = b.const_u32(j);
            let idx = b.add(first, off);
            load_f32_or_zero(b, absmax, idx, limit, &format!("old_absmax{}_{j}", m.which))
        })
        .collect()
}

/// The stored (dequantized) moment of element `e`; a 4-bit code is read from byte `byte` when
/// given (the caller's `e >> 1`, as a value a vectorizing backend recognises as its loop
/// index), else from byte `e >> 1`.
fn load_moment(
    b: &mut KernelBuilder,
    cx: &Ctx,
    m: &Moment,
    old: &[Value],
    e: Value,
    byte: Option<Value>,
) -> Value {
    match m.scheme.bits() {
        32 => b.load(m.state, e),
        bits => {
            let scale = match old {
                [only] => *only,
                _ => {
                    let off = b.sub(e, cx.base);
                    let bs = b.const_u32(m.scheme.block());
                    let second = b.cmp(CmpOp::Ge, off, bs);
                    b.select(second, old[1], old[0])
                }
            };
            let unit = if bits == 4 {
                let one = b.const_u32(1);
                let byte_i = match byte {
                    Some(i) => i,
                    None => b.shr(e, one),
                };
                let byte = b.load(m.state, byte_i);
                let odd = b.and(e, one);
                let two = b.const_u32(2);
                let sh = b.shl(odd, two);
                let c = b.shr(byte, sh);
                let mask = b.const_u32(15);
                let c = b.and(c, mask);
                let table = m.table.expect("4-bit schemes have a table");
                b.lookup(table, c)
            } else {
                let c = b.load(m.state, e);
                q::lin8_value(b, c)
            };
            b.mul(unit, scale)
        }
    }
}

/// The updated moments of element `e` and whether its gradient is finite: `(finite, m1, m2)`.
fn update(
    b: &mut KernelBuilder,
    cx: &Ctx,
    ms: (&Moment, &Moment),
    olds: (&[Value], &[Value]),
    e: Value,
) -> [Value; 3] {
    let g = b.load(cx.g, e);
    let m1_old = load_moment(b, cx, ms.0, olds.0, e, None);
    let m2_old = load_moment(b, cx, ms.1, olds.1, e, None);
    let d1 = b.sub(g, m1_old);
    let m1 = b.fma(cx.w1, d1, m1_old);
    let gg = b.mul(g, g);
    let d2 = b.sub(gg, m2_old);
    let m2 = b.fma(cx.w2, d2, m2_old);
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    let finite = b.cmp(CmpOp::Lt, ag, inf);
    let zero = b.const_f32(0.0);
    let m1 = b.select(finite, m1, zero);
    let m2 = b.select(finite, m2, zero);
    [finite, m1, m2]
}

/// The updated value of moment `m` (`which` = 1 or 2) of element `e` alone (the store passes
/// need one moment; same bits as [`update`]), read back from the stage in the staged form;
/// `byte` as for [`load_moment`].
fn moment_value(
    b: &mut KernelBuilder,
    cx: &Ctx,
    m: &Moment,
    old: &[Value],
    e: Value,
    byte: Option<Value>,
) -> Value {
    if let Some(stage) = m.stage {
        return b.load(stage, e);
    }
    let g = b.load(cx.g, e);
    let prev = load_moment(b, cx, m, old, e, byte);
    let new = if m.which == 1 {
        let d = b.sub(g, prev);
        b.fma(cx.w1, d, prev)
    } else {
        let gg = b.mul(g, g);
        let d = b.sub(gg, prev);
        b.fma(cx.w2, d, prev)
    };
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    let finite = b.cmp(CmpOp::Lt, ag, inf);
    let zero = b.const_f32(0.0);
    b.select(finite, new, zero)
}

/// The uniforms of the element pair `(e0, e0 + 1)` for moment `m` (`e0` even): from the
/// buffer, or words 0 and 1 of one Philox call with counter `((offset + e0) / 2, step,
/// param_id, which)` (`offset` is even). From a buffer, the second is read at `e0` again when
/// `has1` (`e0 + 1 < end`) is false (the caller discards it then).
fn pair_uniforms(
    b: &mut KernelBuilder,
    cx: &Ctx,
    m: &Moment,
    e0: Value,
    has1: Value,
) -> (Value, Value) {
    match m.uniform {
        Some(buf) => {
            let u0 = b.load(buf, e0);
            // The second is read at `e0 + 1` when that is in the block, else again at `e0`
            // (its value is then unused).
            let one = b.const_u32(1);
            let e1 = b.add(e0, one);
            let e1 = b.select(has1, e1, e0);
            (u0, b.load(buf, e1))
        }
        None => {
            let stream = b.const_u32(m.which);
            let at = b.add(e0, cx.offset);
            let one = b.const_u32(1);
            let pair = b.shr(at, one);
            let words = philox4x32_10(b, [pair, cx.step, cx.param_id, stream], cx.seed);
            (uniform_f32(b, words[0]), uniform_f32(b, words[1]))
        }
    }
}

/// The code of a moment value `x` of block scale `absmax` (floored).
fn code_of(
    b: &mut KernelBuilder,
    m: &Moment,
    x: Value,
    absmax: Value,
    pc: (Value, Value),
    u: Option<Value>,
) -> Value {
    let s = b.div(x, absmax);
    let nb = |b: &mut KernelBuilder| -> Neighbours {
        q::neighbours(b, s, m.table.expect("4-bit schemes have a table"))
    };
    match m.scheme {
        MomentScheme::Nf4 | MomentScheme::Dyn4 => {
            let nb = nb(b);
            q::rtn_code(b, s, &nb)
        }
        MomentScheme::Dyn4Nz | MomentScheme::Dyn4NzEden => {
            let nb = nb(b);
            let c = q::rtn_code(b, s, &nb);
            q::floor_code1(b, c)
        }
        MomentScheme::Nf4Sr => {
            let nb = nb(b);
            let u = u.unwrap_or(x);
            q::sr_value_code(b, s, &nb, u)
        }
        MomentScheme::Dyn4Sr => {
            let nb = nb(b);
            let u = u.unwrap_or(x);
            let pc = Precond {
                absmax,
                c2: pc.0,
                eps: pc.1,
            };
            q::sr_precond_code(b, s, &nb, u, &pc)
        }
        MomentScheme::Linear8 => q::lin8_code(b, s),
        MomentScheme::Fp32 => x,
    }
}

fn build(spec: &QAdamSpec) -> Result<Kernel> {
    let mut b = KernelBuilder::new(&spec.name());
    let u = |b: &mut KernelBuilder, s: &str| b.scalar_param(s, ScalarType::U32);
    let n = u(&mut b, "n");
    let n_items = u(&mut b, "n_items");
    let n_packed = u(&mut b, "n_packed");
    let n_blocks1 = u(&mut b, "n_blocks1");
    let n_blocks2 = u(&mut b, "n_blocks2");
    let fs: Vec<ParamId> = ["w1", "w2", "decay", "neg_step", "sqrt_c2", "eps", "c2"]
        .iter()
        .map(|s| b.scalar_param(s, ScalarType::F32))
        .collect();
    let seed_lo = u(&mut b, "seed_lo");
    let seed_hi = u(&mut b, "seed_hi");
    let param_id = u(&mut b, "param_id");
    let step = u(&mut b, "step");
    let offset = u(&mut b, "offset");
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", spec.dtype, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", spec.dtype, &shape, Access::Read);
    let mut m1 = declare_moment(&mut b, spec.m1, 1, n, n_packed, n_blocks1);
    let mut m2 = declare_moment(&mut b, spec.m2, 2, n, n_packed, n_blocks2);
    if spec.uniforms == UniformSource::Buffer {
        for m in [&mut m1, &mut m2] {
            if m.scheme.stochastic() {
                let name = format!("m{}_uniform", m.which);
                m.uniform = Some(b.buffer_param(&name, DType::F32, &shape, Access::Read));
            }
        }
    }
    if spec.staged {
        for m in [&mut m1, &mut m2] {
            if m.scheme != MomentScheme::Fp32 {
                let name = format!("m{}_stage", m.which);
                m.stage = Some(b.buffer_param(&name, DType::F32, &shape, Access::ReadWrite));
            }
        }
    }
    b.set_grid(Dim::Param(n_items));
    let f: Vec<Value> = fs.iter().map(|p| b.param(*p)).collect();
    let (decay, neg_step, sqrt_c2, eps, c2) = (f[2], f[3], f[4], f[5], f[6]);
    let item = b.work_item();
    let nv = b.param(n);
    let item_size = spec.item_size();
    let (start, end) = block_range(&mut b, item, item_size, nv);
    let cx = Ctx {
        g,
        n: nv,
        w1: f[0],
        w2: f[1],
        seed: [b.param(seed_lo), b.param(seed_hi)],
        param_id: b.param(param_id),
        step: b.param(step),
        offset: b.param(offset),
        base: start,
        item_size,
    };
    let old1 = old_absmax(&mut b, &m1, item, item_size);
    let old2 = old_absmax(&mut b, &m2, item, item_size);
    let ms = (&m1, &m2);
    let olds = (old1.as_slice(), old2.as_slice());

    // Pass 1: the parameters (and the f32 moments, stored in place; staged, the quantized
    // moments' values too).
    b.for_range(start, end, 1, |b, e| {
        let [finite, v1, v2] = update(b, &cx, ms, olds, e);
        for (m, v) in [(&m1, v1), (&m2, v2)] {
            if m.scheme == MomentScheme::Fp32 {
                b.store(m.state, e, v);
            }
            if let Some(stage) = m.stage {
                b.store(stage, e, v);
            }
        }
        // Straight-line (a vectorizing backend takes the loop whole): a non-finite gradient
        // keeps the old parameter value.
        let pv = b.load(p, e);
        let pd = b.mul(pv, decay);
        let num = b.mul(neg_step, v1);
        let r = b.sqrt(v2);
        let d = b.div(r, sqrt_c2);
        let den = b.add(d, eps);
        let upd = b.div(num, den);
        let stepped = b.add(pd, upd);
        let out = b.select(finite, stepped, pv);
        b.store_auto(p, e, out);
    });

    // Then each quantized moment, block by block.
    for (k, m) in [(1usize, &m1), (2, &m2)] {
        if m.scheme == MomentScheme::Fp32 {
            continue;
        }
        store_moment(&mut b, &cx, ms, olds, k, item, (c2, eps))?;
    }
    Ok(b.finish())
}

/// Requantizes moment `k` (1 or 2) of the current work item: per block, the absmax, the EDEN
/// scale (ZE-EDEN), the absmax store and the codes.
fn store_moment(
    b: &mut KernelBuilder,
    cx: &Ctx,
    ms: (&Moment, &Moment),
    olds: (&[Value], &[Value]),
    k: usize,
    item: Value,
    pc: (Value, Value),
) -> Result<()> {
    let m = if k == 1 { ms.0 } else { ms.1 };
    let bs = m.scheme.block();
    let per = cx.item_size / bs;
    let absmax_buf = m.absmax.expect("quantized moments have an absmax");
    let old = if k == 1 { olds.0 } else { olds.1 };
    let value =
        move |b: &mut KernelBuilder, e: Value| -> Value { moment_value(b, cx, m, old, e, None) };
    for j in 0..per {
        let per_v = b.const_u32(per);
        let first = b.mul(item, per_v);
        let off = b.const_u32(j);
        let blk = b.add(first, off);
        let (bstart, bend) = block_range(b, blk, bs, cx.n);
        let nonempty = b.cmp(CmpOp::Lt, bstart, bend);
        let w = m.which;
        let acc = b.var(&format!("absmax{w}_{j}"), ScalarType::F32);
        let eden_vars: [VarId; 6] = ["tot_x", "tot_y", "p_x", "p_y", "a_x", "a_y"]
            .map(|s| b.var(&format!("eden{w}_{j}_{s}"), ScalarType::F32));
        b.if_then(nonempty, |b| {
            b.for_range(bstart, bend, 1, |b, e| {
                let x = value(b, e);
                q::absmax_step(b, acc, x);
            });
            let raw = b.read_var(acc);
            let floor = b.const_f32(m.scheme.absmax_floor());
            let absmax = b.max(raw, floor);
            let stored = if m.scheme == MomentScheme::Dyn4NzEden {
                // The EDEN terms `(s^2, s * table[code])` of the value at element `e`.
                let table = m.table.expect("4-bit table");
                let terms = move |b: &mut KernelBuilder, e: Value| -> (Value, Value) {
                    let x = value(b, e);
                    let s = b.div(x, absmax);
                    let nb = q::neighbours(b, s, table);
                    let c = q::rtn_code(b, s, &nb);
                    let c = q::floor_code1(b, c);
                    let t = b.lookup(table, c);
                    (b.mul(s, s), b.mul(s, t))
                };
                let len = b.sub(bend, bstart);
                let bs_v = b.const_u32(bs);
                let full = b.cmp(CmpOp::Eq, len, bs_v);
                let [tot_x, tot_y, ..] = eden_vars;
                // Full blocks (all but maybe the last) in the lane-parallel form; the last one
                // with absent elements adding -0.0.
                b.if_else(
                    full,
                    |b| {
                        q::eden_sums_lanes(b, [tot_x, tot_y], |b, i| {
                            let e = b.add(bstart, i);
                            terms(b, e)
                        })
                    },
                    |b| {
                        let one = b.const_u32(1);
                        let last = b.sub(bend, one);
                        q::eden_sums(b, eden_vars, |b, i| {
                            let e = b.add(bstart, i);
                            let present = b.cmp(CmpOp::Lt, e, bend);
                            let ec = b.min(e, last);
                            let (ss, st) = terms(b, ec);
                            (present, ss, st)
                        });
                    },
                );
                let sx = b.read_var(tot_x);
                let sy = b.read_var(tot_y);
                let floor = b.const_f32(EDEN_DOT_FLOOR);
                let den = b.max(sy, floor);
                let c = b.div(sx, den);
                b.mul(absmax, c)
            } else {
                absmax
            };
            let limit = b.param(m.n_blocks);
            let ok = b.cmp(CmpOp::Lt, blk, limit);
            b.if_then(ok, |b| b.store(absmax_buf, blk, stored));
            if m.scheme.bits() == 8 {
                b.for_range(bstart, bend, 1, |b, e| {
                    let x = value(b, e);
                    let c = code_of(b, m, x, absmax, pc, None);
                    b.store(m.state, e, c);
                });
            } else {
                // One byte (two elements) per iteration, straight-line so that a vectorizing
                // backend takes the loop whole: bytes `bstart / 2 .. ceil(bend / 2)` (`bstart`
                // is even). Element `e1 = e0 + 1` past the block end gets the high nibble 0;
                // its code is computed at `e0` instead and discarded.
                let one = b.const_u32(1);
                let first = b.shr(bstart, one);
                let bend1 = b.add(bend, one);
                let last = b.shr(bend1, one);
                b.for_range(first, last, 1, |b, i| {
                    let one = b.const_u32(1);
                    let e0 = b.shl(i, one);
                    let e1 = b.add(e0, one);
                    let has1 = b.cmp(CmpOp::Lt, e1, bend);
                    let e1 = b.select(has1, e1, e0);
                    let (u0, u1) = if m.scheme.stochastic() {
                        let (u0, u1) = pair_uniforms(b, cx, m, e0, has1);
                        (Some(u0), Some(u1))
                    } else {
                        (None, None)
                    };
                    let x0 = moment_value(b, cx, m, old, e0, Some(i));
                    let c0 = code_of(b, m, x0, absmax, pc, u0);
                    let x1 = moment_value(b, cx, m, old, e1, Some(i));
                    let c1 = code_of(b, m, x1, absmax, pc, u1);
                    let zero = b.const_u32(0);
                    let c1 = b.select(has1, c1, zero);
                    let four = b.const_u32(4);
                    let hi = b.shl(c1, four);
                    let byte = b.or(c0, hi);
                    b.store(m.state, i, byte);
                });
            }
        });
    }
    Ok(())
}
