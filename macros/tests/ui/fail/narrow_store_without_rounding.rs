#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn to_half(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<F16>) {
    let i = work_item();
    y[i] = x[i];
}

fn main() {}
