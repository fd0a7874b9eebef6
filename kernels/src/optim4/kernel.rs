//! The quantized-AdamW kernels in the kernel language: one `#[kernel]` per parameter shape.
//!
//! The parameter list (module docs of [`crate::optim4`]) varies by scheme: a moment is
//! `m{k}: f32[n]`, or `m{k}_code` with `m{k}_absmax`, and `m{k}_code` is `u8[n_packed]` for a
//! 4-bit scheme but `i8[n]` for `linear8`. `#[when]` covers which parameters exist and a shape
//! may be chosen when the kernel is built, but one parameter name has one element type in a
//! `#[kernel]` signature, so there is one kernel per pair of code element types:
//! [`qadamw_c4_c4`], [`qadamw_c4_c8`], [`qadamw_c8_c4`], [`qadamw_c8_c8`] (`c4`: `u8` codes, also
//! used when the moment is `fp32` and has no codes; `c8`: `i8` codes). [`QAdamSpec::build`]
//! picks the one of its schemes ([`CodeTypes`]).

use qforge_ir::dsl::{Buf, Elem, Float, In, InOut, Kind, Scalar, Table, Val, Var};
use qforge_ir::routines::philox::{philox4x32_10, uniform_f32};
use qforge_ir::{Error, Result};
use qforge_ir::{KernelBuilder, ParamId, Rounding};
use qforge_macros::{func, kernel};

use crate::adam::optim8::is_finite;
use crate::funcs::{block_range, load_f32_or_zero};
use crate::optim4::quant::{absmax_nan_step, floor_code1, lin8_code, lin8_value, neighbours};
use crate::optim4::quant::{rtn_code, sr_precond_code, sr_value_code};
use crate::optim4::quant::{EDEN_ACCS, EDEN_LANES, EDEN_ROUNDS};
use crate::optim4::{MomentScheme, QAdamSpec, UniformSource, EDEN_DOT_FLOOR};

/// The code element types of a spec's two moments: which kernel of [`crate::optim4::kernel`]
/// builds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeTypes {
    /// Neither moment is `linear8` ([`qadamw_c4_c4`]).
    C4C4,
    /// Only m2 is `linear8` ([`qadamw_c4_c8`]).
    C4C8,
    /// Only m1 is `linear8` ([`qadamw_c8_c4`]).
    C8C4,
    /// Both moments are `linear8` ([`qadamw_c8_c8`]).
    C8C8,
}

impl CodeTypes {
    /// The kernel shape of `spec`.
    pub fn of(spec: &QAdamSpec) -> CodeTypes {
        match (spec.m1.bits() == 8, spec.m2.bits() == 8) {
            (false, false) => CodeTypes::C4C4,
            (false, true) => CodeTypes::C4C8,
            (true, false) => CodeTypes::C8C4,
            (true, true) => CodeTypes::C8C8,
        }
    }
}

impl CodeTypes {
    /// Checks that `spec` has these code types (is built by this kernel).
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the spec and the kernel it needs.
    pub fn check(self, spec: &QAdamSpec) -> Result<()> {
        let want = CodeTypes::of(spec);
        if want != self {
            return Err(Error::Unsupported(format!(
                "{}: its code types are {want:?}, not {self:?}",
                spec.name()
            )));
        }
        Ok(())
    }
}

/// True when moment scheme `s` has codes (`m{k}_code`, `m{k}_absmax`).
fn quantized(s: MomentScheme) -> bool {
    s != MomentScheme::Fp32
}

/// True when moment scheme `s` of `spec` reads `m{k}_uniform`.
fn uniform_buffer(spec: &QAdamSpec, s: MomentScheme) -> bool {
    spec.uniforms == UniformSource::Buffer && s.stochastic()
}

/// A moment's codes (`u8` or `i8` elements, by the kernel), loaded and stored through
/// [`code_u32`], [`code_i32`] and [`store_code`] so that one body serves both element types.
#[derive(Clone, Copy)]
struct Codes(ParamId);

/// `codes[i]` of 4-bit codes (a byte, `u32`).
fn code_u32(b: &mut KernelBuilder, codes: Codes, i: Val<u32>) -> Result<Val<u32>> {
    Ok(Val::from_value(b.load(codes.0, i.value())))
}

