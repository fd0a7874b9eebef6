//! The matmul class's rules (`super`): the pipelined module of a 4-bit matmul, and a
//! refusal per rule, on library kernels and on mutants of their text form.

use qforge_ir::{Kernel, ParamKind};
use qforge_kernels::KernelSpec;

use crate::mosaic::tests::two;
use crate::mosaic::{lower, lower_with, Shapes};
use crate::Error;

fn library(name: &str) -> Kernel {
    KernelSpec::from_name(name)
        .unwrap_or_else(|| panic!("no kernel {name}"))
        .build()
        .unwrap()
}

/// `name`'s text form with every `from` replaced by `to`, parsed.
fn mutant(name: &str, from: &[&str], to: &str) -> Kernel {
    let mut text = qforge_ir::text::print(&library(name));
    for f in from {
        assert!(text.contains(f), "{f:?} not in {name}");
        text = text.replace(f, to);
    }
    qforge_ir::text::parse(&text).unwrap()
}

/// The launch of 4-bit matmul `kernel` (tiles `tm x tn`, blocks of `bs`) at `m x n x k`
/// (`W [N, K]`: the forward's `y` is `[m, n]`, the input gradient's `dx` `[m, k]`): its
/// shapes and integer scalars, by parameter name.
fn launch(
    kernel: &Kernel,
    (tm, tn, bs): (usize, usize, usize),
    m: usize,
    n: usize,
    k: usize,
) -> (Shapes, Vec<Option<u32>>) {
    let dx = kernel.name.contains("_dx_");
    let n_tiles = if dx { k.div_ceil(tn) } else { n.div_ceil(tn) };
    // The input gradient's scales: one per `chunk` columns of each weight row (the `_c`
    // of its name).
    let chunk: usize = kernel
        .name
        .split('_')
        .find_map(|p| p.strip_prefix('c')?.parse().ok())
        .unwrap_or(bs);
    let (panel_bytes, scales) = (k.div_ceil(32) * n * 16, n * k / chunk);
    let mut scalars = Vec::new();
    let mut elements = Vec::new();
    for (_, p) in kernel.params.iter() {
        let (scalar, count) = match (&p.kind, p.name.as_str()) {
            (ParamKind::Scalar(_), "m") => (Some(m), 0),
            (ParamKind::Scalar(_), "n") => (Some(n), 0),
            (ParamKind::Scalar(_), "k") => (Some(k), 0),
            (ParamKind::Scalar(_), "n_items") => (Some(m.div_ceil(tm) * n_tiles), 0),
            (ParamKind::Scalar(_), "n_tiles") => (Some(n_tiles), 0),
            (ParamKind::Scalar(_), "n_packed") => (Some((n * k).div_ceil(2)), 0),
            (ParamKind::Scalar(_), "n_blocks") => (Some((n * k).div_ceil(bs)), 0),
            (ParamKind::Scalar(_), "n_nested") => (Some((n * k).div_ceil(bs).div_ceil(256)), 0),
            (ParamKind::Scalar(_), "n_panel_bytes") => (Some(panel_bytes), 0),
            (ParamKind::Scalar(_), "n_scales") => (Some(scales), 0),
            (ParamKind::Scalar(_), _) => (None, 0),
            (_, "x") => (None, m * k),
            (_, "dy") => (None, m * n),
            (_, "panels") => (None, panel_bytes),
            (_, "absmax" | "qabsmax") if dx => (None, scales),
            (_, "dx") => (None, m * k),
            (_, "packed") => (None, (n * k).div_ceil(2)),
            (_, "absmax" | "qabsmax") => (None, (n * k).div_ceil(bs)),
            (_, "nested_absmax") => (None, (n * k).div_ceil(bs).div_ceil(256)),
            (_, "nested_code") => (None, 256),
            (_, "bias") => (None, n),
            _ => (None, m * n),
        };
        scalars.push(scalar.map(|v| v as u32));
        elements.push(count);
    }
    let grid = scalars[3].expect("n_items");
    (Shapes { grid, elements }, scalars)
}

/// An array of a Mosaic manifest: its parameter, shape and buffer shape.
type Array<'a> = (&'a str, [u32; 2], Option<[u32; 2]>);
/// [`Array`] of any rank.
type ArrayN<'a> = (&'a str, Vec<u32>, Option<Vec<u32>>);

const F32_BIAS: &str = "matmul_4bit_nf4_bs64_f32_bias_t1x4";
const F32: &str = "matmul_4bit_nf4_bs64_f32_t1x4";

