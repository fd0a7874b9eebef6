//! The builder versions of the Adam / AdamW kernels, as they were before the kernels moved to the
//! kernel language ([`crate::adam::adam32`], [`crate::adam::optim8`]); tests prove the two equal
//! (so the snapshots stay the same).

use crate::adam::{declare_grad_opts, moment_update, read_grad_opts, skipped, state_tables};
use crate::adam::{Form, OptimAlgo, OptimSpec, OPTIM_BLOCKSIZE};
use crate::emit::{block_range, inv_absmax};
use crate::{nearest, BlockwiseMap, FLOAT_DTYPES};
use qforge_ir::CmpOp;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, DType, Dim, Kernel, ParamId, ScalarType, Value};

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

/// `p * decay` for AdamW, `p` for Adam.
fn decayed(b: &mut KernelBuilder, h: &Hyper, p: Value) -> Value {
    match h.decay {
        Some(d) => b.mul(p, d),
        None => p,
    }
}

/// The builder version of the 32-bit kernel (`ext`: the `_gs` variant of that name), as it was
/// before the kernel moved to the kernel language ([`crate::adam::adam32`]).
pub(crate) fn build32_builder(spec: &OptimSpec, ext: Option<&str>) -> Result<Kernel> {
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

/// The builder version of the 8-bit kernel named `name` in the variant `form`, as it was before
/// the kernel moved to the kernel language ([`crate::adam::optim8`]).
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

/// The macro-built 32-bit kernel is the builder-built one (same IR, so the same snapshots) for
/// both algorithms, every dtype, plain and `_gs`.
#[test]
fn adam32_equals_the_builder_version_plain_and_gs() {
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        for dtype in FLOAT_DTYPES {
            let spec = OptimSpec {
                algo,
                state: crate::adam::StateBits::Bits32,
                dtype,
            };
            let k = spec.build().unwrap();
            let old = build32_builder(&spec, None).unwrap();
            assert!(k == old, "{} differs", spec.name());
            let name = format!("{}_gs", spec.name());
            let k = spec.build_ext(&name).unwrap();
            let old = build32_builder(&spec, Some(&name)).unwrap();
            assert!(k == old, "{name} differs");
        }
    }
}
