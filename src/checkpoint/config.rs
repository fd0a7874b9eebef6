//! The `quantization_config` that transformers writes into `config.json` for bitsandbytes 4-bit
//! models (see `docs/formats.md`).

use serde_json::{json, Map, Value};

/// Returns `config` with the bitsandbytes 4-bit `quantization_config` set.
///
/// `quant_type` is `nf4` or `fp4`; `compute_dtype` is `float32`, `float16` or `bfloat16`.
pub fn with_bnb4_config(
    mut config: Map<String, Value>,
    quant_type: &str,
    double_quant: bool,
    compute_dtype: &str,
) -> Map<String, Value> {
    config.insert(
        "quantization_config".into(),
        json!({
            "_load_in_4bit": true,
            "_load_in_8bit": false,
            "bnb_4bit_compute_dtype": compute_dtype,
            "bnb_4bit_quant_storage": "uint8",
            "bnb_4bit_quant_type": quant_type,
            "bnb_4bit_use_double_quant": double_quant,
            "llm_int8_enable_fp32_cpu_offload": false,
            "llm_int8_has_fp16_weight": false,
            "llm_int8_skip_modules": null,
            "llm_int8_threshold": 6.0,
            "load_in_4bit": true,
            "load_in_8bit": false,
            "quant_method": "bitsandbytes"
        }),
    );
    config
}
