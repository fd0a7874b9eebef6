//! README's "Write a kernel" snippet, verbatim inside a test, so it stays true.

use qforge::ir::dsl::{Float, FloatIn, FloatOut, In, Out};
use qforge::ir::{DType, Rounding};

/// `y = x * factor`, rounded to the dtype.
#[qforge::kernel(name = "scale_{dtype}", grid = n)]
pub fn scale(
    #[config] dtype: DType, // build-time configuration
    n: u32,
    factor: f32,
    #[shape(n)]
    #[dtype(dtype)]
    x: In<Float>,
    #[shape(n)]
    #[dtype(dtype)]
    y: Out<Float>,
) {
    let i = work_item();
    store_rounded(y, i, x[i] * factor, Rounding::NearestEven);
}

#[test]
fn the_readme_snippet_builds_and_runs() -> Result<(), Box<dyn std::error::Error>> {
    let kernel = scale(DType::F32)?; // verified; errors point at the source line
    let (x, mut y) = (vec![1.0f32; 8], vec![0f32; 8]);
    let mut args = ScaleArgs {
        n: 8,
        factor: 0.5,
        x: FloatIn::f32(&x),
        y: FloatOut::f32(&mut y),
    };
    qforge::runtime::launch_typed(&qforge::runtime::CpuDevice::new()?, &kernel, &mut args)?;
    assert_eq!(y, [0.5; 8]);
    assert_eq!(kernel.kernel().name, "scale_f32");
    Ok(())
}
