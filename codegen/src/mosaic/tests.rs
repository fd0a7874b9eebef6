use qforge_kernels::KernelSpec;

use super::{lower, Shapes, STEP_ROWS};
use crate::Error;

fn library(name: &str) -> qforge_ir::Kernel {
    KernelSpec::from_name(name)
        .unwrap_or_else(|| panic!("no kernel {name}"))
        .build()
        .unwrap()
}

/// The shapes of a launch over `n` elements in blocks of `bs`: every dimension parameter
/// (`n`, `n_blocks`) from the buffer it sizes.
fn launch(k: &qforge_ir::Kernel, n: usize, bs: usize) -> Shapes {
    let blocks = n.div_ceil(bs);
    let mut s = Shapes::with_dims(k, 1);
    s.grid = blocks as u32;
    for (i, (_, p)) in k.params.iter().enumerate() {
        if let qforge_ir::ParamKind::Buffer { shape, .. } = &p.kind {
            let dim = match &shape[0] {
                qforge_ir::Dim::Param(d) => k.params.try_get(*d).unwrap().name.clone(),
                qforge_ir::Dim::Const(c) => {
                    s.elements[i] = *c as usize;
                    continue;
                }
            };
            s.elements[i] = if dim == "n" { n } else { blocks };
        }
    }
    s
}

/// Asserts that `text` contains every one of `pieces`.
fn assert_has(text: &str, pieces: &[&str]) {
    for piece in pieces {
        assert!(text.contains(piece), "missing {piece:?} in\n{text}");
    }
}

/// A 2-D array's shape.
pub(super) fn two(dims: &[u32]) -> [u32; 2] {
    dims.try_into().expect("a 2-D array")
}

#[test]
fn a_blockwise_dequantize_lowers_to_row_chunk_windows() {
    let k = library("dequantize_blockwise_dynamic_bs256_bf16");
    let m = lower(&k, &launch(&k, 1000, 256)).unwrap();
    // 4 work items in one step of 32 rows.
    assert_eq!(m.manifest.steps, 1);
    assert_eq!(m.manifest.step_rows, STEP_ROWS);
    let ins: Vec<(&str, [u32; 2], &str, usize)> = m
        .manifest
        .inputs
        .iter()
        .map(|a| {
            (
                a.param.as_str(),
                two(&a.shape),
                a.dtype.as_str(),
                a.elements,
            )
        })
        .collect();
    assert_eq!(
        ins,
        [
            ("q", [32, 256], "uint8", 1000),
            ("absmax", [32, 1], "float32", 4)
        ]
    );
    assert_eq!(m.manifest.outputs.len(), 1);
    assert_eq!(m.manifest.outputs[0].param, "out");
    assert_eq!(m.manifest.outputs[0].dtype, "bfloat16");
    assert_has(&m.text, &[
        "func.func @dequantize_blockwise_dynamic_bs256_bf16(%arg0: i32, %arg1: i32, %in_q: memref<32x256xi8",
        "window_bounds = array<i64: 32, 1>",
        "iteration_bounds = array<i64: 1, 1>",
        "arith.extui",
        "vector.broadcast",
        "tpu.vector_store %out_out",
    ]);
    // 255 selects for the 256-entry code, one for the index clamp and one for the NaN rule
    // of the bf16 rounding.
    assert_eq!(m.text.matches("arith.select").count(), 257);
    assert_eq!(m.twin.matches("stablehlo.select").count(), 257);
    assert!(m.twin.contains(
        "func.func public @main(%arg0: tensor<ui32>, %arg1: tensor<ui32>, %arg2: tensor<1000xui8>"
    ));
}