/// Why `lower_with` refuses `kernel` at `shapes` and `scalars`.
fn refused(kernel: &Kernel, shapes: &Shapes, scalars: &[Option<u32>]) -> String {
    match lower_with(kernel, shapes, scalars) {
        Err(Error::Unsupported { op, .. }) => op,
        other => panic!(
            "{}: not refused: {:?}",
            kernel.name,
            other.map(|m| m.manifest)
        ),
    }
}

fn refusal(kernel: &Kernel, m: usize, n: usize, k: usize) -> String {
    let (shapes, scalars) = launch(kernel, (1, 4, 64), m, n, k);
    refused(kernel, &shapes, &scalars)
}

#[test]
fn a_4bit_matmul_lowers_to_a_pipelined_grid() {
    let k = library(F32_BIAS);
    let (shapes, scalars) = launch(&k, (1, 4, 64), 20, 300, 512);
    let m = lower_with(&k, &shapes, &scalars).unwrap();
    // 3 x 3 tiles of 8 x 128 outputs, 2 steps of 256 over K.
    assert_eq!(m.manifest.grid, [3, 3, 2]);
    let arrays: Vec<Array> = m
        .manifest
        .inputs
        .iter()
        .chain(&m.manifest.outputs)
        .map(|a| {
            (
                a.param.as_str(),
                two(&a.shape),
                a.buffer_shape.as_deref().map(two),
            )
        })
        .collect();
    assert_eq!(
        arrays,
        [
            ("x", [24, 512], Some([20, 512])),
            ("packed", [384, 256], Some([300, 256])),
            ("absmax", [384, 8], Some([300, 8])),
            ("bias", [1, 384], Some([1, 300])),
            ("y", [24, 384], Some([20, 300])),
        ]
    );
    for piece in [
        "(%arg0: i32, %arg1: i32, %arg2: i32, %in_x: memref<8x256xf32",
        "#tpu.dimension_semantics<arbitrary>], iteration_bounds = array<i64: 3, 3, 2>",
        "scratch_operands = 3",
        "window_bounds = array<i64: 8, 256>",
        "window_bounds = array<i64: 128, 128>",
        "window_bounds = array<i64: 128, 8>",
        "window_bounds = array<i64: 1, 128>",
        "window_bounds = array<i64: 8, 128>",
        "%acc_scratch: memref<16x8x128xf32",
        "tpu.transpose",
        "scf.for %kk = %c0 to %count step %c1",
        "%slot = arith.andi %kk, %ways_mask : index",
        "%count_last = arith.constant 256 : index",
    ] {
        assert!(m.text.contains(piece), "missing {piece:?}");
    }
    // The product is the exact integer `fma`: no float `fma`, no MXU.
    for absent in ["math.fma", "tpu.matmul", "arith.divf"] {
        assert!(!m.text.contains(absent), "{absent} in the module");
    }
    // The even and odd codes of each byte: two weight tiles turned, 256 rows stored.
    assert_eq!(m.text.matches("tpu.transpose").count(), 2);
    assert_eq!(m.text.matches("vector.store %wb").count(), 256);
    // The halving tree over 16 partials: 8 additions of partials, then 4, 2 and 1.
    assert_eq!(m.text.matches(" = arith.addf %p").count(), 8);
    assert_eq!(m.text.matches(" = arith.addf %t").count(), 7);
    assert!(m.twin.contains("stablehlo.transpose"));
    assert_eq!(m.twin.matches("stablehlo.while").count(), 2);
}

#[test]
fn a_matmul_needs_its_launch_scalars() {
    let k = library(F32);
    let (shapes, _) = launch(&k, (1, 4, 64), 3, 5, 128);
    let e = lower(&k, &shapes).unwrap_err().to_string();
    assert!(e.contains("without its launch's scalars"), "{e}");
}

#[test]
fn a_matmul_refuses_blocks_across_rows() {
    let k = library(F32);
    let e = refusal(&k, 3, 5, 200);
    assert!(
        e.contains("a weight read per block of 2^6 elements where the reduction is K = 200"),
        "{e}"
    );
}

#[test]
fn a_matmul_refuses_a_launch_that_does_not_cover_the_output() {
    let k = library(F32);
    let (mut shapes, mut scalars) = launch(&k, (1, 4, 64), 3, 5, 128);
    shapes.grid -= 1;
    scalars[3] = Some(shapes.grid);
    let e = refused(&k, &shapes, &scalars);
    assert!(e.contains("stores no y[14]"), "{e}");
}

