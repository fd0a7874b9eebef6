#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn reassign(n: u32, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    let acc = 0.0f32;
    acc = 1.0;
    n = 3u32;
    y[i] = acc;
}

fn main() {}
