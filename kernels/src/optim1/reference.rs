//! The builder versions of the one-state optimizer kernels, as they were before the kernels
//! moved to the kernel language ([`crate::optim1::kernel`]); tests prove the two equal.

use crate::adam::{declare_grad_opts, read_grad_opts, skipped};
use crate::adam::{state_tables, StateBits, OPTIM_BLOCKSIZE};
use crate::emit::{block_range, inv_absmax};
use crate::nearest;
use crate::optim1::{Optim1Algo, Optim1Spec};
use crate::BlockwiseMap;
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel, Value};
use qforge_ir::{DType, ScalarType};

/// The `f32` scalar names after `n`, `n_blocks` and `first`, in parameter order.
const SCALAR_NAMES: [&str; 9] = [
    "beta1",
    "one_minus_beta1",
    "beta2",
    "one_minus_beta2",
    "weight_decay",
    "decay",
    "eps",
    "lr",
    "neg_lr",
];

/// The scalar values inside the kernel.
struct Hyper {
    first: Value,
    beta1: Value,
    one_minus_beta1: Value,
    beta2: Value,
    one_minus_beta2: Value,
    weight_decay: Value,
    decay: Value,
    eps: Value,
    lr: Value,
    neg_lr: Value,
}

/// The new state of one element from `(g, p, s_old)`: `(finite, gw, s)`, `s = +0.0` for a
/// non-finite `g`. Lion's `gw` is `g`.
fn new_state(
    b: &mut KernelBuilder,
    algo: Optim1Algo,
    bits8: bool,
    h: &Hyper,
    g: Value,
    p: Value,
    s_old: Value,
) -> [Value; 3] {
    let gw = match algo {
        Optim1Algo::Lion => g,
        Optim1Algo::Sgd | Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let zero = b.const_f32(0.0);
            let on = b.cmp(CmpOp::Lt, zero, h.weight_decay);
            let wg = b.fma(p, h.weight_decay, g);
            b.select(on, wg, g)
        }
    };
    let s = match algo {
        Optim1Algo::Lion => {
            let t = b.mul(h.one_minus_beta2, g);
            b.fma(s_old, h.beta2, t)
        }
        Optim1Algo::Sgd => {
            let m = b.fma(s_old, h.beta1, gw);
            let zero = b.const_u32(0);
            let first = b.cmp(CmpOp::Ne, h.first, zero);
            b.select(first, gw, m)
        }
        Optim1Algo::Rmsprop => {
            // CUDA: 8-bit `(1-b)*(g*g)`, 32-bit `(1-b)*g*g` (left to right).
            let t = if bits8 {
                let gg = b.mul(gw, gw);
                b.mul(h.one_minus_beta1, gg)
            } else {
                let t = b.mul(h.one_minus_beta1, gw);
                b.mul(t, gw)
            };
            b.fma(s_old, h.beta1, t)
        }
        Optim1Algo::Adagrad => b.fma(gw, gw, s_old),
    };
    let ag = b.abs(g);
    let inf = b.const_f32(f32::INFINITY);
    let finite = b.cmp(CmpOp::Lt, ag, inf);
    let zero = b.const_f32(0.0);
    let s = b.select(finite, s, zero);
    [finite, gw, s]
}

