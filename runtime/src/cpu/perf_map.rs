//! `perf` names for the LLVM JIT's kernels. Machine code that a JIT writes has no symbols, so
//! `perf report` shows its samples as bare addresses. With `QFORGE_PERF_MAP=1` the JIT appends
//! one line per loaded object to `/tmp/perf-<pid>.map`, the file `perf` reads for a JIT's code
//! (the format of Linux's `tools/perf/Documentation/jit-interface.txt`: `START SIZE NAME`, hex
//! without `0x`): the object's whole code section, named `qforge:<kernel>`, so every sample in
//! a kernel's entry or in its outlined work item counts for the kernel. The file is only
//! appended to (a kernel loaded twice by two devices has two lines, both right); `perf` reads
//! it after the run, and nothing deletes it.

use std::io::Write;

use object::{Object, ObjectSection, ObjectSymbol};

/// The environment variable that turns the map on (`1`).
const PERF_MAP_ENV: &str = "QFORGE_PERF_MAP";

/// Whether `QFORGE_PERF_MAP` is `1`.
fn enabled() -> bool {
    std::env::var_os(PERF_MAP_ENV).is_some_and(|v| v == "1")
}

/// The code section of `symbol` in the native object `object`: the symbol's offset from the
/// section's start and the section's size in bytes, or `None` when the object does not parse
/// or has no such symbol in a section (also under the platform's `_` prefix).
fn code_range(object: &[u8], symbol: &str) -> Option<(u64, u64)> {
    let file = object::File::parse(object).ok()?;
    // The object's file symbol has the same name (LLVM names the object after its entry).
    let (sym, index) = file.symbols().find_map(|s| {
        let named = s
            .name()
            .is_ok_and(|n| n == symbol || n.strip_prefix('_') == Some(symbol));
        let index = s.section_index().filter(|_| named)?;
        Some((s, index))
    })?;
    let section = file.section_by_index(index).ok()?;
    let offset = sym.address().checked_sub(section.address())?;
    Some((offset, section.size()))
}

/// The map line naming kernel `name`, whose object `object` was loaded with its entry `symbol`
/// at `address` (with a trailing newline), or `None` as [`code_range`].
pub(super) fn line(object: &[u8], symbol: &str, address: u64, name: &str) -> Option<String> {
    let (offset, size) = code_range(object, symbol)?;
    let start = address.checked_sub(offset)?;
    // A name ends at the line's end; keep it on one line.
    let name: String = name
        .chars()
        .map(|c| if c.is_control() { '_' } else { c })
        .collect();
    Some(format!("{start:x} {size:x} qforge:{name}\n"))
}

/// Appends kernel `name`'s line ([`line`]) to this process's map when [`enabled`]. A map that
/// cannot be written is reported on stderr (once per process) and the kernel still runs.
pub(super) fn record(object: &[u8], symbol: &str, address: u64, name: &str) {
    if !enabled() {
        return;
    }
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let written = match line(object, symbol, address, name) {
        Some(l) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(l.as_bytes()))
            .map_err(|e| e.to_string()),
        None => Err(format!(
            "kernel '{name}': no code section for '{symbol}' in its object"
        )),
    };
    if let Err(e) = written {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| eprintln!("{PERF_MAP_ENV}: not writing {path}: {e}"));
    }
}
