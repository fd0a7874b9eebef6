#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn scale(n: u32, factor: f32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    y[i] = x[i] * factor;
}

fn main() {
    let x = vec![1.0f32; 4];
    let mut y = vec![0u32; 4];
    // `y` has the wrong element type, `factor` is missing and `z` does not exist.
    let _args = ScaleArgs { n: 4, x: &x, y: &mut y, z: 1 };
}