#[test]
fn a_matmul_refuses_accumulators_of_other_functions() {
    // Accumulator 2's code index masked with 7 instead of 15.
    let k = mutant(F32, &["%90: u32 = const 15"], "%90: u32 = const 7");
    let e = refusal(&k, 3, 5, 128);
    assert!(e.contains("accumulator 2 computes another function"), "{e}");
}

#[test]
fn a_matmul_refuses_other_indices() {
    // The activation at 2k.
    let k = mutant(F32, &["%44: u32 = add %42, %43"], "%44: u32 = add %43, %43");
    let e = refusal(&k, 3, 5, 128);
    assert!(
        e.contains("an activation load at an index other than m * K + k"),
        "{e}"
    );
    // The output at m * K + n.
    let k = mutant(F32, &["%116: u32 = mul %18, %1"], "%116: u32 = mul %18, %2");
    let e = refusal(&k, 3, 5, 128);
    assert!(e.contains("not its row's and column's once"), "{e}");
    // Accumulator 0's weight row is the output's row.
    let k = mutant(F32, &["%46: u32 = mul %29, %2"], "%46: u32 = mul %18, %2");
    let e = refusal(&k, 3, 5, 128);
    assert!(
        e.contains("a weight read at an index (a * k + base) >> 1, a = 1, of none of"),
        "{e}"
    );
    // The bias at the output's row, in every accumulator.
    let k = mutant(
        F32_BIAS,
        &[
            "load bias[%29]",
            "load bias[%33]",
            "load bias[%37]",
            "load bias[%41]",
        ],
        "load bias[%18]",
    );
    let e = refusal(&k, 3, 5, 128);
    assert!(
        e.contains("an epilogue load of bias at another index than the output's column n"),
        "{e}"
    );
}

#[test]
fn a_matmul_step_must_fit_vmem() {
    // 16 000 absmax blocks a row: the step's 128 rows of them, twice, take 16 MB.
    let e = refusal(&library(F32), 1, 128, 64 * 16_000);
    assert!(e.contains("bytes of VMEM (at most 16777216"), "{e}");
}

#[test]
fn a_matmul_refuses_empty_and_oversized_launches() {
    let k = library(F32);
    let e = refusal(&k, 0, 5, 128);
    assert!(
        e.contains("an empty matmul (M = 0 rows, N = 5 output columns, K = 128 reduced)"),
        "{e}"
    );
    // Every work item is evaluated: 2^26 work items of 4 accumulators are too many, refused
    // before any is.
    let (mut shapes, mut scalars) = launch(&k, (1, 4, 64), 3, 5, 128);
    shapes.grid = 1 << 26;
    scalars[3] = Some(shapes.grid);
    let e = refused(&k, &shapes, &scalars);
    assert!(
        e.contains("(the lowering evaluates each: at most 16777216"),
        "{e}"
    );
}

#[test]
fn a_matmul_of_one_column_reads_its_bias() {
    // N = 1: the bias index is the constant 0, which is the output's column.
    let k = library(F32_BIAS);
    let (shapes, scalars) = launch(&k, (1, 4, 64), 5, 1, 128);
    let m = lower_with(&k, &shapes, &scalars).unwrap();
    assert!(m
        .manifest
        .inputs
        .iter()
        .any(|a| a.param == "bias" && a.buffer_shape == Some(vec![1, 1])));
}

#[test]
fn a_matmul_refuses_a_nested_absmax_shorter_than_its_blocks() {
    // 300 x 512 weights: 2400 blocks, 10 nested ones.
    let k = library("matmul_4bit_nf4_nested_bs64_f32_t1x4");
    let (mut shapes, scalars) = launch(&k, (1, 4, 64), 3, 300, 512);
    assert!(lower_with(&k, &shapes, &scalars).is_ok());
    let nested = k
        .params
        .iter()
        .position(|(_, p)| p.name == "nested_absmax")
        .unwrap();
    shapes.elements[nested] = 9;
    let e = lower_with(&k, &shapes, &scalars).unwrap_err().to_string();
    assert!(
        e.contains("reading nested_absmax of 9 elements at indices up to 9"),
        "{e}"
    );
}

const DX: &str = "matmul_4bit_dx_fp4_bs64_f32_c64_t1x4";

