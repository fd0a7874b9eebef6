//! Safetensors inputs read through a memory map: the header is parsed and checked here (every
//! error names the file), tensor bytes are borrowed from the map and released after use
//! ([`StFile::release`]), so reading a checkpoint of any size keeps only the part being processed
//! resident. Dtypes are kept by name, so tensors of dtypes that qforge does not compute with
//! (BOOL, integers, F64, F8_*, F4, C64, names newer than this file) are copied through byte for
//! byte.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Advice, Mmap, UncheckedAdvice};
use qforge_ir::DType;
use serde_json::Value;

use crate::error::{Error, Result};

/// The largest header the safetensors crate accepts (100 MB); a longer one is corrupt.
const MAX_HEADER: u64 = 100_000_000;

/// A safetensors dtype, by its name in the header (`"F32"`, `"U8"`, `"F8_E8M0"`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StDtype(pub String);

/// Bits per element of the dtypes the safetensors format defines (as of safetensors 0.6).
const KNOWN_BITS: &[(&str, usize)] = &[
    ("BOOL", 8),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
    ("C64", 64),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
];

impl StDtype {
    /// The dtype named `name`.
    pub fn new(name: &str) -> StDtype {
        StDtype(name.to_string())
    }
    /// `F32`, `F16`, `BF16`, `U8`, `I8` ... of a qforge dtype.
    pub fn of(dtype: DType) -> StDtype {
        StDtype::new(match dtype {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::I32 => "I32",
            DType::U32 => "U32",
        })
    }
    /// The name as written in the header.
    pub fn name(&self) -> &str {
        &self.0
    }
    /// Bits per element, for the dtypes the format defines.
    pub fn bits(&self) -> Option<usize> {
        KNOWN_BITS
            .iter()
            .find(|(n, _)| *n == self.0)
            .map(|(_, b)| *b)
    }
    /// The byte alignment its data needs (1 for sub-byte and unknown dtypes).
    pub fn alignment(&self) -> usize {
        self.bits().map_or(1, |b| (b / 8).max(1))
    }
    /// The float dtype qforge quantizes (`F32`, `F16`, `BF16`), if it is one.
    pub fn float(&self) -> Option<DType> {
        match self.0.as_str() {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            _ => None,
        }
    }
    /// The byte length of `numel` elements, for the dtypes the format defines.
    pub fn bytes_for(&self, numel: usize) -> Option<usize> {
        let bits = self.bits()?;
        numel.checked_mul(bits).map(|b| b.div_ceil(8))
    }
}

impl std::fmt::Display for StDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One tensor of a file: dtype, shape and its byte range inside the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Dtype.
    pub dtype: StDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Start of its bytes, relative to the data section.
    pub begin: usize,
    /// End of its bytes (exclusive), relative to the data section.
    pub end: usize,
}

impl TensorInfo {
    /// Element count (1 for a 0-D tensor).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Byte length.
    pub fn len(&self) -> usize {
        self.end - self.begin
    }
    /// True for a tensor without bytes.
    pub fn is_empty(&self) -> bool {
        self.begin == self.end
    }
}

/// A memory-mapped safetensors file with its parsed header.
pub struct StFile {
    /// The file.
    pub path: PathBuf,
    map: Mmap,
    data_start: usize,
    /// The `__metadata__` entries.
    pub metadata: BTreeMap<String, String>,
    /// Every tensor, by name (sorted).
    pub tensors: BTreeMap<String, TensorInfo>,
}

/// The message for a pickle (`torch.save`) checkpoint.
pub const PICKLE: &str = "pickle checkpoints are not read; convert to safetensors";

/// True when `bytes` (a file's start) look like a `torch.save` zip archive or a raw pickle.
pub fn looks_like_pickle(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || (bytes.len() >= 2 && bytes[0] == 0x80 && bytes[1] <= 5)
}

/// True for the file names of pickle checkpoints (`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`).
pub fn pickle_name(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    matches!(ext, "bin" | "pt" | "pth" | "ckpt" | "pkl" | "pickle")
}

