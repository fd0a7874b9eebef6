//! Each rule of the lint (`super`) broken once in a module the lowering emits.

use qforge_kernels::KernelSpec;

use super::lint;
use crate::mosaic::{lower, lower_with, MosaicModule, Shapes};

/// The 8-bit dequantization's module at 1000 elements in blocks of 256 (windows `q` 32 x 256
/// `i8`, `absmax` 32 x 1, `out` 32 x 256 `bf16`; a grid of 1 x 1).
fn dequantize() -> MosaicModule {
    let k = KernelSpec::from_name("dequantize_blockwise_dynamic_bs256_bf16")
        .unwrap()
        .build()
        .unwrap();
    let mut s = Shapes::with_dims(&k, 1);
    s.grid = 4;
    for (i, (_, p)) in k.params.iter().enumerate() {
        s.elements[i] = match p.name.as_str() {
            "q" | "out" => 1000,
            "absmax" => 4,
            "code" => 256,
            _ => 0,
        };
    }
    lower(&k, &s).unwrap()
}

/// The 4-bit input gradient's module at `M = 20`, `N = 300`, `K = 320` (3-D windows of panels
/// `4 x 256 x 16` and scales `1 x 2 x 256`).
fn input_gradient() -> MosaicModule {
    let k = KernelSpec::from_name("matmul_4bit_dx_fp4_bs64_f32_c64_t1x4")
        .unwrap()
        .build()
        .unwrap();
    let (m, n, kk) = (20u32, 300u32, 320u32);
    let (tiles, panel_bytes, scales) = (kk.div_ceil(4), kk.div_ceil(32) * n * 16, n * kk / 64);
    let mut scalars = Vec::new();
    let mut elements = Vec::new();
    for (_, p) in k.params.iter() {
        let (scalar, count) = match p.name.as_str() {
            "m" => (Some(m), 0),
            "n" => (Some(n), 0),
            "k" => (Some(kk), 0),
            "n_items" => (Some(m * tiles), 0),
            "n_tiles" => (Some(tiles), 0),
            "n_panel_bytes" => (Some(panel_bytes), 0),
            "n_scales" => (Some(scales), 0),
            "dy" => (None, m * n),
            "panels" => (None, panel_bytes),
            "absmax" => (None, scales),
            _ => (None, m * kk),
        };
        scalars.push(scalar);
        elements.push(count as usize);
    }
    let shapes = Shapes {
        grid: m * tiles,
        elements,
    };
    lower_with(&k, &shapes, &scalars).unwrap()
}

/// The lint's fault in `m` with `from` replaced by `to` (once).
fn fault(m: &MosaicModule, from: &str, to: &str) -> String {
    assert!(m.text.contains(from), "{from:?} not in the module");
    let text = m.text.replacen(from, to, 1);
    lint(&text, &m.manifest).expect_err("a broken module passes the lint")
}

/// The lint's fault in `m` with one window's memref block and `window_bounds` both changed
/// from `from` to `to`.
fn block(m: &MosaicModule, elt: &str, from: &[u32], to: &[u32]) -> String {
    let x = |d: &[u32], sep: &str| d.iter().map(u32::to_string).collect::<Vec<_>>().join(sep);
    let memref = |d: &[u32]| format!("memref<{}x{elt}", x(d, "x"));
    let bounds = |d: &[u32]| format!("window_bounds = array<i64: {}>", x(d, ", "));
    let text =
        m.text
            .replacen(&memref(from), &memref(to), 1)
            .replacen(&bounds(from), &bounds(to), 1);
    lint(&text, &m.manifest).expect_err("a broken module passes the lint")
}

#[test]
fn lowered_modules_pass_the_lint() {
    for m in [dequantize(), input_gradient()] {
        assert_eq!(lint(&m.text, &m.manifest), Ok(()));
    }
}

#[test]
fn the_lint_names_each_broken_rule() {
    let m = dequantize();
    let e = fault(
        &m,
        "iteration_bounds = array<i64: 1, 1>",
        "iteration_bounds = array<i64: 1>",
    );
    assert!(
        e.starts_with("iteration-bound arity: 1 iteration bounds, 2 dimension"),
        "{e}"
    );
    let e = fault(
        &m,
        "iteration_bounds = array<i64: 1, 1>",
        "iteration_bounds = array<i64: 2, 1>",
    );
    assert!(
        e.contains("iteration bounds [2, 1] where the manifest's grid is [1, 1]"),
        "{e}"
    );
    let e = fault(
        &m,
        "{transform_indices = @transform_row, window_bounds = array<i64: 32, 1>}, ",
        "",
    );
    assert!(
        e.starts_with("window count: 2 window_params for 3 memref operands"),
        "{e}"
    );
    let e = fault(
        &m,
        "window_bounds = array<i64: 32, 1>",
        "window_bounds = array<i64: 32, 2>",
    );
    assert!(
        e.contains("window bounds: window 1 (absmax) has bounds [32, 2], its memref [32, 1]"),
        "{e}"
    );
    let e = fault(
        &m,
        "func.func @transform_row(%arg0: i32, %arg1: i32) -> (i32, i32)",
        "func.func @transform_row(%arg0: i32) -> (i32, i32)",
    );
    assert!(
        e.contains("index map arity: @transform_row of window 1 (absmax) takes 1"),
        "{e}"
    );
    let e = fault(
        &m,
        "@transform_row, window_bounds",
        "@transform_none, window_bounds",
    );
    assert!(
        e.contains("window 1 (absmax): no index map @transform_none"),
        "{e}"
    );
    // The 8-bit codes in blocks of 8 rows (libtpu: E2002, `tests/mosaic.rs`).
    let e = block(&m, "i8", &[32, 256], &[8, 256]);
    assert!(
        e.contains("tiling: window 0 (q, i8) has block [8, 256] of array [32, 256]"),
        "{e}"
    );
}

#[test]
fn the_lint_checks_3d_windows() {
    let m = input_gradient();
    let e = block(&m, "i8", &[4, 256, 16], &[4, 256, 8]);
    assert!(
        e.contains("tiling: window 1 (panels, i8) has block [4, 256, 8] of array [12, 512, 16]"),
        "{e}"
    );
    let e = fault(
        &m,
        "-> (i32, i32, i32) {\n    %c0_i32 = arith.constant 0 : i32\n    return %arg1, %arg2, %c0_i32",
        "-> (i32, i32) {\n    %c0_i32 = arith.constant 0 : i32\n    return %arg1, %arg2, %c0_i32",
    );
    assert!(
        e.contains(
            "index map arity: @transform_panels of window 1 (panels) takes 3 indices and returns 2"
        ),
        "{e}"
    );
}
