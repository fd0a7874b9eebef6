//! The disk cache of the LLVM JIT's objects (feature `llvm`): optimizing and compiling a kernel
//! takes 10-500 ms, loading its object a fraction of a millisecond, so a program that runs the
//! same kernels again (a second `qforge finetune`, the test suite) skips LLVM.
//!
//! * **Where:** `$QFORGE_JIT_CACHE` when set (`off` turns the cache off), else
//!   `$XDG_CACHE_HOME/qforge/llvm-jit`, else `$HOME/.cache/qforge/llvm-jit`; neither set: no cache.
//! * **Key:** SHA-256 of everything the object depends on: this format's version, the qforge
//!   runtime's version, the LLVM major version, the target triple, CPU name and feature string,
//!   the optimization pipeline, the entry symbol and the kernel's LLVM IR text. Objects are
//!   therefore never shared between CPUs with different features. (LLVM bug-fix releases of one
//!   major version share entries: the IR carries no fast-math flags, so any of them computes the
//!   same bits.)
//! * **Entry file** `<key hex>.o`: the magic [`MAGIC`], the SHA-256 of the key and the object,
//!   the object. A file that is not a regular file or is over 64 MiB, is short, has another
//!   magic or whose key and object do not match its checksum (damaged, or another key's entry)
//!   is a miss (and is rewritten).
//! * **Trust:** a loaded object is native code run in the process, so whoever can write the
//!   folder can run code in every process that uses it. The folder is created readable and
//!   writable by its owner only (mode 0700); a folder named in `QFORGE_JIT_CACHE` must be kept
//!   private too. An entry with a valid checksum whose object LLVM cannot parse aborts the
//!   process (LLVM's fatal error); only a buggy or hostile writer makes one.
//! * **Writes** go to a unique temporary file in the cache folder, renamed over the entry, so a
//!   reader never sees a partial object and concurrent processes writing one key are harmless.
//!   Failing to write (a read-only or full disk) only loses the cache, never a kernel.
//! * **Size:** once per process, when the entries exceed [`MAX_BYTES`], the least recently used
//!   (by modification time, refreshed on every hit) are deleted down to 3/4 of it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// The first bytes of an entry file (format version 2: the checksum covers the key).
const MAGIC: &[u8; 16] = b"qforge-llvm-obj2";

/// The cache's size bound, bytes.
pub(super) const MAX_BYTES: u64 = 512 << 20;

/// The largest entry file read, bytes (the largest library kernel's object is under 1 MiB).
const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// A cache folder.
#[derive(Debug, Clone)]
pub(super) struct JitCache {
    dir: PathBuf,
}

/// What an object's key is computed from, besides the IR text.
pub(super) struct KeyParts<'a> {
    pub triple: &'a str,
    pub cpu: &'a str,
    pub features: &'a str,
    pub pipeline: &'a str,
    pub entry: &'a str,
}

