#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn clamp(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    y[i] = f32::min(x[i], 1.0);
}

fn main() {}
