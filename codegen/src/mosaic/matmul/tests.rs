//! The matmul class's rules (`super`): the pipelined module of a 4-bit matmul, and a
//! refusal per rule, on library kernels and on mutants of their text form.

use qforge_ir::{Kernel, ParamKind};
use qforge_kernels::KernelSpec;

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

/// The launch of 4-bit matmul forward `kernel` (tiles `tm x tn`, blocks of `bs`) at
/// `m x n x k`: its shapes and integer scalars, by parameter name.
fn launch(
    kernel: &Kernel,
    (tm, tn, bs): (usize, usize, usize),
    m: usize,
    n: usize,
    k: usize,
) -> (Shapes, Vec<Option<u32>>) {
    let n_tiles = n.div_ceil(tn);
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
            (ParamKind::Scalar(_), _) => (None, 0),
            (_, "x") => (None, m * k),
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

const F32_BIAS: &str = "matmul_4bit_nf4_bs64_f32_bias_t1x4";
const F32: &str = "matmul_4bit_nf4_bs64_f32_t1x4";

fn refusal(kernel: &Kernel, m: usize, n: usize, k: usize) -> String {
    let (shapes, scalars) = launch(kernel, (1, 4, 64), m, n, k);
    match lower_with(kernel, &shapes, &scalars) {
        Err(Error::Unsupported { op, .. }) => op,
        other => panic!(
            "{}: not refused: {:?}",
            kernel.name,
            other.map(|m| m.manifest)
        ),
    }
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
        .map(|a| (a.param.as_str(), a.shape, a.buffer_shape))
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
        e.contains("a weight read per block of 2^6 elements where K = 200"),
        "{e}"
    );
}

#[test]
fn a_matmul_refuses_a_launch_that_does_not_cover_the_output() {
    let k = library(F32);
    let (mut shapes, mut scalars) = launch(&k, (1, 4, 64), 3, 5, 128);
    shapes.grid -= 1;
    scalars[3] = Some(shapes.grid);
    let e = match lower_with(&k, &shapes, &scalars) {
        Err(Error::Unsupported { op, .. }) => op,
        _ => panic!("not refused"),
    };
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
    assert!(e.contains("not its row's and column's once"), "{e}");
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
    assert!(e.contains("an empty matmul (M = 0, N = 5, K = 128)"), "{e}");
    // Every work item is evaluated: 2^26 work items of 4 accumulators are too many, refused
    // before any is.
    let (mut shapes, mut scalars) = launch(&k, (1, 4, 64), 3, 5, 128);
    shapes.grid = 1 << 26;
    scalars[3] = Some(shapes.grid);
    let e = match lower_with(&k, &shapes, &scalars) {
        Err(Error::Unsupported { op, .. }) => op,
        _ => panic!("not refused"),
    };
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
        .any(|a| a.param == "bias" && a.buffer_shape == Some([1, 1])));
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
