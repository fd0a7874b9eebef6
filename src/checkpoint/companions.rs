//! Reading a quantized weight's companion tensors and JSON quant state back from a checkpoint,
//! with every error naming the file and the weight.

use qforge_ir::DType;
use serde_json::Value;

use super::bnb4::torch_dtype_name;
use super::model_in::ModelIn;
use super::st_read::{StFile, TensorInfo};
use crate::error::{Error, Result};

/// The tensors named `<name><suffix>` of one quantized weight `name` (in any shard).
pub struct Companions<'m> {
    model: &'m ModelIn,
    name: &'m str,
}

impl<'m> Companions<'m> {
    /// The companions of weight `name` in `model`.
    pub fn new(model: &'m ModelIn, name: &'m str) -> Self {
        Companions { model, name }
    }

    /// An [`Error::Tensor`] about this weight.
    pub fn error(&self, message: impl Into<String>) -> Error {
        Error::Tensor {
            path: self.model.path_of(self.name),
            tensor: self.name.to_string(),
            message: message.into(),
        }
    }

    /// The tensor `<name><suffix>` (any dtype).
    ///
    /// # Errors
    /// When it is missing.
    pub fn get(&self, suffix: &str) -> Result<(&'m StFile, &'m TensorInfo)> {
        let key = format!("{}{suffix}", self.name);
        self.model
            .get(&key)
            .ok_or_else(|| self.error(format!("companion tensor '{key}' is missing")))
    }

    /// The tensor `<name><suffix>` with dtype `dtype`.
    ///
    /// # Errors
    /// When it is missing or has another dtype.
    pub fn get_typed(&self, suffix: &str, dtype: &str) -> Result<(&'m StFile, &'m TensorInfo)> {
        let (f, t) = self.get(suffix)?;
        if t.dtype.name() != dtype {
            return Err(self.error(format!(
                "'{}{suffix}' must be {dtype}, found {}",
                self.name, t.dtype
            )));
        }
        Ok((f, t))
    }

    /// The bytes of `<name><suffix>` with dtype `dtype` (copied out of the map).
    ///
    /// # Errors
    /// As [`Companions::get_typed`].
    pub fn bytes(&self, suffix: &str, dtype: &str) -> Result<Vec<u8>> {
        let (f, t) = self.get_typed(suffix, dtype)?;
        let b = f.bytes(t).to_vec();
        f.release_tensor(t);
        Ok(b)
    }

    /// The values of the F32 tensor `<name><suffix>`.
    ///
    /// # Errors
    /// As [`Companions::get_typed`].
    pub fn f32s(&self, suffix: &str) -> Result<Vec<f32>> {
        Ok(super::chunks::le_f32(&self.bytes(suffix, "F32")?))
    }

    /// Checks that the F32 tensor `<name><suffix>` holds exactly `table` (`-0.0 == +0.0`).
    ///
    /// # Errors
    /// As [`Companions::get_typed`], or naming `what` when the values differ.
    pub fn expect_table(&self, suffix: &str, table: &[f32], what: &str) -> Result<Vec<f32>> {
        let values = self.f32s(suffix)?;
        if values.len() != table.len() || values.iter().zip(table).any(|(a, b)| a != b) {
            return Err(self.error(format!(
                "{}{suffix} is not {what}; custom code tables are not supported",
                self.name
            )));
        }
        Ok(values)
    }

    /// The JSON quant state stored as the U8 tensor `<name><suffix>`.
    ///
    /// # Errors
    /// When it is missing, not U8, or not a JSON object.
    pub fn state(&self, suffix: &str) -> Result<State<'_, 'm>> {
        // bitsandbytes writes the offset of an empty weight as Python's `NaN`, which is not JSON.
        let text = String::from_utf8_lossy(&self.bytes(suffix, "U8")?)
            .replace("\"nested_offset\": NaN", "\"nested_offset\": null");
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| self.error(format!("quant state JSON is malformed: {e}")))?;
        if !json.is_object() {
            return Err(self.error("quant state JSON is not an object"));
        }
        Ok(State { owner: self, json })
    }
}

/// A parsed JSON quant state, with typed field access.
pub struct State<'c, 'm> {
    owner: &'c Companions<'m>,
    json: Value,
}

impl State<'_, '_> {
    /// True when the key is present and `null` (an offset bitsandbytes wrote as `NaN`).
    pub fn is_null(&self, key: &str) -> bool {
        self.json.get(key).is_some_and(Value::is_null)
    }

    /// True when the key is present.
    pub fn has(&self, key: &str) -> bool {
        self.json.get(key).is_some()
    }

    fn field(&self, key: &str) -> Result<&Value> {
        self.json
            .get(key)
            .ok_or_else(|| self.owner.error(format!("quant state JSON lacks '{key}'")))
    }

    /// A string field.
    ///
    /// # Errors
    /// When missing or not a string.
    pub fn str(&self, key: &str) -> Result<&str> {
        self.field(key)?.as_str().ok_or_else(|| {
            self.owner
                .error(format!("quant state '{key}' is not a string"))
        })
    }

    /// A non-negative integer field.
    ///
    /// # Errors
    /// When missing or not a non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.field(key)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| {
                self.owner
                    .error(format!("quant state '{key}' is not a non-negative integer"))
            })
    }

    /// A number field as f64.
    ///
    /// # Errors
    /// When missing or not a number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.field(key)?.as_f64().ok_or_else(|| {
            self.owner
                .error(format!("quant state '{key}' is not a number"))
        })
    }

    /// The `shape` list.
    ///
    /// # Errors
    /// When missing or not a list of non-negative integers.
    pub fn shape(&self) -> Result<Vec<usize>> {
        self.field("shape")?
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| {
                self.owner
                    .error("quant state 'shape' is not a list of integers")
            })
    }

    /// The original weight `dtype` (`float32`, `float16`, `bfloat16`).
    ///
    /// # Errors
    /// When missing or another dtype.
    pub fn dtype(&self) -> Result<DType> {
        let name = self.str("dtype")?;
        [DType::F32, DType::F16, DType::BF16]
            .into_iter()
            .find(|d| torch_dtype_name(*d) == name)
            .ok_or_else(|| {
                self.owner.error(format!(
                    "unsupported dtype '{name}' (float32, float16, bfloat16)"
                ))
            })
    }
}