/// The new parameter of one element with a finite gradient. `x` is the numerator of RMSprop
/// and Adagrad (`gw` for 32-bit, the raw `g` for 8-bit, as bitsandbytes' CUDA kernels do).
#[allow(clippy::too_many_arguments)]
fn new_param(
    b: &mut KernelBuilder,
    algo: Optim1Algo,
    h: &Hyper,
    g: Value,
    p: Value,
    s_old: Value,
    s: Value,
    x: Value,
) -> Value {
    match algo {
        Optim1Algo::Lion => {
            let pd = b.mul(p, h.decay);
            let t = b.mul(h.one_minus_beta1, g);
            let u = b.fma(s_old, h.beta1, t);
            let zero = b.const_f32(0.0);
            let pos = b.cmp(CmpOp::Lt, zero, u);
            let neg = b.cmp(CmpOp::Lt, u, zero);
            let minus = b.select(neg, h.neg_lr, zero);
            let step = b.select(pos, h.lr, minus);
            b.sub(pd, step)
        }
        Optim1Algo::Sgd => b.fma(h.neg_lr, s, p),
        Optim1Algo::Rmsprop | Optim1Algo::Adagrad => {
            let sq = b.sqrt(s);
            let den = b.add(sq, h.eps);
            let r = b.div(x, den);
            b.fma(h.neg_lr, r, p)
        }
    }
}