/// `codes[i]` of `linear8` codes (`i32`).
fn code_i32(b: &mut KernelBuilder, codes: Codes, i: Val<u32>) -> Result<Val<i32>> {
    Ok(Val::from_value(b.load(codes.0, i.value())))
}

/// `codes[i] = v` (a 4-bit byte or an `i8` code; the store wraps).
fn store_code<T: Kind>(b: &mut KernelBuilder, codes: Codes, i: Val<u32>, v: Val<T>) -> Result<()> {
    b.store(codes.0, i.value(), v.value());
    Ok(())
}

/// An `f32` kernel variable called `name`.
fn named_var(b: &mut KernelBuilder, name: &str) -> Result<Var<f32>> {
    Ok(qforge_ir::dsl::var::<f32>(b, name))
}

/// Words `0..4` of Philox4x32-10 of `counter` under `key` (the IR routine [`philox4x32_10`]).
fn philox(
    b: &mut KernelBuilder,
    counter: [Val<u32>; 4],
    key: [Val<u32>; 2],
) -> Result<[Val<u32>; 4]> {
    let words = philox4x32_10(b, counter.map(Val::value), key.map(Val::value));
    Ok(words.map(Val::from_value))
}

/// The uniform `(w >> 8) * 2^-24` of a Philox word (the IR routine [`uniform_f32`]).
fn uniform(b: &mut KernelBuilder, w: Val<u32>) -> Result<Val<f32>> {
    Ok(Val::from_value(uniform_f32(b, w.value())))
}

/// The buffers and table of one moment.
#[derive(Clone, Copy)]
struct Mom {
    scheme: MomentScheme,
    /// 1 or 2 (Philox stream word and names).
    which: u32,
    /// `m{k}` (`fp32`).
    values: Option<Buf<InOut<f32>>>,
    /// `m{k}_code`.
    codes: Option<Codes>,
    absmax: Option<Buf<InOut<f32>>>,
    uniform: Option<Buf<In<f32>>>,
    /// `code{k}` (4-bit schemes).
    table: Option<Table<f32>>,
    n_blocks: Scalar<u32>,
    /// The staged form's workspace of the updated values.
    stage: Option<Buf<InOut<f32>>>,
}

/// The moment `which` of `scheme` on its parameters; declares its table `code{which}`.
#[allow(clippy::too_many_arguments)]
fn moment<C: Elem>(
    b: &mut KernelBuilder,
    scheme: MomentScheme,
    which: u32,
    values: Option<Buf<InOut<f32>>>,
    codes: Option<Buf<InOut<C>>>,
    absmax: Option<Buf<InOut<f32>>>,
    uniform: Option<Buf<In<f32>>>,
    n_blocks: Scalar<u32>,
    stage: Option<Buf<InOut<f32>>>,
) -> Result<Mom> {
    let table = scheme
        .table()
        .map(|t| qforge_ir::dsl::table_f32(b, &format!("code{which}"), &t));
    Ok(Mom {
        scheme,
        which,
        values,
        codes: codes.map(|c| Codes(c.id())),
        absmax,
        uniform,
        table,
        n_blocks,
        stage,
    })
}

/// Values every element computation reads.
#[derive(Clone, Copy)]
struct Cx {
    g: Buf<In<Float>>,
    n: Val<u32>,
    w1: Val<f32>,
    w2: Val<f32>,
    seed_lo: Val<u32>,
    seed_hi: Val<u32>,
    param_id: Val<u32>,
    step: Val<u32>,
    offset: Val<u32>,
    /// The work item's first element.
    base: Val<u32>,
    item_size: u32,
}

/// The old absmax of the (one or two) blocks of a moment in the current work item, loaded
/// before any store; none for `fp32`.
#[derive(Clone, Copy)]
struct Olds {
    a0: Option<Val<f32>>,
    a1: Option<Val<f32>>,
}

