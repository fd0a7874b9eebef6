#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn offset(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    y[i] = x[i] + i;
}

fn main() {}
