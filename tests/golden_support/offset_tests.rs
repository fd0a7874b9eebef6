//! The double-quantization offset kernel (`absmax_mean_f32`) against torch's CPU `mean`: the host
//! model (`golden_support::torch_mean_model`) on every path of torch's summation order, and
//! values computed by torch itself (MiniLM's absmax, and an input large enough for the cascade's
//! wider chunks). Part of `tests/golden.rs` (`docs/compat.md`, "Double-quantization offset").

use std::path::Path;

use qforge::ir::{DType, ReduceOrder};
use qforge::kernels::ops::{self, Absmax4};
use qforge::kernels::QuantType;
use qforge::runtime::{CpuDevice, Device, HostTensor, InterpreterDevice};
use safetensors::SafeTensors;

use super::{devices, ordered_mean, TORCH_X86_LANES};
use crate::golden_support::{same_f32, torch_mean_model, ulp_diff};

/// A deterministic, heavy-tailed, non-negative input (like an absmax) of `n` values: `u * u` with
/// `u = ((i * 2654435761) mod 2^32 >> 8) * 2^-24`, exact in `f32` before the one rounded product
/// (numpy computes the same values, so torch can be run on them).
fn hashed_input(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 * (1.0 / 16_777_216.0);
            u * u
        })
        .collect()
}

/// torch's `mean` of [`hashed_input`] (`plain`) and of the same values with every third one
/// (`i % 3 == 1`) replaced by `-1000 * v` (`signed`), as `f32` bits, at lengths that reach every
/// branch of torch's order: the scalar path (`n < 8`), vectors with and without leftover vectors
/// and tail elements, one and several chunks of 16 groups of 32 values (level 1), multiples of
/// 256 groups (level 2, e.g. MiniLM's 9216) and 4096 groups (level 3: 131072 values and more;
/// 139893 has all four levels non-empty at the end). Computed with torch 2.15.0+cu132 on CPU,
/// `torch.set_num_threads(1)`, from the same values built with numpy:
/// `torch.from_numpy(x).mean()`; identical with `ATEN_CPU_CAPABILITY=avx2` and the machine's
/// default (AVX-512).
const TORCH_MEANS: &[(usize, u32, u32)] = &[
    (1, 0x00000000, 0x00000000),
    (2, 0x3e43910b, 0xc33efba5),
    (3, 0x3e15664a, 0xc2fe9b59),
    (4, 0x3e95664b, 0xc2be9723),
    (5, 0x3e8e588c, 0xc2f1a322),
    (7, 0x3e8af491, 0xc2ac73d0),
    (8, 0x3e8065c4, 0xc2b180ef),
    (9, 0x3ea4db27, 0xc29d9537),
    (15, 0x3e991036, 0xc245aca3),
    (16, 0x3e91d6a8, 0xc2394d29),
    (17, 0x3ea109b8, 0xc2b4158d),
    (31, 0x3ea9a6e3, 0xc2b02fa9),
    (32, 0x3ea4c14a, 0xc2ac42f2),
    (33, 0x3ea921ac, 0xc2a7013e),
    (39, 0x3ea42cc2, 0xc2b3d919),
    (40, 0x3ea03506, 0xc2af59ee),
    (63, 0x3ea70e77, 0xc2d8bdf0),
    (64, 0x3eab7506, 0xc2d553f6),
    (65, 0x3eab3d08, 0xc2db7edd),
    (255, 0x3eaa0b75, 0xc2ddbec7),
    (256, 0x3eaa18e9, 0xc2dce04f),
    (257, 0x3ea9876d, 0xc2dc61d8),
    (511, 0x3eaa2a48, 0xc2da71f9),
    (512, 0x3eaa7f65, 0xc2dc9d94),
    (513, 0x3eaa5a4e, 0xc2dc2f4c),
    (515, 0x3eaa23af, 0xc2dd11f9),
    (1023, 0x3eaa8626, 0xc2dae092),
    (1024, 0x3eaa6370, 0xc2daa9d2),
    (1029, 0x3eaa5f51, 0xc2dc1213),
    (2304, 0x3eaa66bc, 0xc2dc8d4b),
    (4095, 0x3eaaa5b8, 0xc2dddd7f),
    (8192, 0x3eaaa9de, 0xc2dd9e4e),
    (8195, 0x3eaaad30, 0xc2dd8b47),
    (9216, 0x3eaa9f87, 0xc2dd6864),
    (16411, 0x3eaaa7b1, 0xc2ddaf66),
    (131072, 0x3eaaaa37, 0xc2ddc41c),
    (131109, 0x3eaaaa8e, 0xc2ddc29d),
    (139893, 0x3eaaaa36, 0xc2ddc217),
];

/// torch's `mean` (computed as for [`TORCH_MEANS`]) of [`step_input`]: the cascade's level 3
/// holds a sum near `2^32` per row-lane, so the way the level-2 sums after it are combined shows
/// in the last bit (flushing level 2 into level 3 at every multiple of 256 groups instead of 4096
/// gives `0x496fdb9b` at 139893).
const TORCH_STEP_MEANS: &[(usize, u32)] = &[
    (131_072, 0x4980_0000),
    (131_109, 0x497f_ed81),
    (139_893, 0x496f_db9d),
];

/// `2^20` for the first 131072 values, `0.96875` after.
fn step_input(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| if i < 131_072 { 1_048_576.0 } else { 0.968_75 })
        .collect()
}