/// [`Olds`] of moment `m` in work item `item`.
#[func]
fn old_absmax(m: Mom, item: Val<u32>, item_size: u32) -> Olds {
    match m.absmax {
        Some(absmax) => {
            let per = comptime!(item_size / m.scheme.block());
            let first = item * per;
            let limit = read(m.n_blocks);
            let a0 = load_f32_or_zero(
                absmax,
                first + 0u32,
                limit,
                &comptime!(format!("old_absmax{}_0", m.which)),
            );
            let a1 = if comptime!(per == 2) {
                Some(load_f32_or_zero(
                    absmax,
                    first + 1u32,
                    limit,
                    &comptime!(format!("old_absmax{}_1", m.which)),
                ))
            } else {
                None
            };
            Olds {
                a0: Some(a0),
                a1: a1,
            }
        }
        None => Olds { a0: None, a1: None },
    }
}

/// The old absmax of the block of element `e`.
#[func]
fn scale_of(cx: Cx, m: Mom, old: Olds, e: Val<u32>) -> Val<f32> {
    let a0 = comptime!(old.a0.expect("a quantized moment has an old absmax"));
    match old.a1 {
        Some(a1) => {
            let off = e - cx.base;
            let second = off >= comptime!(m.scheme.block());
            select(second, a1, a0)
        }
        None => a0,
    }
}

/// The stored (dequantized) moment of element `e`; a 4-bit code is read from byte `byte` when
/// given (the caller's `e >> 1`, as a value a vectorizing backend recognises as its loop
/// index), else from byte `e >> 1`.
#[func]
fn load_moment(cx: Cx, m: Mom, old: Olds, e: Val<u32>, byte: Option<Val<u32>>) -> Val<f32> {
    match m.values {
        Some(values) => values[e],
        None => {
            let scale = scale_of(cx, m, old, e);
            let codes = comptime!(m.codes.expect("a quantized moment has codes"));
            let unit = if comptime!(m.scheme.bits() == 4) {
                let one = val(1u32);
                let byte_i = match byte {
                    Some(i) => i,
                    None => e >> one,
                };
                let bv = code_u32(codes, byte_i);
                let odd = e & one;
                let sh = odd << 2u32;
                let c = bv >> sh;
                let c = c & 15u32;
                let table = comptime!(m.table.expect("4-bit schemes have a table"));
                table[c]
            } else {
                let c = code_i32(codes, e);
                lin8_value(c)
            };
            unit * scale
        }
    }
}

/// `(finite, m1, m2)`: the updated moments of element `e` (`lerp_`: `fma(w, g - m, m)`, with
/// `g * g` for m2), both `+0.0` for a non-finite gradient.
#[func]
fn update(
    cx: Cx,
    m1: Mom,
    m2: Mom,
    old1: Olds,
    old2: Olds,
    e: Val<u32>,
) -> (Val<bool>, Val<f32>, Val<f32>) {
    let g = cx.g[e];
    let m1_old = load_moment(cx, m1, old1, e, None);
    let m2_old = load_moment(cx, m2, old2, e, None);
    let d1 = g - m1_old;
    let v1 = fma(cx.w1, d1, m1_old);
    let gg = g * g;
    let d2 = gg - m2_old;
    let v2 = fma(cx.w2, d2, m2_old);
    let finite = is_finite(g);
    let zero = val(0.0f32);
    (finite, select(finite, v1, zero), select(finite, v2, zero))
}

/// The updated value of moment `m` of element `e` alone (the store passes need one moment; the
/// same bits as [`update`]), read back from the stage in the staged form; `byte` as for
/// [`load_moment`].
#[func]
fn moment_value(cx: Cx, m: Mom, old: Olds, e: Val<u32>, byte: Option<Val<u32>>) -> Val<f32> {
    match m.stage {
        Some(stage) => stage[e],
        None => {
            let g = cx.g[e];
            let prev = load_moment(cx, m, old, e, byte);
            let new = if comptime!(m.which == 1) {
                let d = g - prev;
                fma(cx.w1, d, prev)
            } else {
                let gg = g * g;
                let d = gg - prev;
                fma(cx.w2, d, prev)
            };
            let finite = is_finite(g);
            let zero = val(0.0f32);
            select(finite, new, zero)
        }
    }
}