impl StFile {
    /// Opens, maps and checks `path`.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing, unreadable or non-regular file; [`Error::Usage`] with
    /// [`PICKLE`] for a pickle checkpoint; [`Error::Safetensors`] for a truncated file, a corrupt
    /// header, a tensor whose shape and dtype do not match its bytes, or byte ranges that do not
    /// tile the data section exactly.
    pub fn open(path: &Path) -> Result<StFile> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory, not a file")));
        }
        if !meta.is_file() {
            return Err(io(std::io::Error::other(
                "is not a regular file (device, pipe or socket)",
            )));
        }
        let file = File::open(path).map_err(io)?;
        let bad = |message: String| Error::Safetensors {
            path: path.to_path_buf(),
            message,
        };
        let len = meta.len();
        if len < 8 {
            if pickle_name(path) {
                return Err(Error::Usage(format!("{}: {PICKLE}", path.display())));
            }
            return Err(bad(
                "file is shorter than the 8-byte header length (truncated?)".into(),
            ));
        }
        // SAFETY: the map is read-only; a file changed by another process while qforge reads it
        // gives wrong bytes (as a read() would), never memory unsafety in safe code here.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let _ = map.advise(Advice::Sequential);
        let n = u64::from_le_bytes(map[..8].try_into().expect("8 bytes"));
        let plausible = n <= MAX_HEADER && n <= len - 8 && map.get(8) == Some(&b'{');
        if !plausible && (looks_like_pickle(&map) || pickle_name(path)) {
            return Err(Error::Usage(format!("{}: {PICKLE}", path.display())));
        }
        if n > MAX_HEADER {
            return Err(bad("header length is implausibly large (corrupt?)".into()));
        }
        if n > len - 8 {
            return Err(bad(
                "header length points past the end of the file (truncated?)".into(),
            ));
        }
        let header = &map[8..8 + n as usize];
        let (metadata, tensors) = parse_header(header, (len - 8 - n) as usize).map_err(bad)?;
        let file = StFile {
            path: path.to_path_buf(),
            map,
            data_start: 8 + n as usize,
            metadata,
            tensors,
        };
        file.release(0, file.data_start);
        Ok(file)
    }

    /// The bytes of tensor `info` (borrowed from the map).
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.map[self.data_start + info.begin..self.data_start + info.end]
    }

    /// `len` bytes of tensor `info` from byte `offset` of the tensor.
    pub fn slice(&self, info: &TensorInfo, offset: usize, len: usize) -> &[u8] {
        let start = self.data_start + info.begin + offset;
        &self.map[start..start + len]
    }

    /// Drops the pages of bytes `[start, start + len)` of the file from this process's resident
    /// set (they stay in the page cache); called after a part of a tensor has been used, so the
    /// resident set does not grow with the file.
    pub fn release(&self, start: usize, len: usize) {
        let page = 4096;
        let from = start / page * page;
        let to = (start + len).min(self.map.len());
        if to > from {
            // SAFETY: MADV_DONTNEED on a read-only shared file mapping only drops the page table
            // entries: a later read faults the same file bytes back in, so no slice borrowed from
            // the map ever sees different bytes.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(UncheckedAdvice::DontNeed, from, to - from)
            };
        }
    }

    /// Releases the pages of tensor `info` (see [`StFile::release`]).
    pub fn release_tensor(&self, info: &TensorInfo) {
        self.release(self.data_start + info.begin, info.len());
    }

    /// Releases the pages of `len` bytes of tensor `info` from byte `offset` of the tensor.
    pub fn release_part(&self, info: &TensorInfo, offset: usize, len: usize) {
        self.release(self.data_start + info.begin + offset, len);
    }

    /// Size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }
}

type Parsed = (BTreeMap<String, String>, BTreeMap<String, TensorInfo>);

