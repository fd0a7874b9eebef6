//! Checkpoints: safetensors files and Hugging Face model folders (sharded or not) read through
//! memory maps and written tensor by tensor, the bitsandbytes 4-bit and LLM.int8 layouts that
//! transformers loads, qforge's 8-bit blockwise layout, which modules transformers quantizes
//! (`arch`), and the `quantize` / `dequantize` jobs built on the runtime's host ops.

pub mod arch;
pub mod bnb4;
pub mod chunks;
pub mod companions;
pub mod config;
pub mod dequantize;
pub mod emit;
pub mod int8;
pub mod io;
pub mod model_in;
pub mod out;
pub mod pyrepr;
pub mod quantize;
pub mod qweight;
pub mod st_read;
pub mod st_write;

pub use dequantize::{dequantize_model, DequantizeOptions, DequantizeReport};
pub use quantize::{quantize_model, QuantizeOptions, QuantizeReport, TensorReport, WeightFormat};
