//! Where outputs are written: a temporary file or folder beside the output, renamed into place
//! only when everything is written, so a failure, Ctrl-C or SIGTERM never leaves a partial output.
//!
//! - Runs writing into one folder are serialized: each holds an exclusive `flock` on the output's
//!   parent folder while it writes (a second run waits, saying so).
//! - Every temporary file or folder (`.qforge-<pid>-<n>.tmp`, `.qforge-<pid>-<n>.tmpdir`) is
//!   locked by its writer while it exists; one that is not locked is the leftover of a killed run
//!   and is removed by the next run writing into that folder ([`remove_stale_temps`]).
//! - An existing output folder is only replaced with `--overwrite`, by an atomic exchange
//!   (`renameat2(RENAME_EXCHANGE)`), then the old folder is removed.

use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::io::{self as ckio, track};
use crate::error::{Error, Result};

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The folder `path` is in (`.` for a bare name).
pub fn parent_of(path: &Path) -> PathBuf {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Refuses `-` (stdout) as an output.
///
/// # Errors
/// [`Error::Usage`] for `-`.
pub fn refuse_stdout(path: &Path) -> Result<()> {
    if path.as_os_str() == "-" {
        return Err(Error::Usage(
            "-o -: writing to stdout is not supported (a checkpoint is written in place and \
             renamed when complete); give a file or folder"
                .into(),
        ));
    }
    Ok(())
}

/// An exclusive lock on a folder, held while a run writes into it.
pub struct FolderLock {
    _file: File,
}

/// Locks `dir` for writing (waiting, with a message, while another run holds it), then removes
/// the stale temporary outputs of killed runs in it.
///
/// # Errors
/// [`Error::Io`] when the folder cannot be opened or locked; [`Error::Usage`] when it does not
/// exist.
pub fn lock_folder(dir: &Path) -> Result<FolderLock> {
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "output folder {} does not exist",
            dir.display()
        )));
    }
    let file = File::open(dir).map_err(io(dir))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!(
                "waiting for another qforge run writing into {}",
                dir.display()
            );
            file.lock().map_err(io(dir))?;
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(dir)(e)),
    }
    remove_stale_temps(dir);
    Ok(FolderLock { _file: file })
}

/// Removes the temporary outputs in `dir` that no live process holds (leftovers of a killed run);
/// returns how many were removed.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(".qforge-") && (name.ends_with(".tmp") || name.ends_with(".tmpdir")))
        {
            continue;
        }
        let path = e.path();
        let Ok(f) = File::open(&path) else { continue };
        if f.try_lock().is_ok() {
            let gone = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if gone.is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary name in `dir` with `suffix` (`tmp` or `tmpdir`).
pub fn temp_name(dir: &Path, suffix: &str) -> PathBuf {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".qforge-{}-{n}.{suffix}", std::process::id()))
}

/// A temporary file (its writer locks it), renamed into place by [`TempFile::commit`] or removed
/// when dropped.
pub struct TempFile {
    /// Where it is being written.
    pub path: PathBuf,
}

impl TempFile {
    /// A new temporary file name in `dir`, registered for removal on a signal.
    pub fn new(dir: &Path) -> TempFile {
        let path = temp_name(dir, "tmp");
        track(&path, true);
        TempFile { path }
    }

    /// Renames it to `target` (under the pending-temps lock, see [`ckio::pending`]).
    ///
    /// # Errors
    /// [`Error::Io`] naming the target.
    pub fn commit(mut self, target: &Path) -> Result<()> {
        let mut pending = ckio::pending();
        std::fs::rename(&self.path, target).map_err(io(target))?;
        pending.retain(|p| p != &self.path);
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
            track(&self.path, false);
        }
    }
}

/// An output folder being written: a locked temporary folder beside `target`.
pub struct OutFolder {
    /// The temporary folder files are written into.
    pub temp: PathBuf,
    /// The final folder.
    pub target: PathBuf,
    overwrite: bool,
    lock: Option<File>,
    _folder_lock: FolderLock,
}

