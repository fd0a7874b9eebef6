#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n, colour = "blue")]
fn signature<T>(n: u32, flag: bool, x: In<f32>, data: Vec<f32>) -> f32 {
    let i = work_item();
}

fn main() {}
