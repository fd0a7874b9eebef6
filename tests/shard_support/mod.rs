//! The 4-bit layers and inputs that the sharding suites share (`tests/distributed.rs` on
//! `SingleRank` and MPI, `tests/xla_spmd.rs` on XLA devices).
#![allow(dead_code)]

use qforge::kernels::ops::{Linear4bit, QuantType};
use qforge::runtime::{Device, HostTensor};
use qforge_ir::DType;

/// One layer of the cases: `(N, K, quant_type, blocksize, double-quantized)`.
pub type Shape = (usize, usize, QuantType, usize, bool);

/// Column-parallel shapes whose legal shard boundaries fall on every kind of block boundary:
/// nested blocks exactly (4 rows of 64 blocks each), blocks that cross rows (`K = 40`), one
/// block per row.
pub const SHAPES: [Shape; 3] = [
    (16, 4096, QuantType::Nf4, 64, true),
    (16, 40, QuantType::Fp4, 64, false),
    (8, 96, QuantType::Nf4, 32, false),
];

/// Row-parallel shapes: `K / D` a multiple of the blocksize for `D` in 1, 2, 4; nested blocks
/// (256 blocks) that a column range of each row cuts.
pub const ROW_SHAPES: [Shape; 3] = [
    (16, 4096, QuantType::Nf4, 64, true),
    (8, 256, QuantType::Fp4, 32, false),
    (6, 512, QuantType::Nf4, 128, true),
];

/// Deterministic values in about `[-7.5, 7.5]`, none subnormal (products included).
pub fn values(len: usize, seed: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32 * 0.731 + seed).sin() * 3.0) * ((i % 7) as f32 - 2.5))
        .collect()
}

/// One `f32` tensor of [`values`] per shape, tensor `i` from seed `seed + i`.
pub fn tensors_of(shapes: &[&[usize]], seed: f32) -> Vec<HostTensor> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, shape)| {
            let n = shape.iter().product();
            HostTensor::from_f32(shape.to_vec(), &values(n, seed + i as f32)).unwrap()
        })
        .collect()
}

/// The layer of `shape`, quantized on `dev`, with a bf16 bias.
pub fn layer(dev: &dyn Device, (n, k, qt, bs, nested): Shape) -> Linear4bit {
    let w = HostTensor::from_f32(vec![n, k], &values(n * k, 0.3)).unwrap();
    let bias = HostTensor::from_f32_as(DType::BF16, vec![n], &values(n, 1.7)).unwrap();
    Linear4bit::quantize(dev, &w, qt, bs, nested, Some(bias)).unwrap()
}

/// Columns `cols` of the rows of `t` (`[m, k]`).
pub fn columns_of(t: &HostTensor, cols: std::ops::Range<usize>) -> HostTensor {
    let (m, k, size) = (t.shape[0], t.shape[1], t.dtype.size_bytes());
    let data = (0..m)
        .flat_map(|r| t.data[(r * k + cols.start) * size..(r * k + cols.end) * size].to_vec())
        .collect();
    HostTensor::new(t.dtype, vec![m, cols.len()], data).unwrap()
}

/// MiniLM's layer-0 feed-forward block quantized to NF4 on `dev`: `(intermediate.dense,
/// output.dense, x)` with `x` 8 rows of the model's inputs; `None` without the model.
pub fn minilm_ffn(dev: &dyn Device) -> Option<(Linear4bit, Linear4bit, HostTensor)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/all-MiniLM-L6-v2/model.safetensors");
    if !path.is_file() {
        return None;
    }
    let model = qforge::finetune::Model::load(dev, &path, &[0]).unwrap();
    let linear = |l: &qforge::finetune::Linear| Linear4bit {
        packed: l.packed.clone(),
        state: l.state.clone(),
        bias: Some(l.bias.clone()),
    };
    let x = model
        .rows(&(0..8).map(|i| i * 97 + 5).collect::<Vec<_>>())
        .unwrap();
    Some((
        linear(&model.blocks[0].up),
        linear(&model.blocks[0].down),
        x,
    ))
}