impl OutFolder {
    /// Prepares output folder `target` while the caller holds `folder_lock`, the lock of its
    /// parent ([`lock_folder`]): `target` must not exist unless `overwrite` (and then must be a
    /// folder).
    ///
    /// # Errors
    /// [`Error::Usage`] for `-`, an existing output without `overwrite`, or a non-folder at
    /// `target`; [`Error::Io`] for a folder that cannot be created.
    pub fn prepare(target: &Path, overwrite: bool, folder_lock: FolderLock) -> Result<OutFolder> {
        refuse_stdout(target)?;
        let parent = parent_of(target);
        match std::fs::symlink_metadata(target) {
            Ok(m) if !m.is_dir() => {
                return Err(Error::Usage(format!(
                    "output {} exists and is not a folder; refusing to replace it",
                    target.display()
                )))
            }
            Ok(_) if !overwrite => {
                return Err(Error::Usage(format!(
                    "output folder {} already exists; pass --overwrite to replace it",
                    target.display()
                )))
            }
            _ => {}
        }
        let temp = temp_name(&parent, "tmpdir");
        track(&temp, true);
        if let Err(e) = std::fs::create_dir(&temp) {
            track(&temp, false);
            return Err(io(&temp)(e));
        }
        let lock = File::open(&temp).ok();
        if let Some(f) = &lock {
            let _ = f.try_lock();
        }
        Ok(OutFolder {
            temp,
            target: target.to_path_buf(),
            overwrite,
            lock,
            _folder_lock: folder_lock,
        })
    }

    /// Moves the finished folder into place (exchanging it with an existing one under
    /// `--overwrite`, whose old content is then removed).
    ///
    /// # Errors
    /// [`Error::Io`] naming the target.
    pub fn commit(mut self) -> Result<()> {
        let mut pending = ckio::pending();
        let exists = std::fs::symlink_metadata(&self.target).is_ok();
        if exists && self.overwrite {
            exchange(&self.temp, &self.target).map_err(io(&self.target))?;
            // The temporary path now holds the old folder: still pending, removed by drop.
            drop(pending);
            self.lock = None;
            return Ok(());
        }
        std::fs::rename(&self.temp, &self.target).map_err(io(&self.target))?;
        pending.retain(|p| p != &self.temp);
        self.lock = None;
        self.temp = PathBuf::new();
        Ok(())
    }
}

impl Drop for OutFolder {
    fn drop(&mut self) {
        if !self.temp.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.temp);
            track(&self.temp, false);
        }
    }
}

/// Atomically exchanges two paths (Linux `renameat2(RENAME_EXCHANGE)`); where the filesystem
/// does not support it, renames `b` aside, `a` to `b`, and the old `b` to `a`.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let ca = CString::new(a.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let cb = CString::new(b.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: two valid NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(err);
    }
    let aside = temp_name(&parent_of(b), "tmpdir");
    std::fs::rename(b, &aside)?;
    std::fs::rename(a, b)?;
    std::fs::rename(&aside, a)
}

/// File names of the model weights that are never copied beside a converted checkpoint.
fn is_weights(name: &str) -> bool {
    let ext = name.rsplit('.').next().unwrap_or("");
    matches!(
        ext,
        "safetensors"
            | "bin"
            | "pt"
            | "pth"
            | "ckpt"
            | "h5"
            | "msgpack"
            | "gguf"
            | "pkl"
            | "pickle"
    ) || name.ends_with(".index.json")
        || name.starts_with(".qforge-")
}

/// Copies the other files of model folder `from` (tokenizer, generation config, README, ...,
/// recursively, hidden entries and weight files left out) into `to`; returns how many.
///
/// # Errors
/// [`Error::Io`] naming the file.
pub fn copy_companions(from: &Path, to: &Path, skip: &[PathBuf]) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(from).map_err(io(from))?.flatten() {
        let name = e.file_name();
        let name_s = name.to_string_lossy();
        let path = e.path();
        if name_s.starts_with('.') || is_weights(&name_s) || skip.contains(&path) {
            continue;
        }
        let dst = to.join(&name);
        if path.is_dir() {
            std::fs::create_dir_all(&dst).map_err(io(&dst))?;
            n += copy_companions(&path, &dst, skip)?;
        } else if path.is_file() {
            std::fs::copy(&path, &dst).map_err(io(&path))?;
            n += 1;
        }
    }
    Ok(n)
}
