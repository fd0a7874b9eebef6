#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn relu(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    let v = x[i];
    y[i] = if v > 0.0 { v } else { 0.0 };
}

fn main() {}