/// The uniforms of the element pair `(e0, e0 + 1)` for moment `m` (`e0` even): from the
/// buffer (the second read at `e0` again when `has1` is false; the caller discards it then), or
/// words 0 and 1 of one Philox call with counter `((offset + e0) / 2, step, param_id, which)`.
#[func]
fn pair_uniforms(cx: Cx, m: Mom, e0: Val<u32>, has1: Val<bool>) -> (Val<f32>, Val<f32>) {
    match m.uniform {
        Some(buf) => {
            let u0 = buf[e0];
            let e1 = e0 + 1u32;
            let e1 = select(has1, e1, e0);
            (u0, buf[e1])
        }
        None => {
            let stream = val(m.which);
            let at = e0 + cx.offset;
            let pair = at >> 1u32;
            let words = philox(
                comptime!([pair, cx.step, cx.param_id, stream]),
                comptime!([cx.seed_lo, cx.seed_hi]),
            );
            let u0 = uniform(comptime!(words[0]));
            let u1 = uniform(comptime!(words[1]));
            (u0, u1)
        }
    }
}

/// The 4-bit code of moment value `x` in a block of (floored) scale `absmax`, with the uniform
/// `u` of a stochastic scheme.
#[func]
fn code4_of(
    m: Mom,
    x: Val<f32>,
    absmax: Val<f32>,
    c2: Val<f32>,
    eps: Val<f32>,
    u: Option<Val<f32>>,
) -> Val<u32> {
    let s = x / absmax;
    let table = comptime!(m.table.expect("4-bit schemes have a table"));
    let nb = neighbours(s, table);
    match m.scheme {
        MomentScheme::Dyn4Nz | MomentScheme::Dyn4NzEden => {
            let c = rtn_code(s, nb);
            floor_code1(c)
        }
        MomentScheme::Nf4Sr => sr_value_code(s, nb, comptime!(u.unwrap_or(x))),
        MomentScheme::Dyn4Sr => sr_precond_code(s, nb, comptime!(u.unwrap_or(x)), absmax, c2, eps),
        _ => rtn_code(s, nb),
    }
}

/// The EDEN terms `(s^2, s * table[code])` of the value of element `e` (`dyn4_nz` code).
#[func]
fn eden_terms(cx: Cx, m: Mom, old: Olds, absmax: Val<f32>, e: Val<u32>) -> (Val<f32>, Val<f32>) {
    let x = moment_value(cx, m, old, e, None);
    let s = x / absmax;
    let table = comptime!(m.table.expect("4-bit schemes have a table"));
    let nb = neighbours(s, table);
    let c = rtn_code(s, nb);
    let c = floor_code1(c);
    let t = table[c];
    (s * s, s * t)
}

/// The two EDEN sums of one *full* 128-element block from `bstart` in torch's AVX2 order, with
/// `x_i` the terms of block element `i`, vector `j` = terms `8j..8j+8`:
/// `A_k = ((v_k + v_{k+4}) + v_{k+8}) + v_{k+12}` lane-wise (`k` in `0..4`),
/// `P = ((A_0 + A_1) + A_2) + A_3` and the total `((P[0] + P[1]) + ...) + P[7]`, every partial
/// starting at `-0.0` (so the first addition is exact). Assigned to `tot_x` and `tot_y`, written
/// so that a vectorizing backend runs the lanes together: one straight-line iteration per lane.
#[func]
fn eden_sums_lanes(
    cx: Cx,
    m: Mom,
    old: Olds,
    absmax: Val<f32>,
    bstart: Val<u32>,
    tot_x: Var<f32>,
    tot_y: Var<f32>,
) {
    let neg0 = val(-0.0f32);
    tot_x = neg0;
    tot_y = neg0;
    for lane in val(0u32)..val(EDEN_LANES) {
        let neg0 = val(-0.0f32);
        #[comptime]
        let mut px = neg0;
        #[comptime]
        let mut py = neg0;
        for k in 0..EDEN_ACCS {
            #[comptime]
            let mut ax = neg0;
            #[comptime]
            let mut ay = neg0;
            for r in 0..EDEN_ROUNDS {
                let i = lane + comptime!(EDEN_LANES * (k + EDEN_ACCS * r));
                let e = bstart + i;
                let (x, y) = eden_terms(cx, m, old, absmax, e);
                ax = ax + x;
                ay = ay + y;
            }
            px = px + ax;
            py = py + ay;
        }
        tot_x = tot_x + px;
        tot_y = tot_y + py;
    }
}

