//! Tensors processed in chunks: a weight is read from the memory map a chunk of elements at a
//! time (in the row-major order of `[out, in]`, transposing a GPT-2 `Conv1D` `[in, out]` weight on
//! the fly), each chunk is one launch of a host op, and its pages are released after use. Chunks
//! start on quantization-block boundaries (and nested-block boundaries for double quantization),
//! so the chunked result is the one-launch result bit for bit, and tensors of 2^31 elements or
//! more, which one launch cannot index, are handled too.

use qforge_ir::DType;
use qforge_runtime::HostTensor;

use super::st_read::{StFile, TensorInfo};
use crate::error::{Error, Result};

/// Default elements per chunk: 4 Mi (16 MiB of f32), a multiple of every block size times 256.
pub const DEFAULT_CHUNK: usize = 1 << 22;

/// The chunk length for `requested` elements (0: [`DEFAULT_CHUNK`]) rounded up to a multiple of
/// `unit` (a block size, or block size x 256 with double quantization), at least one unit.
pub fn chunk_len(requested: usize, unit: usize) -> usize {
    let r = if requested == 0 {
        DEFAULT_CHUNK
    } else {
        requested
    };
    r.div_ceil(unit).max(1) * unit
}

/// Reads a float weight chunk by chunk, in `[out, in]` row-major order.
pub struct Reader<'a> {
    file: &'a StFile,
    info: &'a TensorInfo,
    /// The weight's float dtype.
    pub dtype: DType,
    /// `[in, out]` of a `Conv1D` weight read transposed.
    transpose: Option<(usize, usize)>,
}

impl<'a> Reader<'a> {
    /// A reader of `info` (a 2-D float tensor of `file`); `transpose` reads a `Conv1D` weight
    /// `[in, out]` as `[out, in]`.
    pub fn new(file: &'a StFile, info: &'a TensorInfo, dtype: DType, transpose: bool) -> Self {
        let transpose = transpose.then(|| (info.shape[0], info.shape[1]));
        Reader {
            file,
            info,
            dtype,
            transpose,
        }
    }

    /// Elements of the weight.
    pub fn numel(&self) -> usize {
        self.info.numel()
    }

    /// The shape as quantized: `[out, in]`.
    pub fn shape(&self) -> Vec<usize> {
        match self.transpose {
            Some((i, o)) => vec![o, i],
            None => self.info.shape.clone(),
        }
    }

    /// Elements `[start, start + len)` as a 1-D tensor of the weight's dtype.
    ///
    /// # Errors
    /// [`Error::Runtime`] only for a bug (bytes not matching the shape).
    pub fn read(&self, start: usize, len: usize) -> Result<HostTensor> {
        let es = self.dtype.size_bytes();
        let bytes = match self.transpose {
            None => self.file.slice(self.info, start * es, len * es).to_vec(),
            Some((rows_in, cols_in)) => {
                // Output element k = (o, i) of [out, in] is input element (i, o) of [in, out].
                let src = self.file.bytes(self.info);
                let mut out = Vec::with_capacity(len * es);
                for k in start..start + len {
                    let (o, i) = (k / rows_in, k % rows_in);
                    let at = (i * cols_in + o) * es;
                    out.extend_from_slice(&src[at..at + es]);
                }
                out
            }
        };
        Ok(HostTensor::new(self.dtype, vec![len], bytes)?)
    }

    /// Releases the pages of elements `[start, start + len)` (all pages of a transposed weight,
    /// whose reads stride over the whole tensor, once the last chunk is done).
    pub fn release(&self, start: usize, len: usize) {
        let es = self.dtype.size_bytes();
        match self.transpose {
            None => self.file.release_part(self.info, start * es, len * es),
            Some(_) if start + len >= self.numel() => self.file.release_tensor(self.info),
            Some(_) => {}
        }
    }
}

/// RMSE and max absolute error, accumulated chunk by chunk in the same order as one pass over the
/// whole weight: sums in f64 over the elements whose original value is finite; a finite weight
/// that comes back NaN or inf makes both figures NaN or inf.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrStats {
    sq: f64,
    max: f64,
    n: usize,
}

impl ErrStats {
    /// Adds a chunk.
    pub fn add(&mut self, original: &[f32], restored: &[f32]) {
        for (&a, &b) in original.iter().zip(restored) {
            if a.is_finite() {
                let d = (a as f64 - b as f64).abs();
                self.sq += d * d;
                self.max = if d.is_nan() || d > self.max {
                    d
                } else {
                    self.max
                };
                self.n += 1;
            }
        }
    }

    /// `(rmse, max_abs_err)`.
    pub fn finish(&self) -> (f64, f64) {
        ((self.sq / self.n.max(1) as f64).sqrt(), self.max)
    }
}

/// Refuses a chunk holding NaN or inf (unless allowed); `start` is the chunk's first element.
///
/// # Errors
/// [`Error::NonFinite`] naming the file, tensor and flat index.
pub fn check_finite(
    values: &[f32],
    start: usize,
    allow: bool,
    path: &std::path::Path,
    tensor: &str,
) -> Result<()> {
    if allow {
        return Ok(());
    }
    if let Some((i, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(Error::NonFinite {
            path: path.to_path_buf(),
            tensor: tensor.to_string(),
            index: start + i,
            value,
        });
    }
    Ok(())
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// f32 values of little-endian bytes.
pub fn le_f32(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_lengths_are_whole_units() {
        assert_eq!(chunk_len(0, 64), DEFAULT_CHUNK);
        assert_eq!(chunk_len(100, 64), 128);
        assert_eq!(chunk_len(1, 16384), 16384);
        assert_eq!(DEFAULT_CHUNK % (4096 * 256), 0);
    }
}
