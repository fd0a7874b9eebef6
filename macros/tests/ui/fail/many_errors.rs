#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

// Every error of a kernel is reported at once.
#[kernel(grid = n)]
fn broken(n: u32, #[shape(n)] x: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    let a = x[i] as f64;
    loop {}
    let twice = |v| v * 2.0;
    return;
    y[i] = a;
}

fn main() {}
