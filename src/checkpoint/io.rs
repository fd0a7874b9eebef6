//! Reading safetensors files with clear errors, and writing any output atomically (temporary
//! file in the same folder, then rename), so a failure never leaves a partial output behind.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};

use crate::error::{Error, Result};

/// A tensor to write, in any safetensors dtype; its bytes are borrowed from the input file when
/// it is copied unchanged, owned when it was computed.
#[derive(Clone, Debug, PartialEq)]
pub struct RawTensor<'a> {
    /// Safetensors dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: std::borrow::Cow<'a, [u8]>,
}

impl safetensors::View for &RawTensor<'_> {
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
        .map(|(name, v)| {
            (
                name,
                TensorRef {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data(),
                },
            )
        })
        .collect()
}

/// Reads a whole regular file (symlinks followed).
///
/// # Errors
/// [`Error::Io`] naming the file: missing, unreadable, a directory, or not a regular file
/// (a device or pipe, which could be endless).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
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
    std::fs::read(path).map_err(io)
}

/// Parses the safetensors header of `bytes` (read from `path`) and checks every tensor's offsets.
///
/// # Errors
/// [`Error::Safetensors`] for a truncated file, a corrupt or oversized header, or offsets that do
/// not fit the file.
pub fn parse<'a>(
    bytes: &'a [u8],
    path: &Path,
) -> Result<(SafeTensors<'a>, Option<HashMap<String, String>>)> {
    let err = |e: SafeTensorError| Error::Safetensors {
        path: path.to_path_buf(),
        message: describe(e),
    };
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(err)?;
    let st = SafeTensors::deserialize(bytes).map_err(err)?;
    Ok((st, meta.metadata().clone()))
}

fn describe(e: SafeTensorError) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => {
            "file is shorter than the 8-byte header length (truncated?)".into()
        }
        SafeTensorError::InvalidHeaderLength => {
            "header length points past the end of the file (truncated?)".into()
        }
        SafeTensorError::HeaderTooLarge => "header length is implausibly large (corrupt?)".into(),
        SafeTensorError::InvalidHeader | SafeTensorError::InvalidHeaderStart => {
            "header is not UTF-8 JSON (corrupt?)".into()
        }
        SafeTensorError::InvalidHeaderDeserialization | SafeTensorError::JsonError(_) => {
            "header JSON is malformed".into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor '{name}' has data offsets outside the file or overlapping others")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "tensor data does not cover the file exactly (truncated or trailing bytes)".into()
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's shape and dtype do not match its byte range".into()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows".into(),
        other => format!("{other:?}"),
    }
}

/// Serializes `tensors` (in the given order; safetensors sorts them itself) with `metadata`.
///
/// # Errors
/// [`Error::Safetensors`] if the tensors are inconsistent (a bug, reported rather than panicking).
pub fn serialize(
    tensors: &[(String, RawTensor<'_>)],
    metadata: &Option<HashMap<String, String>>,
    path: &Path,
) -> Result<Vec<u8>> {
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), metadata).map_err(|e| {
        Error::Safetensors {
            path: path.to_path_buf(),
            message: describe(e),
        }
    })
}

/// Temporary files and folders being written, removed by [`remove_pending_temps`] (the CLI's
/// Ctrl-C / SIGTERM handler) so an interrupted run leaves nothing behind. Renames into place
/// happen while this lock is held, so the handler sees either the temporary output (and removes
/// it) or none.
pub(crate) static PENDING: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The pending list, locked (renames into place are done while holding it).
pub(crate) fn pending() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes every temporary file or folder still being written; returns how many were removed.
pub fn remove_pending_temps() -> usize {
    let pending = std::mem::take(&mut *pending());
    pending
        .iter()
        .filter(|p| {
            if p.is_dir() {
                std::fs::remove_dir_all(p).is_ok()
            } else {
                std::fs::remove_file(p).is_ok()
            }
        })
        .count()
}

/// Adds `path` to (or removes it from) the pending temporary outputs.
pub(crate) fn track(path: &Path, add: bool) {
    let mut pending = pending();
    if add {
        pending.push(path.to_path_buf());
    } else {
        pending.retain(|p| p != path);
    }
}

/// Where an output should go: `path` itself, or the file a symlink at `path` points to.
///
/// # Errors
/// [`Error::Usage`] when the folder is missing, or something other than a regular file (a device,
/// pipe, directory) or a
/// read-only file is already there: it is never replaced.
pub fn output_target(path: &Path) -> Result<PathBuf> {
    let usage = |what: &str| {
        Error::Usage(format!(
            "output {} {what}; refusing to replace it",
            path.display()
        ))
    };
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(path).map_err(|_| usage("is a dangling symlink"))?
        }
        _ => path.to_path_buf(),
    };
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "output folder {} does not exist",
            dir.display()
        )));
    }
    match std::fs::metadata(&target) {
        Ok(m) if m.is_dir() => Err(usage("is a directory")),
        Ok(m) if !m.is_file() => Err(usage("exists and is not a regular file")),
        Ok(m) if m.permissions().readonly() => Err(usage("exists and is read-only")),
        _ => Ok(target),
    }
}

/// Writes every `(path, bytes)` atomically: each to a temporary file in its folder, flushed;
/// only when all are written are they renamed into place (symlinks are written through).
///
/// # Errors
/// [`Error::Usage`] for a target that must not be replaced (see [`output_target`]),
/// [`Error::Io`] naming the path; temporary files are removed on any failure.
pub fn write_files_atomic(files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    let targets = files
        .iter()
        .map(|(p, _)| output_target(p))
        .collect::<Result<Vec<_>>>()?;
    let mut temps: Vec<PathBuf> = Vec::new();
    // Each temporary file stays locked (flock) while it exists, so a later run can tell it from
    // the leftover of a killed one (super::out::remove_stale_temps).
    let mut open_files: Vec<std::fs::File> = Vec::new();
    let cleanup = |temps: &[PathBuf]| {
        for t in temps {
            let _ = std::fs::remove_file(t);
            track(t, false);
        }
    };
    for (i, (target, (_, bytes))) in targets.iter().zip(files).enumerate() {
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Unique per process and per call, so concurrent writes (threads) never share a temp
        // file.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".qforge-{}-{n}-{i}.tmp", std::process::id()));
        track(&tmp, true);
        temps.push(tmp.clone());
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            let _ = f.try_lock();
            f.write_all(bytes)?;
            f.sync_all()?;
            Ok::<_, std::io::Error>(f)
        })();
        match written {
            Ok(f) => open_files.push(f),
            Err(source) => {
                cleanup(&temps);
                return Err(Error::Io {
                    path: target.clone(),
                    source,
                });
            }
        }
    }
    let mut pending = pending();
    for (i, (tmp, target)) in temps.iter().zip(&targets).enumerate() {
        if let Err(source) = std::fs::rename(tmp, target) {
            for t in &temps[i..] {
                let _ = std::fs::remove_file(t);
            }
            pending.retain(|p| !temps.contains(p));
            return Err(Error::Io {
                path: target.clone(),
                source,
            });
        }
        pending.retain(|p| p != tmp);
    }
    drop(open_files);
    Ok(())
}

/// True when `a` and `b` name the same existing file (or the same path when `b` does not exist).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
