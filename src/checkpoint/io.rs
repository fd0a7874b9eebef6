//! Reading safetensors files with clear errors, and writing any output atomically (temporary
//! file in the same folder, then rename), so a failure never leaves a partial output behind.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};

use crate::error::{Error, Result};

/// A tensor held in memory, in any safetensors dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor {
    /// Safetensors dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: Vec<u8>,
}

impl safetensors::View for &RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// A tensor borrowed from a parsed file.
#[derive(Clone, Debug)]
pub struct TensorRef<'a> {
    /// Safetensors dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes inside the file buffer.
    pub data: &'a [u8],
}

/// All tensors of a parsed file, by name (sorted).
pub fn index<'a>(st: &SafeTensors<'a>) -> BTreeMap<String, TensorRef<'a>> {
    st.tensors()
        .into_iter()
        .map(|(name, v)| (name, TensorRef { dtype: v.dtype(), shape: v.shape().to_vec(), data: v.data() }))
        .collect()
}

/// Reads a whole file.
///
/// # Errors
/// [`Error::Io`] naming the file (missing, unreadable, a directory).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    if path.is_dir() {
        return Err(Error::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other("is a directory, not a file"),
        });
    }
    std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Parses the safetensors header of `bytes` (read from `path`) and checks every tensor's offsets.
///
/// # Errors
/// [`Error::Safetensors`] for a truncated file, a corrupt or oversized header, or offsets that do
/// not fit the file.
pub fn parse<'a>(bytes: &'a [u8], path: &Path) -> Result<(SafeTensors<'a>, Option<HashMap<String, String>>)> {
    let err = |e: SafeTensorError| Error::Safetensors { path: path.to_path_buf(), message: describe(e) };
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(err)?;
    let st = SafeTensors::deserialize(bytes).map_err(err)?;
    Ok((st, meta.metadata().clone()))
}

fn describe(e: SafeTensorError) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => "file is shorter than the 8-byte header length (truncated?)".into(),
        SafeTensorError::InvalidHeaderLength => "header length points past the end of the file (truncated?)".into(),
        SafeTensorError::HeaderTooLarge => "header length is implausibly large (corrupt?)".into(),
        SafeTensorError::InvalidHeader | SafeTensorError::InvalidHeaderStart => "header is not UTF-8 JSON (corrupt?)".into(),
        SafeTensorError::InvalidHeaderDeserialization | SafeTensorError::JsonError(_) => "header JSON is malformed".into(),
        SafeTensorError::InvalidOffset(name) => format!("tensor '{name}' has data offsets outside the file or overlapping others"),
        SafeTensorError::MetadataIncompleteBuffer => "tensor data does not cover the file exactly (truncated or trailing bytes)".into(),
        SafeTensorError::TensorInvalidInfo => "a tensor's shape and dtype do not match its byte range".into(),
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows".into(),
        other => format!("{other:?}"),
    }
}

/// Serializes `tensors` (in the given order; safetensors sorts them itself) with `metadata`.
///
/// # Errors
/// [`Error::Safetensors`] if the tensors are inconsistent (a bug, reported rather than panicking).
pub fn serialize(tensors: &[(String, RawTensor)], metadata: &Option<HashMap<String, String>>, path: &Path) -> Result<Vec<u8>> {
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), metadata)
        .map_err(|e| Error::Safetensors { path: path.to_path_buf(), message: describe(e) })
}

/// Writes `bytes` to `path` atomically: a temporary file next to it, flushed, then renamed.
///
/// # Errors
/// [`Error::Io`] naming the path; the temporary file is removed on failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| Error::Usage(format!("{}: not a file path", path.display())))?;
    let tmp = dir.join(format!(".{}.{}.tmp", file_name.to_string_lossy(), std::process::id()));
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// True when `a` and `b` name the same existing file (or the same path when `b` does not exist).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
