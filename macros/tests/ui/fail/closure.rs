#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn twice(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    let double = |v| v * 2.0;
    y[i] = double(x[i]);
}

fn main() {}