/// Parses and checks a header: every tensor's shape and dtype match its byte range (for the dtypes
/// the format defines), and the ranges tile the `data_len` data bytes without gaps or overlaps.
fn parse_header(header: &[u8], data_len: usize) -> std::result::Result<Parsed, String> {
    let text = std::str::from_utf8(header).map_err(|_| "header is not UTF-8 JSON (corrupt?)")?;
    if !text.starts_with('{') {
        return Err("header is not UTF-8 JSON (corrupt?)".into());
    }
    let json: serde_json::Map<String, Value> =
        serde_json::from_str(text).map_err(|e| format!("header JSON is malformed: {e}"))?;
    let mut metadata = BTreeMap::new();
    let mut tensors = BTreeMap::new();
    for (name, v) in json {
        if name == "__metadata__" {
            let map = v
                .as_object()
                .ok_or("__metadata__ is not a JSON object of strings")?;
            for (k, v) in map {
                let v = v
                    .as_str()
                    .ok_or_else(|| format!("__metadata__ entry '{k}' is not a string"))?;
                metadata.insert(k.clone(), v.to_string());
            }
            continue;
        }
        let bad = |what: &str| format!("tensor '{name}': {what}");
        let dtype = v
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("has no string 'dtype'"))?;
        if dtype.is_empty() || !dtype.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad(&format!("dtype '{dtype}' is not a dtype name")));
        }
        let shape = v
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect::<Option<Vec<usize>>>()
            })
            .ok_or_else(|| bad("'shape' is not a list of non-negative integers"))?;
        let offsets = v
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .and_then(|a| {
                Some((
                    usize::try_from(a[0].as_u64()?).ok()?,
                    usize::try_from(a[1].as_u64()?).ok()?,
                ))
            })
            .ok_or_else(|| bad("'data_offsets' is not a pair of non-negative integers"))?;
        let (begin, end) = offsets;
        if begin > end || end > data_len {
            return Err(format!(
                "tensor '{name}' has data offsets outside the file or overlapping others"
            ));
        }
        let dtype = StDtype::new(dtype);
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(&format!("shape {shape:?} overflows")))?;
        if let Some(want) = dtype.bytes_for(numel) {
            if want != end - begin {
                return Err(bad(&format!(
                    "a {dtype} tensor of shape {shape:?} needs {want} bytes but its data \
                     offsets hold {} (shape and dtype do not match its byte range)",
                    end - begin
                )));
            }
        }
        tensors.insert(
            name,
            TensorInfo {
                dtype,
                shape,
                begin,
                end,
            },
        );
    }
    let mut ranges: Vec<(&String, usize, usize)> =
        tensors.iter().map(|(n, t)| (n, t.begin, t.end)).collect();
    ranges.sort_by_key(|&(_, b, e)| (b, e));
    let mut at = 0usize;
    for (name, b, e) in ranges {
        if b != at {
            return Err(if b < at {
                format!("tensor '{name}' has data offsets outside the file or overlapping others")
            } else {
                format!("the bytes before tensor '{name}' belong to no tensor (a gap in the data)")
            });
        }
        at = e;
    }
    if at != data_len {
        return Err(
            "tensor data does not cover the file exactly (truncated or trailing bytes)".into(),
        );
    }
    Ok((metadata, tensors))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(json: &str, data: usize) -> std::result::Result<Parsed, String> {
        parse_header(json.as_bytes(), data)
    }

    #[test]
    fn unknown_and_new_dtypes_parse() {
        let (_, t) = header(
            r#"{"a":{"dtype":"F8_E8M0","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"F4","shape":[4],"data_offsets":[4,6]},"c":{"dtype":"Q9_FUTURE","shape":[3],"data_offsets":[6,9]}}"#,
            9,
        )
        .unwrap();
        assert_eq!(t["b"].dtype.bits(), Some(4));
        assert_eq!(t["c"].dtype.bits(), None);
        assert_eq!(t["c"].len(), 3);
    }

    #[test]
    fn gaps_overlaps_and_size_mismatches_are_errors() {
        let e = header(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[1],"data_offsets":[9,10]}}"#,
            10,
        )
        .unwrap_err();
        assert!(e.contains("gap"), "{e}");
        let e = header(
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
            8,
        )
        .unwrap_err();
        assert!(e.contains("needs 12 bytes"), "{e}");
        let e = header(
            r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
            3,
        )
        .unwrap_err();
        assert!(e.contains("does not cover"), "{e}");
    }
}
