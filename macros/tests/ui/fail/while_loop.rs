#![allow(unused_imports)]
use qforge_ir::dsl::*;
use qforge_macros::kernel;

#[kernel(grid = n)]
fn spin(n: u32, #[shape(n)] y: Out<u32>) {
    let i = work_item();
    let mut k = 0u32;
    while k < i {
        k += 1u32;
    }
    y[i] = k;
}

fn main() {}
