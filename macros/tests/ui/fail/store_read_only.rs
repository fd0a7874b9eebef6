#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn overwrite(n: u32, #[shape(n)] x: In<f32>) {
    let i = work_item();
    x[i] = 0.0;
}

fn main() {}
