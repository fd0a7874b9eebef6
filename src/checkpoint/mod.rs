//! Checkpoints: safetensors I/O with clear errors and atomic writes, the bitsandbytes 4-bit layout
//! that transformers loads, qforge's 8-bit blockwise layout, and the `quantize` / `dequantize`
//! jobs built on the runtime's host ops.

pub mod bnb4;
pub mod companions;
pub mod config;
pub mod dequantize;
pub mod int8;
pub mod io;
pub mod pyrepr;
pub mod quantize;

pub use dequantize::{dequantize_file, DequantizeReport};
pub use quantize::{
    quantize_file, QuantizeOptions, QuantizeReport, TensorReport, WeightFormat, DEFAULT_SKIP,
};