#[test]
fn a_4bit_input_gradient_reads_panels_and_column_blocks() {
    let k = library(DX);
    let (shapes, scalars) = launch(&k, (1, 4, 64), 20, 300, 320);
    let m = lower_with(&k, &shapes, &scalars).unwrap();
    // 3 x 3 tiles of 8 x 128 columns of dX, 2 steps of 256 over N = 300.
    assert_eq!(m.manifest.grid, [3, 3, 2]);
    let arrays: Vec<ArrayN> = m
        .manifest
        .inputs
        .iter()
        .chain(&m.manifest.outputs)
        .map(|a| (a.param.as_str(), a.shape.clone(), a.buffer_shape.clone()))
        .collect();
    assert_eq!(
        arrays,
        [
            ("dy", vec![24, 512], Some(vec![20, 300])),
            // 10 panels of 300 rows of 16 bytes, in blocks of 4 panels.
            ("panels", vec![12, 512, 16], Some(vec![10, 300, 16])),
            // 5 rows of 64 columns' scales, in groups of 2 (a 128-column tile's).
            ("absmax", vec![3, 2, 512], Some(vec![5, 300])),
            ("dx", vec![24, 384], Some(vec![20, 320])),
        ]
    );
    for piece in [
        "%in_panels: memref<4x256x16xi8",
        "%in_absmax: memref<1x2x256xf32",
        "window_bounds = array<i64: 4, 256, 16>",
        "window_bounds = array<i64: 1, 2, 256>",
        "tpu.transpose",
        "func.func @transform_panels(%arg0: i32, %arg1: i32, %arg2: i32) -> (i32, i32, i32)",
        "return %arg1, %c0_i32, %arg2 : i32, i32, i32",
    ] {
        assert!(m.text.contains(piece), "{piece} not in\n{}", m.text);
    }
}

#[test]
fn an_input_gradient_reads_a_chunk_wider_than_a_tile_from_its_group() {
    // One scale per 256 columns: tiles 2j and 2j + 1 read row j (the map shifts j * 128).
    let k = library("matmul_4bit_dx_nf4_bs256_f32_wbf16_c256_t1x4");
    let (shapes, scalars) = launch(&k, (1, 4, 256), 16, 512, 1024);
    let m = lower_with(&k, &shapes, &scalars).unwrap();
    for piece in [
        "window_bounds = array<i64: 1, 1, 256>",
        "%first = arith.muli %arg1, %tn : i32",
        "%group = arith.shrui %first, %t : i32",
        "return %group, %c0_i32, %arg2 : i32, i32, i32",
    ] {
        assert!(m.text.contains(piece), "{piece} not in the module");
    }
}

#[test]
fn an_input_gradient_refuses_other_panels_and_chunks() {
    // Panels of 16 columns (a row's bytes 8 apart): a byte read at a computed index.
    let mut k = library(DX);
    let mut text = qforge_ir::text::print(&k);
    for c in ["%55", "%76", "%97", "%118"] {
        let from = format!("{c}: u32 = const 5");
        assert!(text.contains(&from), "{from}");
        text = text.replace(&from, &format!("{c}: u32 = const 4"));
    }
    k = qforge_ir::text::parse(&text).unwrap();
    let (shapes, scalars) = launch(&k, (1, 4, 64), 3, 64, 128);
    let e = refused(&k, &shapes, &scalars);
    assert!(
        e.contains("a weight read at an index (a * k + base) >> 1, a = 16, of none of"),
        "{e}"
    );
    // Chunks of 64 columns in a tile of 96 (K = 96): the tile's rows are not whole chunks.
    let k = library(DX);
    let (mut shapes, scalars) = launch(&k, (1, 4, 64), 3, 64, 96);
    let scales = k
        .params
        .iter()
        .position(|(_, p)| p.name == "absmax")
        .unwrap();
    shapes.elements[scales] = 2 * 64;
    let e = refused(&k, &shapes, &scalars);
    assert!(
        e.contains("a matmul of 96 output columns reading absmax per 64 columns"),
        "{e}"
    );
}

#[test]
fn an_input_gradient_over_a_long_reduction_fits_vmem_and_indices_must_not_wrap() {
    // A reduction over 14336 weight rows: no absmax blocks in a step's windows (the scales
    // are column blocks of one step's rows).
    let k = library(DX);
    let (shapes, scalars) = launch(&k, (1, 4, 64), 2, 14336, 128);
    assert!(lower_with(&k, &shapes, &scalars).is_ok());
    // dY of 4194304 x 1025 elements: `m * N + n` past 2^32.
    let (shapes, scalars) = launch(&k, (1, 4, 64), 4_194_304, 1025, 4);
    let e = refused(&k, &shapes, &scalars);
    assert!(
        e.contains("more than 2^32 elements (indices are 32-bit)"),
        "{e}"
    );
}