/// The two EDEN sums of the last, partial block `bstart..bend` in the same order: the terms of
/// block element `i` (`i` in `0..128`, vector `j = k + 4 r`, `i = 8 j + lane`) with absent
/// elements (`bstart + i >= bend`) adding `-0.0`, the identity; every partial starts at `-0.0`.
/// Assigned to `tot_x` and `tot_y`.
#[func]
fn eden_sums_partial(
    cx: Cx,
    m: Mom,
    old: Olds,
    absmax: Val<f32>,
    bstart: Val<u32>,
    bend: Val<u32>,
    last: Val<u32>,
    tot_x: Var<f32>,
    tot_y: Var<f32>,
    p_x: Var<f32>,
    p_y: Var<f32>,
    a_x: Var<f32>,
    a_y: Var<f32>,
) {
    let neg0 = val(-0.0f32);
    tot_x = neg0;
    tot_y = neg0;
    for lane in val(0u32)..val(EDEN_LANES) {
        let neg0 = val(-0.0f32);
        p_x = neg0;
        p_y = neg0;
        for k in val(0u32)..val(EDEN_ACCS) {
            let neg0 = val(-0.0f32);
            a_x = neg0;
            a_y = neg0;
            for r in val(0u32)..val(EDEN_ROUNDS) {
                let r4 = r * EDEN_ACCS;
                let j = k + r4;
                let j8 = j * EDEN_LANES;
                let i = j8 + lane;
                let e = bstart + i;
                let present = e < bend;
                let ec = min(e, last);
                let (ss, st) = eden_terms(cx, m, old, absmax, ec);
                let neg0 = val(-0.0f32);
                let tx = select(present, ss, neg0);
                a_x = a_x + tx;
                let ty = select(present, st, neg0);
                a_y = a_y + ty;
            }
            p_x = p_x + a_x;
            p_y = p_y + a_y;
        }
        tot_x = tot_x + p_x;
        tot_y = tot_y + p_y;
    }
    let _sx = tot_x;
    let _sy = tot_y;
}

