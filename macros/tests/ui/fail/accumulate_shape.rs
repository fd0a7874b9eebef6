#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_ir::ReduceOrder;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn dot(n: u32, k: u32, #[shape(n, k)] a: In<f32>, #[shape(k)] b: In<f32>, #[shape(n)] y: Out<f32>) {
    let i = work_item();
    let s = 0.0f32;
    #[accumulate(ReduceOrder::Strided(8))]
    for j in 0..k {
        s = sum(a[i * k + j] + b[j]);
    }
    y[i] = s;
}

fn main() {}
