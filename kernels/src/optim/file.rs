//! Saving and loading optimizer state files. Saving is atomic, as the root crate's
//! `checkpoint::io` does it: the bytes go to a temporary file in the target's folder, are
//! flushed to disk, and only then renamed over the target, so a failure never leaves a partial
//! file (the temporary file is removed on failure).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::Optimizer;
use qforge_runtime::{Error, Result};

fn io_err(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Invalid(format!(
        "optimizer state file {}: {what}: {e}",
        path.display()
    ))
}

/// Writes `bytes` to `path` atomically (temporary file + rename; a symlink is written through).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(path).map_err(|e| io_err(path, "dangling symlink", e))?
        }
        _ => path.to_path_buf(),
    };
    if let Ok(m) = std::fs::metadata(&target) {
        if !m.is_file() {
            return Err(io_err(path, "cannot replace", "not a regular file"));
        }
    }
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = target
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .ok_or_else(|| io_err(path, "cannot write", "no file name"))?;
    // Unique per process and per call, so concurrent saves (threads) never share a temp file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{file_name}.qforge-{}-{n}.tmp",
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path, "cannot write", e));
    }
    Ok(())
}

impl Optimizer {
    /// Writes [`Optimizer::state_dict`] to `path` atomically.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the path when it cannot be written (missing folder, a
    /// directory or other non-regular file in the way, I/O failure).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        write_atomic(path.as_ref(), &self.state_dict()?)
    }

    /// Reads a file written by [`Optimizer::save`] into this optimizer
    /// ([`Optimizer::load_state_dict`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the path when it cannot be read; as
    /// [`Optimizer::load_state_dict`], with the path, for its contents.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| io_err(path, "cannot read", e))?;
        if !meta.is_file() {
            return Err(io_err(path, "cannot read", "not a regular file"));
        }
        let bytes = std::fs::read(path).map_err(|e| io_err(path, "cannot read", e))?;
        self.load_state_dict(&bytes)
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
    }
}