#[test]
fn offset_kernel_is_torchs_mean_on_every_path() {
    let signed = |xs: &[f32]| -> Vec<f32> {
        xs.iter()
            .enumerate()
            .map(|(i, v)| if i % 3 == 1 { -v * 1e3 } else { *v })
            .collect()
    };
    for dev in devices() {
        for &(n, plain, signed_bits) in TORCH_MEANS {
            let xs = hashed_input(n);
            let mut inputs = vec![(xs.clone(), Some(plain)), (signed(&xs), Some(signed_bits))];
            if let Some((_, bits)) = TORCH_STEP_MEANS.iter().find(|(m, _)| *m == n) {
                inputs.push((step_input(n), Some(*bits)));
            }
            // All -0.0 (torch gives +0.0: its accumulators start at +0.0) and a NaN.
            if n < 1024 {
                inputs.push((vec![-0.0; n], Some(0)));
                let mut nan = xs.clone();
                nan[n / 2] = f32::NAN;
                inputs.push((nan, None));
            }
            for (k, (xs, torch)) in inputs.iter().enumerate() {
                let ours = ops::absmax_mean(dev.as_ref(), xs).unwrap();
                let model = torch_mean_model(xs, TORCH_X86_LANES);
                assert!(
                    same_f32(ours, model),
                    "{} n={n} input {k}: offset {ours:e} ({:#x}), the host model of torch's \
                     order gives {model:e} ({:#x})",
                    dev.name(),
                    ours.to_bits(),
                    model.to_bits()
                );
                let torch = torch.map_or(f32::NAN, f32::from_bits);
                assert!(
                    same_f32(ours, torch),
                    "{} n={n} input {k}: offset {ours:e} ({:#x}), torch computed {torch:e} ({:#x})",
                    dev.name(),
                    ours.to_bits(),
                    torch.to_bits()
                );
            }
        }
    }
}

/// torch's offsets of MiniLM tensors, computed by bitsandbytes 0.50.2 on CPU:
/// `F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)[1].offset` for
/// the f32 weight `w` of `all-MiniLM-L6-v2/model.safetensors` (torch 2.15.0+cu132, AVX-512
/// machine, `torch.set_num_threads(1)`); each equals torch's `absmax.mean()` of the
/// `compress_statistics=False` absmax. The number of blocks, and the distance in ulps of the
/// `Strided(16)` mean qforge used before (which this test would catch).
const MINILM_OFFSETS: &[(&str, usize, u32, i64)] = &[
    (
        "encoder.layer.0.attention.self.query.weight",
        2304,
        0x3e7d_61bc,
        2,
    ),
    (
        "encoder.layer.0.intermediate.dense.weight",
        9216,
        0x3e2a_c518,
        -1,
    ),
    (
        "encoder.layer.3.intermediate.dense.weight",
        9216,
        0x3e31_524d,
        -2,
    ),
    ("encoder.layer.5.output.dense.weight", 9216, 0x3ddc_9485, 2),
    ("pooler.dense.weight", 2304, 0x3cc0_bf27, 0),
];

#[test]
fn offsets_of_minilm_tensors_are_torchs() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/all-MiniLM-L6-v2/model.safetensors");
    if !path.is_file() {
        qforge_testkit::unavailable("models", format!("{} is missing", path.display()));
        return;
    }
    let bytes = std::fs::read(&path).unwrap();
    let model = SafeTensors::deserialize(&bytes).unwrap();
    let cpu = CpuDevice::new().ok();
    for &(name, blocks, bits, strided_ulps) in MINILM_OFFSETS {
        let t = model.tensor(name).unwrap();
        let w = HostTensor::new(DType::F32, t.shape().to_vec(), t.data().to_vec()).unwrap();
        let dev: &dyn Device = match &cpu {
            Some(cpu) => cpu,
            None => &InterpreterDevice,
        };
        let (_, state) = ops::quantize_4bit(dev, &w, QuantType::Nf4, 64, true).unwrap();
        let Absmax4::Nested { offset, .. } = state.absmax else {
            panic!("{name}: nested state expected")
        };
        assert_eq!(
            offset.to_bits(),
            bits,
            "{name}: offset {offset:e}, torch/bitsandbytes {:e}",
            f32::from_bits(bits)
        );
        // The same on the interpreter, from the plain absmax.
        let (_, plain) = ops::quantize_4bit(dev, &w, QuantType::Nf4, 64, false).unwrap();
        let Absmax4::Plain(absmax) = plain.absmax else {
            panic!("{name}: plain absmax expected")
        };
        assert_eq!(absmax.len(), blocks, "{name}: blocks");
        let on_interp = ops::absmax_mean(&InterpreterDevice, &absmax).unwrap();
        assert_eq!(
            on_interp.to_bits(),
            bits,
            "{name}: offset on the interpreter"
        );
        let strided = ordered_mean(&absmax, ReduceOrder::Strided(16));
        assert_eq!(
            ulp_diff(strided, f32::from_bits(bits)),
            strided_ulps,
            "{name}: the Strided(16) mean"
        );
    }
}

#[test]
fn offset_kernel_uses_wider_chunks_for_huge_inputs_like_torch() {
    // 16,809,229 values: 525,288 groups of 32, more than 2^19, so torch's cascade chunks are
    // 2^5 groups instead of 2^4. torch 2.15.0 (CPU, one thread) on
    // `hashed_input` computed with numpy: `torch.from_numpy(x).mean()` = 0x3eaaaaad; with
    // chunks of 2^4 groups the same order gives 0x3eaaaaac. The CPU device only (the
    // interpreter would take long on 17 million values).
    let Ok(cpu) = CpuDevice::new() else {
        qforge_testkit::unavailable("cpu", "the huge offset case runs on the CPU device only");
        return;
    };
    let xs = hashed_input(16_809_229);
    assert_eq!(
        torch_mean_model(&xs, TORCH_X86_LANES).to_bits(),
        0x3eaa_aaad
    );
    let ours = ops::absmax_mean(&cpu, &xs).unwrap();
    assert_eq!(ours.to_bits(), 0x3eaa_aaad, "offset {ours:e}");
}