/// The kernel named `name`; `grad_opts`: the `_gs` scalars; `scaled`: the trust-ratio buffer
/// `scale: f32[1]` last ([`Optim1Spec::build_scaled`]).
pub(crate) fn build_builder(
    spec: &Optim1Spec,
    name: &str,
    grad_opts: bool,
    scaled: bool,
) -> Result<Kernel> {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let first = b.scalar_param("first", ScalarType::U32);
    let ps: Vec<_> = SCALAR_NAMES
        .iter()
        .map(|s| b.scalar_param(s, ScalarType::F32))
        .collect();
    let opts = grad_opts.then(|| declare_grad_opts(&mut b, true));
    let shape = [Dim::Param(n)];
    let p = b.buffer_param("p", spec.dtype, &shape, Access::ReadWrite);
    let g = b.buffer_param("g", spec.dtype, &shape, Access::Read);
    let (s1, a1) = match spec.state {
        StateBits::Bits32 => (
            b.buffer_param("state1", DType::F32, &shape, Access::ReadWrite),
            None,
        ),
        StateBits::Bits8 => (
            b.buffer_param("state1", DType::U8, &shape, Access::ReadWrite),
            Some(b.buffer_param(
                "absmax1",
                DType::F32,
                &[Dim::Param(n_blocks)],
                Access::ReadWrite,
            )),
        ),
    };
    let scale = scaled.then(|| b.buffer_param("scale", DType::F32, &[Dim::Const(1)], Access::Read));
    b.set_grid(Dim::Param(n_blocks));
    let v: Vec<Value> = ps.iter().map(|p| b.param(*p)).collect();
    // LARS: `nls = neg_lr * scale[0]`, where `lars32` multiplies it.
    let neg_lr = match scale {
        Some(scale) => {
            let zero = b.const_u32(0);
            let sc = b.load(scale, zero);
            b.mul(v[8], sc)
        }
        None => v[8],
    };
    let h = Hyper {
        first: b.param(first),
        beta1: v[0],
        one_minus_beta1: v[1],
        beta2: v[2],
        one_minus_beta2: v[3],
        weight_decay: v[4],
        decay: v[5],
        eps: v[6],
        lr: v[7],
        neg_lr,
    };
    let opts = opts.map(|o| read_grad_opts(&mut b, o));
    // `_gs`: `g * gnorm_scale` (the raw `g` without the variant).
    let scaled = |b: &mut KernelBuilder, g: Value| match opts {
        Some(o) => b.mul(g, o.scale),
        None => g,
    };
    let skip = opts.and_then(|o| o.skip);
    let algo = spec.algo;
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    let Some(a1) = a1 else {
        b.for_range(start, end, 1, |b, e| {
            let graw = b.load(g, e);
            let gv = scaled(b, graw);
            let pv = b.load(p, e);
            let s_old = b.load(s1, e);
            let [mut finite, gw, mut s] = new_state(b, algo, false, &h, gv, pv, s_old);
            // `_gs` (bitsandbytes' 32-bit kernel): skipped when the gradient after scaling
            // and coupled weight decay is zero; state and parameter stay.
            if let Some(skip) = skip {
                let sk = skipped(b, skip, gw);
                s = b.select(sk, s_old, s);
                let keep = b.not(sk);
                finite = b.and(finite, keep);
            }
            b.store(s1, e, s);
            // Straight-line: a non-finite gradient keeps the old parameter.
            let stepped = new_param(b, algo, &h, gv, pv, s_old, s, gw);
            let out = b.select(finite, stepped, pv);
            b.store(p, e, out);
        });
        return Ok(b.finish());
    };
    let t1 = state_tables(&mut b, BlockwiseMap::Dynamic, "1")?;
    let old_a1 = b.load(a1, block);
    // `(g, p, s_old, finite, s)` of element `e`, from the unchanged codes and parameter.
    // `(graw, gs, pv, s_old, apply, s)`: `gs` is the scaled gradient; `apply` is false for a
    // non-finite or (`_gs`) skipped element.
    let update = |b: &mut KernelBuilder, e: Value| -> [Value; 6] {
        let graw = b.load(g, e);
        let gv = scaled(b, graw);
        let pv = b.load(p, e);
        let q = b.load(s1, e);
        let c = b.lookup(t1.code, q);
        let s_old = b.mul(c, old_a1);
        let [mut finite, _, mut s] = new_state(b, algo, true, &h, gv, pv, s_old);
        // `_gs` (bitsandbytes' 8-bit kernel): skipped when the raw gradient is zero; the
        // state keeps its dequantized value, which then takes part in the block's new absmax
        // and is requantized with it like every other element.
        if let Some(skip) = skip {
            let sk = skipped(b, skip, graw);
            s = b.select(sk, s_old, s);
            let keep = b.not(sk);
            finite = b.and(finite, keep);
        }
        [graw, gv, pv, s_old, finite, s]
    };
    let acc = b.var("absmax1_acc", ScalarType::F32);
    // Pass 1: the new absmax (NaN-ignoring max |s|).
    b.for_range(start, end, 1, |b, e| {
        let [_, _, _, _, _, s] = update(b, e);
        let a = b.abs(s);
        let cur = b.read_var(acc);
        let mx = b.max(cur, a);
        b.assign(acc, mx);
    });
    let new_a1 = b.read_var(acc);
    b.store(a1, block, new_a1);
    let inv = inv_absmax(&mut b, new_a1);
    // Pass 2 (straight-line): the same state again, the parameter (unchanged where the
    // gradient is not finite), and the requantized state.
    b.for_range(start, end, 1, |b, e| {
        let [graw, gv, pv, s_old, finite, s] = update(b, e);
        // RMSprop / Adagrad's numerator is the raw, unscaled gradient (bitsandbytes' 8-bit
        // kernel reloads `g_vals[j]`); Lion's sign uses the scaled one.
        let stepped = new_param(b, algo, &h, gv, pv, s_old, s, graw);
        let out = b.select(finite, stepped, pv);
        b.store(p, e, out);
        let sc = b.mul(s, inv);
        let q = nearest::emit_code(b, sc, &t1.nearest);
        b.store(s1, e, q);
    });
    Ok(b.finish())
}

/// The macro-built kernels are the builder-built ones (same IR, so the same snapshots) for
/// every rule, both state widths and every form (plain, `_gs`, scaled, both).
#[test]
fn the_macro_kernels_equal_the_builder_versions_in_every_form() {
    for algo in Optim1Algo::ALL {
        for state in [StateBits::Bits32, StateBits::Bits8] {
            let spec = Optim1Spec {
                algo,
                state,
                dtype: DType::F32,
            };
            for (gs, scaled) in [(false, false), (true, false), (false, true), (true, true)] {
                let k = super::build(&spec, "k", gs, scaled).unwrap();
                let old = build_builder(&spec, "k", gs, scaled).unwrap();
                assert!(k == old, "{} gs {gs} scaled {scaled} differs", spec.name());
            }
        }
    }
}