/// Requantizes moment `m` of work item `item`: per block, the absmax, the EDEN scale
/// (ZE-EDEN), the absmax store and the codes.
#[func]
fn store_moment(cx: Cx, m: Mom, old: Olds, item: Val<u32>, c2: Val<f32>, eps: Val<f32>) {
    let bs = comptime!(m.scheme.block());
    let per = comptime!(cx.item_size / bs);
    let w = comptime!(m.which);
    let absmax_buf = comptime!(m.absmax.expect("quantized moments have an absmax"));
    let codes = comptime!(m.codes.expect("quantized moments have codes"));
    for j in 0..per {
        let first = item * per;
        let blk = first + j;
        let (bstart, bend) = block_range(blk, bs, cx.n);
        let nonempty = bstart < bend;
        let acc = named_var(&comptime!(format!("absmax{w}_{j}")));
        let tot_x = named_var(&comptime!(format!("eden{w}_{j}_tot_x")));
        let tot_y = named_var(&comptime!(format!("eden{w}_{j}_tot_y")));
        let p_x = named_var(&comptime!(format!("eden{w}_{j}_p_x")));
        let p_y = named_var(&comptime!(format!("eden{w}_{j}_p_y")));
        let a_x = named_var(&comptime!(format!("eden{w}_{j}_a_x")));
        let a_y = named_var(&comptime!(format!("eden{w}_{j}_a_y")));
        if nonempty {
            for e in bstart..bend {
                let x = moment_value(cx, m, old, e, None);
                absmax_nan_step(acc, x);
            }
            let raw = read(acc);
            let absmax = max(raw, comptime!(m.scheme.absmax_floor()));
            let stored = if comptime!(m.scheme == MomentScheme::Dyn4NzEden) {
                let len = bend - bstart;
                let full = len == bs;
                // Full blocks (all but maybe the last) in the lane-parallel form; the last one
                // with absent elements adding -0.0.
                if full {
                    eden_sums_lanes(cx, m, old, absmax, bstart, tot_x, tot_y);
                } else {
                    let last = bend - 1u32;
                    eden_sums_partial(
                        cx, m, old, absmax, bstart, bend, last, tot_x, tot_y, p_x, p_y, a_x, a_y,
                    );
                }
                let sx = read(tot_x);
                let sy = read(tot_y);
                let den = max(sy, EDEN_DOT_FLOOR);
                let c = sx / den;
                absmax * c
            } else {
                absmax
            };
            let limit = read(m.n_blocks);
            let ok = blk < limit;
            if ok {
                absmax_buf[blk] = stored;
            }
            if comptime!(m.scheme.bits() == 8) {
                for e in bstart..bend {
                    let x = moment_value(cx, m, old, e, None);
                    let s = x / absmax;
                    let c = lin8_code(s);
                    store_code(codes, e, c);
                }
            } else {
                // One byte (two elements) per iteration, straight-line so that a vectorizing
                // backend takes the loop whole: bytes `bstart / 2 .. ceil(bend / 2)` (`bstart`
                // is even). Element `e1 = e0 + 1` past the block end gets the high nibble 0;
                // its code is computed at `e0` instead and discarded.
                let one = val(1u32);
                let first = bstart >> one;
                let bend1 = bend + one;
                let last = bend1 >> one;
                for i in first..last {
                    let one = val(1u32);
                    let e0 = i << one;
                    let e1 = e0 + one;
                    let has1 = e1 < bend;
                    let e1 = select(has1, e1, e0);
                    let (u0, u1) = if comptime!(m.scheme.stochastic()) {
                        let (u0, u1) = pair_uniforms(cx, m, e0, has1);
                        (Some(u0), Some(u1))
                    } else {
                        (None, None)
                    };
                    let x0 = moment_value(cx, m, old, e0, Some(i));
                    let c0 = code4_of(m, x0, absmax, c2, eps, u0);
                    let x1 = moment_value(cx, m, old, e1, Some(i));
                    let c1 = code4_of(m, x1, absmax, c2, eps, u1);
                    let c1 = select(has1, c1, 0u32);
                    let hi = c1 << 4u32;
                    let byte = c0 | hi;
                    store_code(codes, i, byte);
                }
            }
        }
    }
}

/// Pass 1's stores of moment `m`'s updated value `v` of element `e`: in place for `fp32`, into
/// the stage in the staged form.
#[func]
fn store_pass1(m: Mom, e: Val<u32>, v: Val<f32>) {
    match m.values {
        Some(values) => {
            values[e] = v;
        }
        None => {}
    }
    match m.stage {
        Some(stage) => {
            stage[e] = v;
        }
        None => {}
    }
}