/// The cache key (64 lowercase hex digits) of the object of `text` compiled as `parts` say.
pub(super) fn key(parts: &KeyParts<'_>, text: &str) -> String {
    let mut h = Sha256::new();
    for field in [
        std::str::from_utf8(MAGIC).unwrap_or_default(),
        env!("CARGO_PKG_VERSION"),
        "llvm14",
        parts.triple,
        parts.cpu,
        parts.features,
        parts.pipeline,
        parts.entry,
        text,
    ] {
        // Length-prefixed, so that no two different field lists hash the same bytes.
        h.update((field.len() as u64).to_le_bytes());
        h.update(field.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl JitCache {
    /// The cache the environment names (module docs), or `None` when it is off or no folder
    /// can be named.
    pub(super) fn from_env() -> Option<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        // As the XDG spec says, a relative XDG_CACHE_HOME (or HOME) is ignored.
        let absolute = |name: &str| var(name).map(PathBuf::from).filter(|p| p.is_absolute());
        let dir = match var("QFORGE_JIT_CACHE") {
            Some(v)
                if v.to_str()
                    .is_some_and(|s| s.trim().eq_ignore_ascii_case("off")) =>
            {
                return None
            }
            Some(v) => PathBuf::from(v),
            None => match (absolute("XDG_CACHE_HOME"), absolute("HOME")) {
                (Some(x), _) => x.join("qforge").join("llvm-jit"),
                (None, Some(h)) => h.join(".cache").join("qforge").join("llvm-jit"),
                (None, None) => return None,
            },
        };
        Some(JitCache { dir })
    }

    /// A cache in `dir` (created on the first write).
    pub(super) fn at(dir: &Path) -> Self {
        JitCache {
            dir: dir.to_path_buf(),
        }
    }

    fn entry(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.o"))
    }

    /// The object stored under `key`, when there is an intact one; refreshes its time. Only a
    /// regular file of at most [`MAX_ENTRY_BYTES`] is read (a FIFO would block the read).
    pub(super) fn get(&self, key: &str) -> Option<Vec<u8>> {
        let path = self.entry(key);
        let meta = fs::metadata(&path).ok()?;
        if !meta.is_file() || meta.len() > MAX_ENTRY_BYTES {
            return None;
        }
        let bytes = fs::read(&path).ok()?;
        let object = intact_object(key, &bytes)?;
        // Best effort: the time orders eviction only.
        if let Ok(f) = fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(object.to_vec())
    }

    /// Stores `object` under `key` (temporary file, then rename). Errors are ignored: a cache
    /// that cannot be written is a slower start, not a failure.
    pub(super) fn put(&self, key: &str, object: &[u8]) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut dir = fs::DirBuilder::new();
        dir.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut dir, 0o700);
        if dir.create(&self.dir).is_err() {
            return;
        }
        let tmp = self.dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let written = fs::File::create(&tmp).and_then(|mut f| {
            f.write_all(MAGIC)?;
            f.write_all(&checksum(key, object))?;
            f.write_all(object)
        });
        if written.is_err() || fs::rename(&tmp, self.entry(key)).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }

    /// Deletes the least recently used entries while they hold more than `max_bytes`, down to
    /// 3/4 of it. Errors (a vanished file, a folder that does not exist) are ignored.
    pub(super) fn prune(&self, max_bytes: u64) {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = dir
            .filter_map(|e| {
                let e = e.ok()?;
                let path = e.path();
                // Only the cache's own entries: 64 hex digits and `.o`.
                let stem = path.file_name()?.to_str()?.strip_suffix(".o")?;
                (stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), path))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        if total <= max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= max_bytes / 4 * 3 {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// The checksum of an entry: the SHA-256 of its key and its object.
fn checksum(key: &str, object: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update(object);
    h.finalize().into()
}

/// The object of the entry file of `key` with bytes `bytes`, when the magic and the checksum
/// match.
fn intact_object<'a>(key: &str, bytes: &'a [u8]) -> Option<&'a [u8]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    if rest.len() < 32 {
        return None;
    }
    let (sum, object) = rest.split_at(32);
    (checksum(key, object) == sum).then_some(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> KeyParts<'static> {
        KeyParts {
            triple: "x86_64-unknown-linux-gnu",
            cpu: "znver3",
            features: "+avx2",
            pipeline: "default<O3>",
            entry: "qforge_kernel",
        }
    }

    #[test]
    fn keys_differ_in_every_part_and_are_unambiguous() {
        let base = key(&parts(), "define void @f()");
        assert_eq!(base.len(), 64);
        assert_eq!(base, key(&parts(), "define void @f()"));
        let mut other = parts();
        other.features = "+avx2,+avx512f";
        assert_ne!(base, key(&other, "define void @f()"));
        let mut other = parts();
        other.cpu = "znver4";
        assert_ne!(base, key(&other, "define void @f()"));
        assert_ne!(base, key(&parts(), "define void @g()"));
        // Moving bytes between fields changes the key (length prefixes).
        let mut a = parts();
        a.entry = "qforge_kernelx";
        let b = parts();
        assert_ne!(key(&a, "y"), key(&b, "xy"));
    }

    #[test]
    fn stores_reads_back_and_refuses_damaged_entries() {
        let dir = tempfile::tempdir().unwrap();
        let cache = JitCache::at(&dir.path().join("nested"));
        let k = key(&parts(), "text");
        assert_eq!(cache.get(&k), None);
        cache.put(&k, b"\x7fELF object bytes");
        assert_eq!(cache.get(&k).as_deref(), Some(&b"\x7fELF object bytes"[..]));
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path().join("nested"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from(format!("{k}.o"))]);
        // One flipped bit of the object, a truncated file, another magic: misses.
        let path = dir.path().join("nested").join(format!("{k}.o"));
        let good = fs::read(&path).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        fs::write(&path, &flipped).unwrap();
        assert_eq!(cache.get(&k), None);
        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert_eq!(cache.get(&k), None);
        fs::write(&path, &good[..20]).unwrap();
        assert_eq!(cache.get(&k), None);
        let mut magic = good.clone();
        magic[0] ^= 1;
        fs::write(&path, &magic).unwrap();
        assert_eq!(cache.get(&k), None);
        // Rewriting repairs it.
        cache.put(&k, b"\x7fELF object bytes");
        assert_eq!(cache.get(&k).as_deref(), Some(&b"\x7fELF object bytes"[..]));
        // An intact entry under another key's name is a miss: the checksum covers the key.
        let other = key(&parts(), "other text");
        fs::copy(&path, dir.path().join("nested").join(format!("{other}.o"))).unwrap();
        assert_eq!(cache.get(&other), None);
        // A directory or a FIFO under the entry's name is a miss, not an error or a hang.
        fs::remove_file(&path).unwrap();
        fs::create_dir(&path).unwrap();
        assert_eq!(cache.get(&k), None);
        cache.put(&k, b"object");
        fs::remove_dir(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {path:?}");
        assert_eq!(cache.get(&k), None);
    }

    #[test]
    fn pruning_deletes_the_least_recently_used_entries() {
        let dir = tempfile::tempdir().unwrap();
        let cache = JitCache::at(dir.path());
        let keys: Vec<String> = (0..4).map(|i| key(&parts(), &i.to_string())).collect();
        // A file of the user's that only looks like an entry, older than all of them.
        let theirs = dir.path().join("main.o");
        fs::write(&theirs, [0u8; 4000]).unwrap();
        fs::File::options()
            .append(true)
            .open(&theirs)
            .unwrap()
            .set_modified(SystemTime::now() - std::time::Duration::from_secs(1000))
            .unwrap();
        let t0 = SystemTime::now() - std::time::Duration::from_secs(100);
        for (i, k) in keys.iter().enumerate() {
            cache.put(k, &[i as u8; 1000]);
            let f = fs::File::options()
                .append(true)
                .open(dir.path().join(format!("{k}.o")))
                .unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i as u64))
                .unwrap();
        }
        // Entry 0 is used again: the oldest are now 1 and 2.
        assert!(cache.get(&keys[0]).is_some());
        let entry = (1000 + 48) as u64;
        cache.prune(4 * entry); // not over the bound: nothing goes
        assert!(keys.iter().all(|k| cache.get(k).is_some()));
        for (i, k) in keys.iter().enumerate() {
            let f = fs::File::options()
                .append(true)
                .open(dir.path().join(format!("{k}.o")))
                .unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs([9, 1, 2, 3][i]))
                .unwrap();
        }
        cache.prune(3 * entry); // down to 3/4 of 3 entries: two remain
        let kept: Vec<bool> = keys
            .iter()
            .map(|k| dir.path().join(format!("{k}.o")).exists())
            .collect();
        assert_eq!(kept, [true, false, false, true]);
        assert!(
            theirs.exists(),
            "pruning deleted a file that is not an entry"
        );
    }
}
