//! The builder version of the quantized-AdamW kernel, as it was before the kernel moved to the
//! kernel language ([`crate::optim4::kernel`]); a test proves the two equal for every scheme
//! pair, dtype and form (so the snapshots stay the same).

use crate::emit::{block_range, load_f32_or_zero};
use crate::optim4::{MomentScheme, QAdamSpec, UniformSource, EDEN_DOT_FLOOR};
use q::{Neighbours, Precond};
use qforge_ir::routines::philox::{philox4x32_10, uniform_f32};
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::{Access, Dim, Kernel, ParamId, TableId, Value, VarId};
use qforge_ir::{DType, Result, ScalarType};

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

pub(super) fn build_builder(spec: &QAdamSpec) -> Result<Kernel> {
    spec.check()?;
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

/// The macro-built kernels are the builder-built one (same IR, so the same snapshots) for every
/// scheme pair (the unsupported ones failing alike), dtype and form (plain, staged, buffer
/// uniforms, both).
#[test]
fn the_macro_kernels_equal_the_builder_version_for_every_scheme_pair_dtype_and_form() {
    let mut built = 0;
    for m1 in MomentScheme::ALL {
        for m2 in MomentScheme::ALL {
            for dtype in crate::FLOAT_DTYPES {
                for staged in [false, true] {
                    for uniforms in [UniformSource::Philox, UniformSource::Buffer] {
                        let spec = QAdamSpec {
                            m1,
                            m2,
                            dtype,
                            uniforms,
                            staged,
                        };
                        match (spec.build(), build_builder(&spec)) {
                            (Ok(k), Ok(old)) => {
                                assert!(k == old, "{} differs", spec.name());
                                built += 1;
                            }
                            (Err(e), Err(old)) => assert_eq!(e.to_string(), old.to_string()),
                            (k, old) => panic!("{}: {:?} vs {:?}", spec.name(), k.err(), old.err()),
                        }
                    }
                }
            }
        }
    }
    assert_eq!(built, 4 * 6 * 3 * 4);
}

/// The builder versions of the quantizers ([`crate::optim4::quant`]).
mod q {
    use crate::emit::count_prefix;
    use crate::optim4::quant::{EDEN_ACCS, EDEN_LANES, EDEN_ROUNDS};
    use qforge_ir::CmpOp;
    use qforge_ir::KernelBuilder;
    use qforge_ir::{Rounding, ScalarType};
    use qforge_ir::{TableId, Value, VarId};

    /// The two neighbours of a scaled value `s` in a sorted 16-entry table: `hi` is the first index
    /// with `!(table[hi] < s)` (torch `searchsorted`, left side), clamped to 15, so NaN gives 15;
    /// `lo = max(hi - 1, 0)`. Returns `(lo, hi, table[lo], table[hi])`.
    pub(crate) struct Neighbours {
        /// Lower code (`u32`).
        pub(crate) lo: Value,
        /// Upper code (`u32`).
        pub(crate) hi: Value,
        /// `table[lo]`.
        pub(crate) a: Value,
        /// `table[hi]`.
        pub(crate) b: Value,
    }

    /// [`Neighbours`] of `s` in `table`.
    pub(crate) fn neighbours(b: &mut KernelBuilder, s: Value, table: TableId) -> Neighbours {
        // Counting the entries among the first 15 with `!(t >= s)` is `min(#{k: !(t_k >= s)}, 15)`
        // because the predicate is monotone in k for a sorted table (always true for a NaN `s`).
        let hi = count_prefix(b, &[8, 4, 2, 1], |b, idx| {
            let t = b.lookup(table, idx);
            let ge = b.cmp(CmpOp::Ge, t, s);
            b.not(ge)
        });
        let zero = b.const_u32(0);
        let one = b.const_u32(1);
        let pos = b.cmp(CmpOp::Gt, hi, zero);
        let dec = b.sub(hi, one);
        let lo = b.select(pos, dec, zero);
        let a = b.lookup(table, lo);
        let bv = b.lookup(table, hi);
        Neighbours { lo, hi, a, b: bv }
    }

    /// Round to nearest as adamw4bit: `lo` when `|s - a| < |b - s|`, otherwise `hi` (an exact tie
    /// goes to the upper code; NaN gives `hi` = 15).
    pub(crate) fn rtn_code(b: &mut KernelBuilder, s: Value, nb: &Neighbours) -> Value {
        let d_lo = b.sub(s, nb.a);
        let d_lo = b.abs(d_lo);
        let d_hi = b.sub(nb.b, s);
        let d_hi = b.abs(d_hi);
        let take_lo = b.cmp(CmpOp::Lt, d_lo, d_hi);
        b.select(take_lo, nb.lo, nb.hi)
    }

    /// The `dyn4_nz` floor: code 0 becomes code 1 (no value in a block reads back as zero).
    pub(crate) fn floor_code1(b: &mut KernelBuilder, code: Value) -> Value {
        let one = b.const_u32(1);
        b.max(code, one)
    }

    /// `clamp(p, 0, 1)` as torch: `min(max(p, 0), 1)` with a NaN `p` propagating.
    fn clamp01(b: &mut KernelBuilder, p: Value) -> Value {
        let zero = b.const_f32(0.0);
        let one = b.const_f32(1.0);
        let p = b.max(p, zero);
        b.min(p, one)
    }

    /// `lo` when `u < p_lo`, otherwise `hi`.
    fn choose(b: &mut KernelBuilder, u: Value, p_lo: Value, nb: &Neighbours) -> Value {
        let take_lo = b.cmp(CmpOp::Lt, u, p_lo);
        b.select(take_lo, nb.lo, nb.hi)
    }

    /// Value-space stochastic rounding (`nf4_sr`): `P_lo = (b - s) / (b - a)`, set to 1 when
    /// `b - a <= 0`, clamped to `[0, 1]`; code `lo` when `u < P_lo`. `E[table[code]] = s` for `s`
    /// inside the table's range.
    pub(crate) fn sr_value_code(
        b: &mut KernelBuilder,
        s: Value,
        nb: &Neighbours,
        u: Value,
    ) -> Value {
        let width = b.sub(nb.b, nb.a);
        let num = b.sub(nb.b, s);
        let p = b.div(num, width);
        let zero = b.const_f32(0.0);
        let flat = b.cmp(CmpOp::Le, width, zero);
        let one = b.const_f32(1.0);
        let p = b.select(flat, one, p);
        let p = clamp01(b, p);
        choose(b, u, p, nb)
    }

    /// The preconditioner of a normalized level `y`: `1 / (sqrt(max(absmax * y / c2, 0)) + eps)`.
    fn precond(b: &mut KernelBuilder, y: Value, absmax: Value, c2: Value, eps: Value) -> Value {
        let v = b.mul(absmax, y);
        let v = b.div(v, c2);
        let zero = b.const_f32(0.0);
        let v = b.max(v, zero);
        let r = b.sqrt(v);
        let d = b.add(r, eps);
        let one = b.const_f32(1.0);
        b.div(one, d)
    }

    /// ZIP-SR (adamw4bit `dyn4_upd_sr_fp32read`): stochastic rounding in preconditioner space.
    /// With `f` the preconditioner, `P_lo = (f(s) - f(b)) / max(f(a) - f(b), 1e-30)`, set to 1 when
    /// `b - a <= 0` or `f(a) - f(b) <= 0`, clamped to `[0, 1]`; code `lo` when `u < P_lo`. Then
    /// `E[f(table[code])] = f(s)`: the preconditioner is unbiased.
    pub(crate) struct Precond {
        /// The block's (floored) absmax.
        pub(crate) absmax: Value,
        /// `f32(1 - beta2^t)`.
        pub(crate) c2: Value,
        /// `f32(eps)`.
        pub(crate) eps: Value,
    }

    /// See [`Precond`].
    pub(crate) fn sr_precond_code(
        b: &mut KernelBuilder,
        s: Value,
        nb: &Neighbours,
        u: Value,
        pc: &Precond,
    ) -> Value {
        let fs = precond(b, s, pc.absmax, pc.c2, pc.eps);
        let fa = precond(b, nb.a, pc.absmax, pc.c2, pc.eps);
        let fb = precond(b, nb.b, pc.absmax, pc.c2, pc.eps);
        let num = b.sub(fs, fb);
        let den = b.sub(fa, fb);
        let tiny = b.const_f32(1e-30);
        let den_c = b.max(den, tiny);
        let p = b.div(num, den_c);
        let zero = b.const_f32(0.0);
        let width = b.sub(nb.b, nb.a);
        let flat = b.cmp(CmpOp::Le, width, zero);
        let flat_f = b.cmp(CmpOp::Le, den, zero);
        let flat = b.or(flat, flat_f);
        let one = b.const_f32(1.0);
        let p = b.select(flat, one, p);
        let p = clamp01(b, p);
        choose(b, u, p, nb)
    }

    /// The 8-bit linear code of a scaled value `s`: `round_half_even(clamp(s * 127, -127, 127))`
    /// as `i32` (NaN gives 0).
    pub(crate) fn lin8_code(b: &mut KernelBuilder, s: Value) -> Value {
        let k = b.const_f32(127.0);
        let q = b.mul(s, k);
        let lo = b.const_f32(-127.0);
        let q = b.max(q, lo);
        let q = b.min(q, k);
        b.float_to_int(q, ScalarType::I32, Rounding::NearestEven)
    }

    /// The value of an 8-bit linear code (`i32`) before scaling: `f32(code) / 127`.
    pub(crate) fn lin8_value(b: &mut KernelBuilder, code: Value) -> Value {
        let f = b.int_to_float(code);
        let k = b.const_f32(127.0);
        b.div(f, k)
    }

    /// `acc = acc (max) |x|` with NaN propagating (torch `amax`): a NaN `x` or a NaN `acc` stays.
    pub(crate) fn absmax_step(b: &mut KernelBuilder, acc: VarId, x: Value) {
        let a = b.abs(x);
        let cur = b.read_var(acc);
        let gt = b.cmp(CmpOp::Gt, a, cur);
        let nan = b.cmp(CmpOp::Ne, a, a);
        let take = b.or(gt, nan);
        let next = b.select(take, a, cur);
        b.assign(acc, next);
    }

    /// Emits the two EDEN sums of one 128-element block in torch's AVX2 order: with `x_i` the
    /// terms of the block (`i` in `0..128`), vector `j` = terms `8j..8j+8`,
    /// `A_k = ((v_k + v_{k+4}) + v_{k+8}) + v_{k+12}` lane-wise (`k` in `0..4`),
    /// `P = ((A_0 + A_1) + A_2) + A_3` and the total `((P[0] + P[1]) + ...) + P[7]`.
    ///
    /// `terms(b, i)` emits the terms of block element `i` (a `u32` value) and returns
    /// `(present, x, y)`: two sums are computed at once, and an absent element (`present` false,
    /// past the end of the tensor) adds `-0.0`, the identity. Every partial starts at `-0.0`, so the
    /// first addition is exact and the result is the formula above. Returns `(sum x, sum y)`.
    pub(crate) fn eden_sums(
        b: &mut KernelBuilder,
        vars: [VarId; 6],
        terms: impl Fn(&mut KernelBuilder, Value) -> (Value, Value, Value),
    ) -> (Value, Value) {
        let [tot_x, tot_y, p_x, p_y, a_x, a_y] = vars;
        let neg0 = b.const_f32(-0.0);
        b.assign(tot_x, neg0);
        b.assign(tot_y, neg0);
        let zero = b.const_u32(0);
        let lanes = b.const_u32(EDEN_LANES);
        b.for_range(zero, lanes, 1, |b, lane| {
            let neg0 = b.const_f32(-0.0);
            b.assign(p_x, neg0);
            b.assign(p_y, neg0);
            let zero = b.const_u32(0);
            let accs = b.const_u32(EDEN_ACCS);
            b.for_range(zero, accs, 1, |b, k| {
                let neg0 = b.const_f32(-0.0);
                b.assign(a_x, neg0);
                b.assign(a_y, neg0);
                let zero = b.const_u32(0);
                let rounds = b.const_u32(EDEN_ROUNDS);
                b.for_range(zero, rounds, 1, |b, r| {
                    // i = 8 * (k + 4 r) + lane
                    let four = b.const_u32(EDEN_ACCS);
                    let r4 = b.mul(r, four);
                    let j = b.add(k, r4);
                    let eight = b.const_u32(EDEN_LANES);
                    let j8 = b.mul(j, eight);
                    let i = b.add(j8, lane);
                    let (present, x, y) = terms(b, i);
                    let neg0 = b.const_f32(-0.0);
                    for (acc, t) in [(a_x, x), (a_y, y)] {
                        let t = b.select(present, t, neg0);
                        let cur = b.read_var(acc);
                        let s = b.add(cur, t);
                        b.assign(acc, s);
                    }
                });
                for (p, a) in [(p_x, a_x), (p_y, a_y)] {
                    let cur = b.read_var(p);
                    let av = b.read_var(a);
                    let s = b.add(cur, av);
                    b.assign(p, s);
                }
            });
            for (t, p) in [(tot_x, p_x), (tot_y, p_y)] {
                let cur = b.read_var(t);
                let pv = b.read_var(p);
                let s = b.add(cur, pv);
                b.assign(t, s);
            }
        });
        let sx = b.read_var(tot_x);
        let sy = b.read_var(tot_y);
        (sx, sy)
    }

    /// The two EDEN sums of one *full* 128-element block in the same order as [`eden_sums`],
    /// assigned to `tot_x` and `tot_y`, written so that a vectorizing backend runs the lanes
    /// together: one straight-line iteration per lane `l` of torch's vector computes
    /// `A_k = (((-0 + x_{8k+l}) + x_{8(k+4)+l}) + x_{8(k+8)+l}) + x_{8(k+12)+l}` for each `k`, then
    /// `P = (((-0 + A_0) + A_1) + A_2) + A_3`, and adds it to the total (`tot = tot + P`, lanes in
    /// order from `-0.0`). `terms(b, i)` returns `(x, y)` of block element `i`.
    pub(crate) fn eden_sums_lanes(
        b: &mut KernelBuilder,
        [tot_x, tot_y]: [VarId; 2],
        terms: impl Fn(&mut KernelBuilder, Value) -> (Value, Value),
    ) {
        let neg0 = b.const_f32(-0.0);
        b.assign(tot_x, neg0);
        b.assign(tot_y, neg0);
        let zero = b.const_u32(0);
        let lanes = b.const_u32(EDEN_LANES);
        b.for_range(zero, lanes, 1, |b, lane| {
            let neg0 = b.const_f32(-0.0);
            let mut p = [neg0, neg0];
            for k in 0..EDEN_ACCS {
                let mut a = [neg0, neg0];
                for r in 0..EDEN_ROUNDS {
                    let off = b.const_u32(EDEN_LANES * (k + EDEN_ACCS * r));
                    let i = b.add(lane, off);
                    let (x, y) = terms(b, i);
                    a = [b.add(a[0], x), b.add(a[1], y)];
                }
                p = [b.add(p[0], a[0]), b.add(p[1], a[1])];
            }
            for (t, pv) in [(tot_x, p[0]), (tot_y, p[1])] {
                let cur = b.read_var(t);
                let s = b.add(cur, pv);
                b.assign(t, s);
            }
        });
    }
}
