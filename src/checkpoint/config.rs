//! The `quantization_config` that transformers reads from `config.json` (see
//! `docs/formats.md`): bitsandbytes 4-bit (`load_in_4bit`), LLM.int8 (`load_in_8bit`), and the
//! marker of qforge's 8-bit blockwise layout, which has no `quant_method` so that transformers
//! refuses to load the folder instead of reading the 8-bit codes as float weights.

use serde_json::{json, Map, Value};

/// The `quantization_config` of a bitsandbytes 4-bit checkpoint. `quant_type` is `nf4` or `fp4`;
/// `compute_dtype` and `quant_storage` are torch dtype names (`float32`, `bfloat16`, `uint8`...);
/// `skip` lists the Linear modules kept in full precision.
pub fn bnb4(
    quant_type: &str,
    double_quant: bool,
    compute_dtype: &str,
    quant_storage: &str,
    skip: &[String],
) -> Value {
    json!({
        "_load_in_4bit": true,
        "_load_in_8bit": false,
        "bnb_4bit_compute_dtype": compute_dtype,
        "bnb_4bit_quant_storage": quant_storage,
        "bnb_4bit_quant_type": quant_type,
        "bnb_4bit_use_double_quant": double_quant,
        "llm_int8_enable_fp32_cpu_offload": false,
        "llm_int8_has_fp16_weight": false,
        "llm_int8_skip_modules": skip,
        "llm_int8_threshold": 6.0,
        "load_in_4bit": true,
        "load_in_8bit": false,
        "quant_method": "bitsandbytes"
    })
}

/// The `quantization_config` of an LLM.int8 checkpoint (what transformers saves for
/// `load_in_8bit=True`, with the kept Linear modules listed).
pub fn llm_int8(skip: &[String]) -> Value {
    json!({
        "_load_in_4bit": false,
        "_load_in_8bit": true,
        "bnb_4bit_compute_dtype": "float32",
        "bnb_4bit_quant_storage": "uint8",
        "bnb_4bit_quant_type": "fp4",
        "bnb_4bit_use_double_quant": false,
        "llm_int8_enable_fp32_cpu_offload": false,
        "llm_int8_has_fp16_weight": false,
        "llm_int8_skip_modules": skip,
        "llm_int8_threshold": 6.0,
        "load_in_4bit": false,
        "load_in_8bit": true,
        "quant_method": "bitsandbytes"
    })
}

/// The marker of qforge's 8-bit blockwise layout. It has no `quant_method`: transformers refuses a
/// `quantization_config` without one ("has no `quant_method` attribute"), whereas an unknown
/// method would only be warned about and the codes loaded as float weights.
pub fn blockwise_marker(blocksize: usize) -> Value {
    json!({
        "qforge_format": "int8-blockwise",
        "blocksize": blocksize,
        "note": "qforge's 8-bit blockwise layout: transformers cannot load it; restore the \
                 weights with `qforge dequantize`"
    })
}

/// `config` with `quantization_config` set to `qc`.
pub fn with_quantization(mut config: Map<String, Value>, qc: Value) -> Map<String, Value> {
    config.insert("quantization_config".into(), qc);
    config
}

/// `config` without `quantization_config` (what `dequantize` writes).
pub fn without_quantization(mut config: Map<String, Value>) -> Map<String, Value> {
    config.remove("quantization_config");
    config
}

/// The text of a config file as transformers writes it (2-space indent, trailing newline).
pub fn text(config: &Map<String, Value>) -> String {
    serde_json::to_string_pretty(&Value::Object(config.clone()))
        .expect("JSON values always serialize")
        + "\n"
}
