#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_ir::DType;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn no_dtype(n: u32, #[shape(n)] x: In<Float>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    y[i] = x[i];
}

#[kernel(grid = n)]
fn dtype_on_f32(n: u32, #[shape(n)] #[dtype(DType::F16)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    y[i] = x[i];
}

fn main() {}
