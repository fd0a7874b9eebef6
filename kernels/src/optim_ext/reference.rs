//! The builder version of `grad_sqnorm_{dtype}`, as it was before the kernel moved to the
//! kernel language ([`crate::optim_ext::kernel`]); tests prove the two equal.

use crate::adam::OPTIM_BLOCKSIZE;
use crate::check_float_dtype;
use crate::emit::{block_range, range_len};
use crate::optim_ext::OptimExtSpec;
use crate::optim_norm::NORM_ORDER;
use crate::FLOAT_DTYPES;
use qforge_ir::KernelBuilder;
use qforge_ir::Result;
use qforge_ir::{Access, Dim, Kernel};
use qforge_ir::{DType, ScalarType};

pub(crate) fn build_grad_norm_builder(name: &str, dtype: DType) -> Result<Kernel> {
    check_float_dtype(dtype)?;
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let n_blocks = b.scalar_param("n_blocks", ScalarType::U32);
    let g = b.buffer_param("g", dtype, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param(
        "gnorm_part",
        DType::F32,
        &[Dim::Param(n_blocks)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n_blocks));
    let block = b.work_item();
    let nv = b.param(n);
    let (start, end) = block_range(&mut b, block, OPTIM_BLOCKSIZE, nv);
    let len = range_len(&mut b, start, end);
    let acc = b.var("gnorm_acc", ScalarType::F32);
    b.accumulate(len, NORM_ORDER, &[acc], |b, i| {
        let e = b.add(start, i);
        let gv = b.load(g, e);
        vec![(gv, gv)]
    });
    let s = b.read_var(acc);
    b.store(out, block, s);
    Ok(b.finish())
}

/// The macro-built kernel is the builder-built one (same IR, so the same snapshots) for every
/// float dtype.
#[test]
fn grad_sqnorm_equals_the_builder_version() {
    for dtype in FLOAT_DTYPES {
        let spec = OptimExtSpec::GradNorm(dtype);
        let k = spec.build().unwrap();
        let old = build_grad_norm_builder(&spec.name(), dtype).unwrap();
        assert!(k == old, "{} differs", spec.name());
    }
}