#[test]
fn kernels_outside_the_class_are_refused_by_name() {
    for (name, what) in [
        ("grad_sqnorm_f32", "`accumulate`"),
        (
            "int8_outlier_cols_f32",
            "a loop other than `for i in C*w..min(C*w + C, n)`",
        ),
        // Every dimension 256: 256 work items, one per element, for 256 x 256 elements.
        (
            "int8_vectorwise_dequant_f32",
            "a grid of 256 work items that does not cover the 65536 elements of ca",
        ),
        (
            "qadamw_nf4_dyn4_sr_f32",
            "a load of m1_code at an index of the chunk other than the loop index",
        ),
    ] {
        let k = library(name);
        match lower(&k, &Shapes::with_dims(&k, 256)) {
            Err(Error::Unsupported { backend, op }) => {
                assert_eq!(backend, "mosaic");
                assert!(op.contains(what) && op.contains(name), "{name}: {op}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn a_grid_whose_rows_pass_2_to_the_32_is_refused() {
    let k = library("dequantize_blockwise_linear_bs64_f32");
    let e = lower(&k, &Shapes::with_dims(&k, u32::MAX))
        .unwrap_err()
        .to_string();
    assert!(e.contains("a grid of 4294967295 work items"), "{e}");
}

#[test]
fn a_grid_short_of_the_buffer_is_refused() {
    let k = library("dequantize_blockwise_linear_bs64_f32");
    let mut s = launch(&k, 640, 64);
    // 9 * 64 < 640: the IR leaves the last 64 elements alone.
    s.grid = 9;
    let absmax = k.param_by_name("absmax").unwrap().index();
    s.elements[absmax] = 9;
    let e = lower(&k, &s).unwrap_err().to_string();
    assert!(e.contains("does not cover the 640 elements of"), "{e}");
}

#[test]
fn a_4bit_dequantize_interleaves_its_two_codes() {
    let k = library("dequantize_4bit_fp4_bs64_bf16");
    // 1001 outputs: the last byte's second code is past the end (the IR's `if`).
    let mut s = launch(&k, 1001, 64);
    let packed = k.param_by_name("packed").unwrap().index();
    s.elements[packed] = 501;
    let m = lower(&k, &s).unwrap();
    let shapes: Vec<(&str, [u32; 2])> = m
        .manifest
        .inputs
        .iter()
        .chain(&m.manifest.outputs)
        .map(|a| (a.param.as_str(), two(&a.shape)))
        .collect();
    assert_eq!(
        shapes,
        [("packed", [32, 32]), ("absmax", [32, 1]), ("out", [32, 64])]
    );
    assert_has(
        &m.text,
        &[
            "vector.shape_cast %v",
            "tpu.concatenate",
            "in 2 : vector<32x32x1xi32>, vector<32x32x1xi32> -> vector<32x32x2xi32>",
            "to vector<32x64xi32>",
            "window_bounds = array<i64: 32, 64>",
        ],
    );
    assert!(m.twin.contains("stablehlo.concatenate"), "{}", m.twin);
    assert!(m.twin.contains("%pair_col"), "{}", m.twin);
}

/// A kernel shaped like the 4-bit dequantization (a byte in, two outputs at `2i` and `2i + 1`,
/// the one at `2i` under its length check) with `odd` as the statement for `2i + 1`.
fn pairs_kernel(odd: &str) -> qforge_ir::Kernel {
    let text = format!(
        "kernel pairs(n: u32, n_packed: u32, n_blocks: u32, packed: u8[n_packed] read, \
         absmax: f32[n_blocks] read, out: f32[n] write)
grid n_blocks
{{
  %0: u32 = work_item
  %1: f32 = load absmax[%0]
  %2: u32 = param n
  %3: u32 = param n_packed
  %4: u32 = const 32
  %5: u32 = mul %0, %4
  %6: u32 = add %5, %4
  %7: u32 = min %6, %3
  %8: bool = cmp lt %5, %3
  %9: u32 = select %8, %7, %5
  for %10 in %5..%9 step 1 {{
    %11: u32 = load packed[%10]
    %12: f32 = bitcast f32 %11
    %13: f32 = mul %12, %1
    %14: u32 = const 1
    %15: u32 = shl %10, %14
    %16: u32 = add %15, %14
    %17: bool = cmp lt %15, %2
    %18: bool = cmp lt %16, %2
    if %17 {{
      store out[%15] = %13
    }}
    {odd}
  }}
}}
"
    );
    qforge_ir::text::parse(&text).unwrap()
}

/// The launch of [`pairs_kernel`] over `bytes` packed bytes and `outputs` outputs.
fn pairs_launch(k: &qforge_ir::Kernel, bytes: usize, outputs: usize) -> Shapes {
    let mut s = Shapes::with_dims(k, 0);
    s.grid = bytes.div_ceil(32) as u32;
    for (name, elements) in [
        ("packed", bytes),
        ("absmax", bytes.div_ceil(32)),
        ("out", outputs),
    ] {
        s.elements[k.param_by_name(name).unwrap().index()] = elements;
    }
    s
}

#[test]
fn stores_at_2i_and_2i_plus_1_follow_the_pairs_rules() {
    let guarded = "if %18 {\n      store out[%16] = %13\n    }";
    let k = pairs_kernel(guarded);
    assert!(lower(&k, &pairs_launch(&k, 100, 199)).is_ok());
    for (odd, outputs, why) in [
        // Only `2i` is stored.
        ("", 200, "at only one of `2i` and `2i + 1`"),
        // More outputs than the loop's stores reach.
        (
            guarded,
            201,
            "stored at `2i` and `2i + 1` for `i` below n_packed = 100",
        ),
        // An unguarded store past the end of `out` (an out-of-bounds store in the IR).
        ("store out[%16] = %13", 199, "past its end without an `if`"),
        // A guard on another length.
        (
            "if %8 {\n      store out[%16] = %13\n    }",
            199,
            "`if` (control flow",
        ),
        // The same half twice.
        (
            "store out[%15] = %13",
            200,
            "a second store to out at `2i + 0`",
        ),
    ] {
        let k = pairs_kernel(odd);
        let e = lower(&k, &pairs_launch(&k, 100, outputs))
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{odd:?}, {outputs} outputs: {e}");
    }
    // Unguarded stores are fine when `out` holds exactly `2 n_packed` elements.
    let k = pairs_kernel("store out[%16] = %13");
    assert!(lower(&k, &pairs_launch(&k, 100, 200)).is_ok());
}

#[test]
fn an_8bit_quantize_reduces_its_whole_chunk_and_stores_per_work_item() {
    let k = library("quantize_blockwise_dynamic_bs4096_bf16");
    let m = lower(&k, &launch(&k, 10000, 4096)).unwrap();
    let arrays = |a: &[super::ArrayLayout]| -> Vec<(String, [u32; 2])> {
        a.iter().map(|a| (a.param.clone(), two(&a.shape))).collect()
    };
    // `x` twice: per chunk element (512 lanes a step) and whole (the reduction's).
    assert_eq!(
        arrays(&m.manifest.inputs),
        [("x".to_string(), [32, 4096]), ("x".to_string(), [32, 4096])]
    );
    assert_eq!(
        arrays(&m.manifest.outputs),
        [
            ("q".to_string(), [32, 4096]),
            ("absmax".to_string(), [32, 1])
        ]
    );
    assert_eq!((m.manifest.lanes, m.manifest.lane_blocks), (512, 8));
    assert_has(
        &m.text,
        &[
            "%in_x: memref<32x512xbf16",
            "%in_x_whole: memref<32x4096xbf16",
            "{transform_indices = @transform_row, window_bounds = array<i64: 32, 4096>}",
            "vector.multi_reduction <maxsi>",
            "dense<-2147483648> : vector<32xi32>",
            // The lane blocks of a row write its absmax in turn.
            "#tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<arbitrary>]",
            "tpu.vector_store %out_absmax",
        ],
    );
    assert!(m
        .twin
        .contains("applies stablehlo.maximum across dimensions = [1]"));
    // The 257 thresholds as the level search: 9 levels of 1 to 256 entries.
    assert!(!m.text.contains("search_sorted"));
    // A dequantization's per-work-item windows are only read: its lane blocks stay parallel.
    let d = library("dequantize_blockwise_dynamic_bs4096_f32");
    let m = lower(&d, &launch(&d, 10000, 4096)).unwrap();
    assert!(m
        .text
        .contains("#tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<parallel>]"));
}

/// The chunk loop's bounds of the text kernels below: `%3 = 64 w`, `%7 = min(%3 + 64, n)`
/// (`%3` past `n`), `%0` the work item, `%1` = `n`.
const CHUNK_BOUNDS: &str = "  %0: u32 = work_item
  %1: u32 = param n
  %2: u32 = const 64
  %3: u32 = mul %0, %2
  %4: u32 = add %3, %2
  %5: u32 = min %4, %1
  %6: bool = cmp lt %3, %1
  %7: u32 = select %6, %5, %3
";

/// A kernel shaped like the 8-bit quantization: `reduce` the reduction over `x`, `store` the
/// statement that writes `absmax` before the chunk loop.
fn reduce_kernel(reduce: &str, store: &str) -> qforge_ir::Kernel {
    let text = format!(
        "kernel reducing(n: u32, n_blocks: u32, x: f32[n] read, q: f32[n] write, \
         absmax: f32[n_blocks] write)
grid n_blocks
{{
{CHUNK_BOUNDS}  %8: u32 = sub %7, %3
  {reduce}
  {store}
  for %10 in %3..%7 step 1 {{
    %11: f32 = load x[%10]
    %12: f32 = mul %11, %9
    store q[%10] = %12
  }}
}}
"
    );
    qforge_ir::text::parse(&text).unwrap()
}

#[test]
fn reductions_and_per_work_item_stores_follow_their_rules() {
    let good = "%9: f32 = reduce absmax ignore sequential x[%3, len %8]";
    let store = "store absmax[%0] = %9";
    let k = reduce_kernel(good, store);
    assert!(lower(&k, &launch(&k, 1000, 64)).is_ok());
    for (reduce, store, why) in [
        // The order of a sum matters: refused.
        (
            "%9: f32 = reduce sum sequential x[%3, len %8]",
            store,
            "`reduce sum`",
        ),
        // A range other than the chunk.
        (
            "%9: f32 = reduce absmax ignore sequential x[%3, len %2]",
            store,
            "a reduction of x over a range other than the work item's chunk",
        ),
        (
            "%9: f32 = reduce absmax ignore sequential x[%0, len %8]",
            store,
            "a reduction of x over a range other than the work item's chunk",
        ),
        // A per-work-item store at another index.
        (
            good,
            "store absmax[%3] = %9",
            "a store to absmax outside the chunk loop",
        ),
    ] {
        let k = reduce_kernel(reduce, store);
        let e = lower(&k, &launch(&k, 1000, 64)).unwrap_err().to_string();
        assert!(e.contains(why), "{reduce:?}, {store:?}: {e}");
    }
}

#[test]
fn a_nested_4bit_dequantize_gathers_its_scales_per_work_item() {
    let k = library("dequantize_4bit_nf4_nested_bs64_bf16");
    // 600 blocks: 3 nested absmax entries (one per 256 blocks).
    let n = 600 * 64;
    let mut s = launch(&k, n, 64);
    for (name, elements) in [
        ("n_packed", 0),
        ("packed", n / 2),
        ("qabsmax", 600),
        ("nested_absmax", 3),
        ("nested_code", 256),
    ] {
        if let Some(p) = k.param_by_name(name) {
            if elements > 0 {
                s.elements[p.index()] = elements;
            }
        }
    }
    let m = lower(&k, &s).unwrap();
    let ins: Vec<(&str, [u32; 2], usize)> = m
        .manifest
        .inputs
        .iter()
        .map(|a| (a.param.as_str(), two(&a.shape), a.elements))
        .collect();
    assert_eq!(
        ins,
        [
            // The guard `w / 256 < n_nested` reads the dimension as a scalar.
            ("n_nested", [1, 1], 1),
            ("offset", [1, 1], 1),
            ("packed", [608, 32], n / 2),
            ("qabsmax", [608, 1], 600),
            ("nested_absmax", [1, 3], 3),
            ("nested_code", [1, 256], 256),
        ]
    );
    assert_has(
        &m.text,
        &[
            // The work item's index: the step's first row plus the sublane.
            "tpu.iota {dimensions = array<i32: 0>} : vector<32x1xi32>",
            "arith.muli %arg0,",
            // The gathers: one-hot over the table's lanes.
            "tpu.iota {dimensions = array<i32: 1>} : vector<32x256xi32>",
            "tpu.iota {dimensions = array<i32: 1>} : vector<32x3xi32>",
            "{transform_indices = @transform_fixed, window_bounds = array<i64: 1, 256>}",
            "{transform_indices = @transform_fixed, window_bounds = array<i64: 1, 1>}",
            "func.func @transform_fixed",
        ],
    );
    assert!(m
        .twin
        .contains("stablehlo.broadcast_in_dim %arg4, dims = []"));
    // More nested absmax entries than a gather selects from.
    let absmax = k.param_by_name("nested_absmax").unwrap().index();
    s.elements[absmax] = super::MAX_GATHER + 1;
    let e = lower(&k, &s).unwrap_err().to_string();
    assert!(
        e.contains("from nested_absmax of 4097 elements (1 to 4096"),
        "{e}"
    );
}

#[test]
fn a_buffer_at_two_index_forms_is_refused() {
    let text = format!(
        "kernel two_forms(n: u32, n_blocks: u32, a: f32[n] readwrite, out: f32[n] write)
grid n_blocks
{{
{CHUNK_BOUNDS}  %8: f32 = load a[%0]
  store a[%0] = %8
  for %9 in %3..%7 step 1 {{
    %10: f32 = load a[%9]
    store out[%9] = %10
  }}
}}
"
    );
    let k = qforge_ir::text::parse(&text).unwrap();
    // 10 elements, 10 work items: the grid covers `a` both per work item and per chunk.
    let e = lower(&k, &launch(&k, 10, 1)).unwrap_err().to_string();
    assert!(e.contains("a used at two index forms"), "{e}");
}

/// A two-pass kernel shaped like the 8-bit optimizers, of chunk `chunk`: the first loop loads
/// `%9 = x[i]` and runs `fold` (which defines `%10` to `%12`, or to `%18` when it has `%18`,
/// variable `v`), the second runs over `range`.
fn running_kernel(fold: &str, range: &str, chunk: u32) -> qforge_ir::Kernel {
    let last = if fold.contains("%18") { 18 } else { 12 };
    let at = |k: u32| format!("%{}", last + k);
    let bounds = CHUNK_BOUNDS.replace("const 64", &format!("const {chunk}"));
    let text = format!(
        "kernel running(n: u32, n_blocks: u32, x: f32[n] read, q: f32[n] write, \
         top: f32[n_blocks] write)
grid n_blocks
var v: f32
{{
{bounds}  for %8 in %3..%7 step 1 {{
    %9: f32 = load x[%8]
    {fold}
  }}
  {v}: f32 = read_var v
  store top[%0] = {v}
  for {j} in {range} step 1 {{
    {xj}: f32 = load x[{j}]
    {y}: f32 = mul {xj}, {v}
    store q[{j}] = {y}
  }}
}}
",
        v = at(1),
        j = at(2),
        xj = at(3),
        y = at(4),
    );
    qforge_ir::text::parse(&text).unwrap()
}

#[test]
fn a_running_maximum_and_a_second_pass_follow_their_rules() {
    let good = "%10: f32 = abs %9
    %11: f32 = read_var v
    %12: f32 = max %11, %10
    assign v = %12";
    let k = running_kernel(good, "%3..%7", 64);
    let m = lower(&k, &launch(&k, 1000, 64)).unwrap();
    assert_has(
        &m.text,
        &[
            "tpu.iota {dimensions = array<i32: 1>}",
            "vector.multi_reduction <maxsi>",
        ],
    );
    // The NaN-keeping form of LLM.int8's row absmax, of a select of magnitudes and `+0.0`.
    let nan_keeping = "%10: f32 = abs %9
    %11: f32 = const 0x00000000
    %12: bool = cmp gt %9, %11
    %13: f32 = select %12, %11, %10
    %14: f32 = read_var v
    %15: bool = cmp gt %13, %14
    %16: bool = cmp ne %13, %13
    %17: bool = or %16, %15
    %18: f32 = select %17, %13, %14
    assign v = %18";
    let k = running_kernel(nan_keeping, "%3..%7", 64);
    let m = lower(&k, &launch(&k, 1000, 64)).unwrap();
    assert_has(&m.text, &["vector.multi_reduction <maxsi>"]);
    let not_running = "a variable assigned in the loop other than a running `max(v, m)`";
    let nan_keeping_with = |from: &str, to: &str| nan_keeping.replace(from, to);
    for (fold, range, why) in [
        // The NaN-keeping form with its branches swapped, with `m != v` for `m != m`, with a
        // value that may be negative (`-0.0` in the select), and with `m >= v`.
        (
            &*nan_keeping_with("select %17, %13, %14", "select %17, %14, %13"),
            "%3..%7",
            not_running,
        ),
        (
            &*nan_keeping_with("cmp ne %13, %13", "cmp ne %13, %14"),
            "%3..%7",
            not_running,
        ),
        (
            &*nan_keeping_with("const 0x00000000", "const 0x80000000"),
            "%3..%7",
            not_running,
        ),
        (
            &*nan_keeping_with("cmp gt %13, %14", "cmp ge %13, %14"),
            "%3..%7",
            not_running,
        ),
        // The operands swapped: `select(v > |x|, v, |x|)` lets a NaN `|x|` replace `v`.
        (
            "%10: f32 = abs %9
    %11: f32 = read_var v
    %12: f32 = max %10, %11
    assign v = %12",
            "%3..%7",
            not_running,
        ),
        // Not a magnitude: negative values order differently as bits.
        (
            "%10: f32 = abs %9
    %11: f32 = read_var v
    %12: f32 = max %11, %9
    assign v = %12",
            "%3..%7",
            not_running,
        ),
        // A sum, whose order matters.
        (
            "%10: f32 = abs %9
    %11: f32 = read_var v
    %12: f32 = add %11, %10
    assign v = %12",
            "%3..%7",
            not_running,
        ),
        // The running value used inside the loop.
        (
            "%10: f32 = abs %9
    %11: f32 = read_var v
    %12: f32 = max %11, %10
    assign v = %12
    store q[%8] = %11",
            "%3..%7",
            not_running,
        ),
        // A second loop over another range.
        (good, "%0..%7", "a second loop over another range"),
    ] {
        let k = running_kernel(fold, range, 64);
        let e = lower(&k, &launch(&k, 1000, 64)).unwrap_err().to_string();
        assert!(e.contains(why), "{fold}: {e}");
    }
    // The variable read again under the loop's length guard.
    let text = format!(
        "kernel guarded(n: u32, n_blocks: u32, x: f32[n] read, q: f32[n] write)
grid n_blocks
var v: f32
{{
{CHUNK_BOUNDS}  for %8 in %3..%7 step 1 {{
    %9: f32 = load x[%8]
    %10: f32 = abs %9
    %11: f32 = read_var v
    %12: f32 = max %11, %10
    assign v = %12
    %13: bool = cmp lt %8, %1
    if %13 {{
      %14: f32 = read_var v
      store q[%8] = %14
    }}
  }}
}}
"
    );
    let k = qforge_ir::text::parse(&text).unwrap();
    let e = lower(&k, &launch(&k, 1000, 64)).unwrap_err().to_string();
    assert!(e.contains(not_running), "{e}");
    // Past one step's lanes the chunk is taken in lane blocks; a running maximum needs the
    // whole chunk.
    let k = running_kernel(good, "%3..%7", 1024);
    let e = lower(&k, &launch(&k, 4096, 1024)).unwrap_err().to_string();
    assert!(
        e.contains("a running maximum over a chunk of 1024 elements"),
        "{e}"
    );
}

/// A kernel shaped like the 4-bit quantization (`x` reduced over 64 elements and read at `2i`
/// and `2i + 1` by a chunk of 32; a full block's loop and a guarded one for the last block,
/// which reads `x[2i + 1]` through variable `v`), with each `(from, to)` of `edits` applied.
fn branches_kernel(edits: &[(&str, &str)]) -> qforge_ir::Kernel {
    let mut text = format!(
        "kernel branching(n: u32, n_packed: u32, n_blocks: u32, x: f32[n] read, \
         y: f32[n_packed] write, z: f32[n_packed] write, absmax: f32[n_blocks] write)
grid n_blocks
var v: f32
var u: f32
{{
{CHUNK_BOUNDS}  %8: u32 = sub %7, %3
  %9: f32 = reduce absmax propagate sequential x[%3, len %8]
  store absmax[%0] = %9
  %10: u32 = param n_packed
  %11: u32 = const 32
  %12: u32 = mul %0, %11
  %13: u32 = add %12, %11
  %14: u32 = min %13, %10
  %15: bool = cmp lt %12, %10
  %16: u32 = select %15, %14, %12
  %17: bool = cmp eq %8, %2
  if %17 {{
    for %18 in %12..%16 step 1 {{
      %19: u32 = const 1
      %20: u32 = shl %18, %19
      %21: u32 = add %20, %19
      %22: f32 = load x[%20]
      %23: f32 = load x[%21]
      %24: f32 = add %22, %23
      store y[%18] = %24
    }}
  }} else {{
    for %25 in %12..%16 step 1 {{
      %26: u32 = const 1
      %27: u32 = shl %25, %26
      %28: u32 = add %27, %26
      %29: f32 = const 0x3f800000
      %30: bool = cmp lt %28, %1
      if %30 {{
        %31: f32 = load x[%28]
        assign v = %31
      }} else {{
        %32: f32 = const 0x00000000
        assign v = %32
      }}
      %33: f32 = read_var v
      %34: f32 = load x[%27]
      %35: f32 = sub %34, %33
      store y[%25] = %35
    }}
  }}
}}
"
    );
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    qforge_ir::text::parse(&text).unwrap()
}

/// The launch of [`branches_kernel`] over `n` elements of `x`.
fn branches_launch(k: &qforge_ir::Kernel, n: usize) -> Shapes {
    let mut s = Shapes::with_dims(k, 0);
    s.grid = n.div_ceil(64) as u32;
    for (name, elements) in [
        ("x", n),
        ("y", n.div_ceil(2)),
        ("z", n.div_ceil(2)),
        ("absmax", n.div_ceil(64)),
    ] {
        s.elements[k.param_by_name(name).unwrap().index()] = elements;
    }
    s
}

#[test]
fn branches_and_pairs_reads_follow_their_rules() {
    let k = branches_kernel(&[]);
    let m = lower(&k, &branches_launch(&k, 1001)).unwrap();
    // Both loops' stores to `y`, one select between them; `x` read once, as pairs, split once
    // into its two halves for both loops.
    assert_eq!(m.text.matches("tpu.vector_store %out_y").count(), 1);
    assert_eq!(m.text.matches("vector.load %in_x").count(), 1);
    assert_eq!(m.text.matches("_split = vector.shape_cast").count(), 1);
    assert_eq!(m.text.matches("vector.extract_strided_slice").count(), 2);
    for (edits, why) in [
        (
            vec![("store y[%25] = %35", "store z[%25] = %35")],
            "an `if` around the chunk loop whose branches do not store the same buffers",
        ),
        (
            vec![("  if %17 {\n", "  if %17 {\n    store absmax[%0] = %9\n")],
            "an `if` around the chunk loop whose branch holds more than `let`s and one loop",
        ),
        (
            vec![("assign v = %32", "assign u = %32")],
            "a variable assigned in one branch of an `if` in the loop and not in the other",
        ),
        (
            vec![("%29: f32 = const 0x3f800000", "%29: f32 = read_var v")],
            "the variable v read in the loop before the `if` that assigns it",
        ),
        (
            vec![(
                "  }\n}\n",
                "  }\n  %36: f32 = read_var v\n  store absmax[%0] = %36\n}\n",
            )],
            "the variable v assigned under an `if` in the loop and read outside it",
        ),
        (
            vec![("%20: u32 = shl %18, %19", "%20: u32 = add %18, %19")],
            "a load of x at an index of the chunk other than the loop index",
        ),
        (
            vec![("  } else {\n    for", "  }\n  if %17 {\n    for")],
            "an `if` around the chunk loop with a branch without the loop",
        ),
        (
            vec![("assign v = %32", "assign v = %32\n        assign v = %32")],
            "the variable v assigned twice in one branch of an `if` in the loop",
        ),
        (
            vec![(
                "%29: f32 = const 0x3f800000\n",
                "%29: f32 = const 0x3f800000\n      assign v = %29\n",
            )],
            "the variable v assigned in the loop both under an `if` and outside it",
        ),
    ] {
        let k = branches_kernel(&edits);
        let e = lower(&k, &branches_launch(&k, 1001))
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{edits:?}: {e}");
    }
}

#[test]
fn a_4bit_quantize_reads_pairs_in_steps_of_128_lanes() {
    let k = library("quantize_4bit_nf4_bs1024_f32");
    let mut shapes = Shapes::with_dims(&k, 0);
    shapes.grid = 3;
    for (name, elements) in [("x", 2500), ("packed", 1250), ("absmax", 3)] {
        shapes.elements[k.param_by_name(name).unwrap().index()] = elements;
    }
    let m = lower(&k, &shapes).unwrap();
    assert_has(
        &m.text,
        &[
            // Chunks of 512 bytes in four steps of 128 lanes: `x` as pairs, 256 lanes a step,
            // and whole (1024) for the reduction.
            "iteration_bounds = array<i64: 1, 4>",
            "%in_x: memref<32x256xf32",
            "%in_x_whole: memref<32x1024xf32",
            "%out_packed: memref<32x128xi8",
            "vector.multi_reduction <maxsi>, %v",
        ],
    );
    // The loop index as a value (`2i + 1 < n` in the last block's loop): the step's lanes
    // start at the lane block times 128.
    assert!(
        m.text.contains("arith.muli %arg1, %v"),
        "no lane block offset"
    );
    assert!(
        m.twin.contains("stablehlo.convert %col"),
        "no lane block offset in the twin"
    );
}

/// An element-wise kernel over `[rows, cols]` in the text form, with `edits` applied (`from`,
/// `to`): work item `w` is element `(w / cols, w - (w / cols) * cols)`.
fn elements_kernel(edits: &[(&str, &str)]) -> qforge_ir::Kernel {
    let mut text = "kernel elements(rows: u32, cols: u32, n: u32, other: u32, \
         c: i32[rows, cols] read, s: f32[rows] read, t: f32[cols] read, \
         out: f32[rows, cols] write)
grid n
{
  %0: u32 = work_item
  %1: u32 = param rows
  %2: u32 = param cols
  %3: u32 = div %0, %2
  %4: u32 = mul %3, %2
  %5: u32 = sub %0, %4
  %6: bool = cmp lt %3, %1
  %7: bool = cmp lt %5, %2
  %8: bool = and %6, %7
  if %8 {
    %9: i32 = load c[%0]
    %10: f32 = int_to_float rne %9
    %11: f32 = load s[%3]
    %12: f32 = load t[%5]
    %13: f32 = mul %10, %11
    %14: f32 = mul %13, %12
    store out[%0] = %14
  }
}
"
    .to_string();
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    qforge_ir::text::parse(&text).unwrap()
}

/// Launch shapes of [`elements_kernel`]: `rows x cols` elements, `grid` work items.
fn elements_launch(k: &qforge_ir::Kernel, rows: usize, cols: usize, grid: u32) -> Shapes {
    let mut s = Shapes::with_dims(k, 1);
    s.grid = grid;
    s.elements = vec![0, 0, 0, 0, rows * cols, rows, cols, rows * cols];
    s
}

#[test]
fn element_wise_kernels_follow_their_rules() {
    let k = elements_kernel(&[]);
    let m = lower(&k, &elements_launch(&k, 3, 200, 600)).unwrap();
    // Rows of 200 lanes; the column buffer is one row, the same block in every row step.
    assert_has(
        &m.text,
        &[
            "window_bounds = array<i64: 1, 200>",
            "@transform_cols",
            "vector.broadcast %v",
            "window_bounds = array<i64: 32, 1>",
            "window_bounds = array<i64: 32, 200>",
        ],
    );
    assert_eq!(m.manifest.steps, 1);
    let refused = |edits: &[(&str, &str)], grid: u32, why: &str| {
        let k = elements_kernel(edits);
        let e = lower(&k, &elements_launch(&k, 3, 200, grid))
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{edits:?}: {e}");
    };
    let guarded = "a store under an `if` outside the chunk loop";
    // A guard that lets a row past the buffers' through, or checks another row length.
    refused(&[("cmp lt %3, %1", "cmp le %3, %1")], 600, guarded);
    refused(&[("cmp lt %5, %2", "cmp lt %5, %1")], 600, guarded);
    // A column from another length than the row's.
    refused(
        &[("%4: u32 = mul %3, %2", "%4: u32 = mul %3, %1")],
        600,
        guarded,
    );
    // A grid that ends inside a row, and one that does not cover the buffers.
    refused(&[], 601, "not whole rows of 200");
    refused(&[], 400, "does not cover the 600 elements of c");
    // An output whose rows are not the guard's.
    refused(
        &[("out: f32[rows, cols] write", "out: f32[other, cols] write")],
        600,
        "out is not sized by",
    );
    // A column buffer written, and one of other than one element per column.
    refused(
        &[
            ("t: f32[cols] read", "t: f32[cols] readwrite"),
            (
                "store out[%0] = %14",
                "store out[%0] = %14\n    store t[%5] = %14",
            ),
        ],
        600,
        "a load of t at the row's column other than from a read-only buffer",
    );
}

#[test]
fn row_loops_follow_their_rules() {
    let text = |edit: (&str, &str)| {
        let t = "kernel rows(rows: u32, cols: u32, other: u32, a: f32[rows, cols] read, \
             flags: u32[cols] read, q: f32[rows, cols] write, top: f32[rows] write)
grid rows
{
  %0: u32 = work_item
  %1: u32 = param cols
  %2: u32 = mul %0, %1
  %3: f32 = reduce absmax propagate sequential a[%2, len %1]
  store top[%0] = %3
  %4: u32 = const 0
  for %5 in %4..%1 step 1 {
    %6: u32 = add %2, %5
    %7: f32 = load a[%6]
    %8: u32 = load flags[%5]
    %9: f32 = bitcast f32 %8
    %10: f32 = mul %7, %9
    store q[%6] = %10
  }
}
";
        assert!(t.contains(edit.0), "{}", edit.0);
        qforge_ir::text::parse(&t.replace(edit.0, edit.1)).unwrap()
    };
    let launch = |k: &qforge_ir::Kernel| {
        let mut s = Shapes::with_dims(k, 1);
        s.grid = 3;
        s.elements = vec![0, 0, 0, 600, 200, 600, 3];
        s
    };
    let k = text(("", ""));
    let m = lower(&k, &launch(&k)).unwrap();
    assert_has(
        &m.text,
        &["window_bounds = array<i64: 32, 200>", "@transform_cols"],
    );
    // Fewer work items than rows: the grid does not cover the buffers.
    let mut shapes = launch(&k);
    shapes.grid = 2;
    let e = lower(&k, &shapes).unwrap_err().to_string();
    assert!(
        e.contains("a grid of 2 work items that does not cover"),
        "{e}"
    );
    for (edit, why) in [
        // Rows that do not start at `w * cols`: no row loop.
        (
            ("%2: u32 = mul %0, %1", "%2: u32 = mul %0, %0"),
            "a reduction of a outside a kernel whose top level has the chunk loop",
        ),
        // A column buffer of another length.
        (
            ("flags: u32[cols] read", "flags: u32[other] read"),
            "a load of flags at the row's column other than from a read-only buffer",
        ),
        // A loop from 1.
        (
            ("%4: u32 = const 0", "%4: u32 = const 1"),
            "a reduction of a outside a kernel whose top level has the chunk loop",
        ),
    ] {
        let k = text(edit);
        let e = lower(&k, &launch(&k)).unwrap_err().to_string();
        assert!(e.contains(why), "{edit:?}: {e}");
    }
}

#[test]
fn the_4bit_optimizers_ifs_follow_their_rules() {
    // The 8-bit AdamW of the 4-bit optimizers' family: its absmax and quantization passes
    // under `if the block is not empty`, the new absmax stored under `if w < n_blocks`.
    let k = library("qadamw_linear8_linear8_f32");
    let mut shapes = launch(&k, 1000, 256);
    let m = lower(&k, &shapes).unwrap();
    assert_has(
        &m.text,
        &["vector.multi_reduction <maxsi>", "%out_m1_absmax"],
    );
    // A fifth work item, whose block would be empty.
    shapes.grid = 5;
    let e = lower(&k, &shapes).unwrap_err().to_string();
    assert!(
        e.contains("an `if` on the chunk not being empty, at a grid of 5 work items whose last chunk starts at 1024, past n = 1000"),
        "{e}"
    );
    // A per-work-item store under `w < P` into a buffer sized by another parameter.
    let text = |size: &str| {
        format!(
            "kernel guarded_row(n: u32, n_blocks: u32, other: u32, x: f32[n] read, \
             top: f32[{size}] write)
grid n_blocks
{{
{CHUNK_BOUNDS}  for %8 in %3..%7 step 1 {{
    %9: f32 = load x[%8]
  }}
  %10: u32 = param n_blocks
  %11: bool = cmp lt %0, %10
  if %11 {{
    %12: f32 = const 0x3f800000
    store top[%0] = %12
  }}
}}
"
        )
    };
    let k = qforge_ir::text::parse(&text("n_blocks")).unwrap();
    lower(&k, &launch(&k, 1000, 64)).unwrap();
    let k = qforge_ir::text::parse(&text("other")).unwrap();
    let mut shapes = launch(&k, 1000, 64);
    shapes.elements[4] = 16;
    let e = lower(&k, &shapes).unwrap_err().to_string();
    assert!(
        e.contains("a store under an `if` outside the chunk loop"),
        "{e}"
    );
}