/// One quantized-AdamW kernel: `$c1`, `$c2` the element types of `m1_code`, `m2_code`.
macro_rules! qadam_kernel {
    ($(#[$doc:meta])* $fn:ident, $sig:ident, $codes:ident, $c1:ident, $c2:ident) => {
        $(#[$doc])*
        ///
        /// # Errors
        /// As [`QAdamSpec::check`]. The spec must have this kernel's code types
        /// ([`CodeTypes::of`]).
        #[kernel(name = spec.name(), grid = n_items, signature = $sig)]
        // The kernel language spells struct fields out (`g: g`).
        #[allow(clippy::too_many_arguments, clippy::redundant_field_names)]
        pub fn $fn(
            #[config] spec: &QAdamSpec,
            n: u32,
            n_items: u32,
            n_packed: u32,
            n_blocks1: u32,
            n_blocks2: u32,
            w1: f32,
            w2: f32,
            decay: f32,
            neg_step: f32,
            sqrt_c2: f32,
            eps: f32,
            c2: f32,
            seed_lo: u32,
            seed_hi: u32,
            param_id: u32,
            step: u32,
            offset: u32,
            #[shape(n)]
            #[dtype(spec.dtype)]
            p: InOut<Float>,
            #[shape(n)]
            #[dtype(spec.dtype)]
            g: In<Float>,
            #[when(!quantized(spec.m1))]
            #[shape(n)]
            m1: InOut<f32>,
            #[when(quantized(spec.m1))]
            #[shape(if spec.m1.bits() == 4 { n_packed } else { n })]
            m1_code: InOut<$c1>,
            #[when(quantized(spec.m1))]
            #[shape(n_blocks1)]
            m1_absmax: InOut<f32>,
            #[when(!quantized(spec.m2))]
            #[shape(n)]
            m2: InOut<f32>,
            #[when(quantized(spec.m2))]
            #[shape(if spec.m2.bits() == 4 { n_packed } else { n })]
            m2_code: InOut<$c2>,
            #[when(quantized(spec.m2))]
            #[shape(n_blocks2)]
            m2_absmax: InOut<f32>,
            #[when(uniform_buffer(spec, spec.m1))]
            #[shape(n)]
            m1_uniform: In<f32>,
            #[when(uniform_buffer(spec, spec.m2))]
            #[shape(n)]
            m2_uniform: In<f32>,
            #[when(spec.staged && quantized(spec.m1))]
            #[shape(n)]
            m1_stage: InOut<f32>,
            #[when(spec.staged && quantized(spec.m2))]
            #[shape(n)]
            m2_stage: InOut<f32>,
        ) {
            comptime!(spec.check()?);
            comptime!(CodeTypes::$codes.check(spec)?);
            let mom1 = moment(
                spec.m1, 1u32, m1, m1_code, m1_absmax, m1_uniform, n_blocks1, m1_stage,
            );
            let mom2 = moment(
                spec.m2, 2u32, m2, m2_code, m2_absmax, m2_uniform, n_blocks2, m2_stage,
            );
            let w1 = w1;
            let w2 = w2;
            let decay = decay;
            let neg_step = neg_step;
            let sqrt_c2 = sqrt_c2;
            let eps = eps;
            let c2 = c2;
            let item = work_item();
            let nv = n;
            let item_size = comptime!(spec.item_size());
            let (start, end) = block_range(item, item_size, nv);
            let cx = Cx {
                g: g,
                n: nv,
                w1: w1,
                w2: w2,
                seed_lo: seed_lo,
                seed_hi: seed_hi,
                param_id: param_id,
                step: step,
                offset: offset,
                base: start,
                item_size: item_size,
            };
            let old1 = old_absmax(mom1, item, item_size);
            let old2 = old_absmax(mom2, item, item_size);
            // Pass 1: the parameters (and the f32 moments, stored in place; staged, the
            // quantized moments' values too).
            for e in start..end {
                let (finite, v1, v2) = update(cx, mom1, mom2, old1, old2, e);
                store_pass1(mom1, e, v1);
                store_pass1(mom2, e, v2);
                // Straight-line (a vectorizing backend takes the loop whole): a non-finite
                // gradient keeps the old parameter value.
                let pv = p[e];
                let pd = pv * decay;
                let num = neg_step * v1;
                let r = sqrt(v2);
                let d = r / sqrt_c2;
                let den = d + eps;
                let upd = num / den;
                let stepped = pd + upd;
                store_rounded(p, e, select(finite, stepped, pv), Rounding::NearestEven);
            }
            // Then each quantized moment, block by block.
            if comptime!(quantized(spec.m1)) {
                store_moment(cx, mom1, old1, item, c2, eps);
            }
            if comptime!(quantized(spec.m2)) {
                store_moment(cx, mom2, old2, item, c2, eps);
            }
        }
    };
}

qadam_kernel!(
    /// The quantized-AdamW kernel of a spec without `linear8` moments ([`CodeTypes::C4C4`]).
    qadamw_c4_c4, QAdamC4C4, C4C4, u8, u8
);
qadam_kernel!(
    /// The quantized-AdamW kernel of a spec whose m2 only is `linear8` ([`CodeTypes::C4C8`]).
    qadamw_c4_c8, QAdamC4C8, C4C8, u8, i8
);
qadam_kernel!(
    /// The quantized-AdamW kernel of a spec whose m1 only is `linear8` ([`CodeTypes::C8C4`]).
    qadamw_c8_c4, QAdamC8C4, C8C4, i8, u8
);
qadam_kernel!(
    /// The quantized-AdamW kernel of a spec with both moments `linear8` ([`CodeTypes::C8C8`]).
    qadamw_c8_c8, QAdamC8C8, C8C8, i8, i8
);
