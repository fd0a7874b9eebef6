#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn cast(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<u32>) {
    let i = work_item();
    y[i] = x[i] as u32;
}

fn main() {}
