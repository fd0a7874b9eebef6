//! `qforge quantize` on a real checkpoint (all-MiniLM-L6-v2): the file's codes and absmax equal
//! what the library kernels compute on the reference interpreter, `dequantize` reproduces
//! `dequantize_4bit` bit for bit, and the config gains bitsandbytes' `quantization_config`.
//! Fails when `../shared/models` is missing under CI=true; skips with a reason elsewhere.

use std::path::{Path, PathBuf};

use qforge::checkpoint::{
    dequantize_file, quantize_file, QuantizeOptions, WeightFormat, DEFAULT_SKIP,
};
use qforge::ir::library::QuantType;
use qforge::ir::DType;
use qforge::runtime::ops::{self, Absmax4};
use qforge::runtime::{CpuDevice, HostTensor, InterpreterDevice};
use safetensors::SafeTensors;

fn model_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/models/all-MiniLM-L6-v2");
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is missing under CI",
        dir.display()
    );
    println!("skipped: {} is missing", dir.display());
    None
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Weights checked against the interpreter (a mix of shapes).
const CHECKED: [&str; 3] = [
    "encoder.layer.0.intermediate.dense.weight",
    "encoder.layer.3.output.dense.weight",
    "pooler.dense.weight",
];

#[test]
fn minilm_nf4_double_quant_matches_the_library_kernels() {
    let Some(dir) = model_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("minilm-nf4.safetensors");
    let opts = QuantizeOptions {
        format: WeightFormat::FourBit(QuantType::Nf4),
        blocksize: 64,
        double_quant: true,
        compute_dtype: DType::BF16,
        skip: regex::Regex::new(DEFAULT_SKIP).unwrap(),
        allow_nonfinite: false,
    };
    let cpu = CpuDevice::new().unwrap();
    let report = quantize_file(
        &cpu,
        &dir.join("model.safetensors"),
        &out,
        &opts,
        &mut |_, _| {},
    )
    .unwrap();
    // 6 layers x 6 Linear weights + the pooler.
    assert_eq!(report.tensors.len(), 37);
    for t in &report.tensors {
        assert!(
            t.rmse > 0.0 && t.rmse < 0.02 && t.bits_per_param > 4.0 && t.bits_per_param < 4.2,
            "{t:?}"
        );
    }

    let original = std::fs::read(dir.join("model.safetensors")).unwrap();
    let original = SafeTensors::deserialize(&original).unwrap();
    let written = std::fs::read(&out).unwrap();
    let written = SafeTensors::deserialize(&written).unwrap();
    let mut states = Vec::new();
    for name in CHECKED {
        let w = original.tensor(name).unwrap();
        let w = HostTensor::new(DType::F32, w.shape().to_vec(), w.data().to_vec()).unwrap();
        let (packed, state) =
            ops::quantize_4bit(&InterpreterDevice, &w, QuantType::Nf4, 64, true).unwrap();
        assert_eq!(
            written.tensor(name).unwrap().data(),
            &packed[..],
            "{name}: codes"
        );
        let Absmax4::Nested {
            qabsmax,
            nested_absmax,
            offset,
            ..
        } = &state.absmax
        else {
            panic!("nested state expected")
        };
        assert_eq!(
            written.tensor(&format!("{name}.absmax")).unwrap().data(),
            &qabsmax[..],
            "{name}: qabsmax"
        );
        let nested = f32s(
            written
                .tensor(&format!("{name}.nested_absmax"))
                .unwrap()
                .data(),
        );
        assert_eq!(
            nested.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            nested_absmax
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            "{name}: nested_absmax"
        );
        let json = written
            .tensor(&format!("{name}.quant_state.bitsandbytes__nf4"))
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(json.data()).unwrap();
        assert_eq!(
            json["nested_offset"].as_f64().unwrap() as f32,
            *offset,
            "{name}: offset"
        );
        states.push((name, packed, state));
    }

    let restored_path = tmp.path().join("restored.safetensors");
    let r = dequantize_file(&cpu, &out, &restored_path, None).unwrap();
    assert_eq!(r.restored.len(), 37);
    let restored = std::fs::read(&restored_path).unwrap();
    let restored = SafeTensors::deserialize(&restored).unwrap();
    assert_eq!(
        restored.len(),
        original.len(),
        "same tensor set as the original"
    );
    for (name, packed, state) in &states {
        let expected = ops::dequantize_4bit(&InterpreterDevice, packed, state).unwrap();
        let got = restored.tensor(name).unwrap();
        assert_eq!(got.shape(), &expected.shape[..]);
        assert_eq!(
            got.data(),
            &expected.data[..],
            "{name}: dequantize differs from dequantize_4bit"
        );
    }
    // Tensors that were not quantized are copied byte for byte.
    for name in [
        "embeddings.word_embeddings.weight",
        "encoder.layer.0.attention.output.LayerNorm.weight",
        "encoder.layer.2.intermediate.dense.bias",
    ] {
        assert_eq!(
            restored.tensor(name).unwrap().data(),
            original.tensor(name).unwrap().data(),
            "{name}"
        );
    }

    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("config.json")).unwrap()).unwrap();
    let q = &config["quantization_config"];
    assert_eq!(
        (
            q["quant_method"].as_str(),
            q["bnb_4bit_quant_type"].as_str(),
            q["bnb_4bit_use_double_quant"].as_bool()
        ),
        (Some("bitsandbytes"), Some("nf4"), Some(true))
    );
    assert_eq!(q["bnb_4bit_compute_dtype"].as_str(), Some("bfloat16"));
    assert_eq!(
        config["hidden_size"].as_u64(),
        Some(384),
        "the rest of the config is kept"
    );
}
