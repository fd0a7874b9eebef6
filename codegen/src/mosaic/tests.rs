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
        .map(|a| (a.param.as_str(), a.shape, a.dtype, a.elements))
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
    for piece in [
        "func.func @dequantize_blockwise_dynamic_bs256_bf16(%arg0: i32, %arg1: i32, %in_q: memref<32x256xi8",
        "window_bounds = array<i64: 32, 1>",
        "iteration_bounds = array<i64: 1, 1>",
        "arith.extui",
        "vector.broadcast",
        "tpu.vector_store %out_out",
    ] {
        assert!(m.text.contains(piece), "missing {piece:?} in\n{}", m.text);
    }
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
        ("adam32_f32", "fma"),
        (
            "quantize_blockwise_dynamic_bs256_f32",
            "a store outside the chunk loop",
        ),
        ("dequantize_4bit_nf4_bs64_f32", "`if`"),
        ("dequantize_4bit_nf4_nested_bs64_f32", "`if`"),
        ("dequantize_blockwise_dynamic_bs256_f16", "f16"),
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
