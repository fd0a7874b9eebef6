//! A global allocator for programs that run qforge kernels on a CPU: the system allocator, with
//! every allocation of at least [`LARGE`] bytes aligned to a 64-byte cache line. The `qforge`
//! binary and the `matmul_train` criterion bench use it; a program opts in with
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: qforge::aligned_alloc::CacheLineAligned = qforge::aligned_alloc::CacheLineAligned;
//! ```
//!
//! Tensors are `Vec<u8>`s, and glibc's `malloc` returns large blocks 16 bytes past a page
//! boundary, so every 64-byte vector load of an activation row splits two cache lines. Aligned,
//! the f32 4-bit matmul at M = 512, K = N = 4096 ran 7% faster (66.2 to 61.6 ms) and its input
//! gradient at M = 2048, K = 4096, N = 11008 5% faster (742 to 704 ms) on the AVX-512
//! development machine (`docs/bench.md`). Kernels never rely on it: any alignment gives the
//! same bits.

use std::alloc::{GlobalAlloc, Layout, System};

/// The smallest allocation that is cache-line aligned.
const LARGE: usize = 4096;

/// The cache line.
const LINE: usize = 64;

/// See the module docs.
///
/// A large block is the system allocator's block of `size + 64` bytes (16-byte aligned, which
/// the system allocator gives without an alignment request), used from its first cache-line
/// boundary past the start; the byte before that boundary holds the offset (16 to 64). So
/// glibc still serves large blocks from `mmap`, frees them to the system and grows them with
/// `mremap`: peak memory stays as without this allocator (`tests/memory.rs`).
pub struct CacheLineAligned;

/// Whether `layout` gets a cache-line aligned block.
fn large(layout: Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= LINE
}

/// The system block behind a large block of `size` bytes.
fn raw_layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(LINE)?, 16).ok()
}

/// The aligned start inside the system block `raw`, with its offset recorded before it.
///
/// # Safety
/// `raw` is a non-null block of at least `LINE` bytes, 16-byte aligned.
unsafe fn place(raw: *mut u8) -> *mut u8 {
    let off = LINE - raw as usize % LINE;
    let out = raw.add(off);
    *out.sub(1) = off as u8;
    out
}

/// The system block behind the large block `ptr`.
///
/// # Safety
/// `ptr` came from [`place`].
unsafe fn raw_of(ptr: *mut u8) -> (*mut u8, usize) {
    let off = *ptr.sub(1) as usize;
    (ptr.sub(off), off)
}

/// A block for `layout` from `system` (the system allocator's `alloc` or `alloc_zeroed`): the
/// system's own block, or for a large one a block of `size + LINE` bytes used from [`place`].
///
/// # Safety
/// As [`GlobalAlloc::alloc`].
unsafe fn allocate(layout: Layout, system: impl Fn(Layout) -> *mut u8) -> *mut u8 {
    if !large(layout) {
        return system(layout);
    }
    match raw_layout(layout.size()).map(system) {
        Some(raw) if !raw.is_null() => place(raw),
        _ => std::ptr::null_mut(),
    }
}

// SAFETY: a large block (see `large`, which depends only on the size and alignment a caller
// passes back unchanged) is a system block of `size + LINE` bytes used from `place`, freed and
// resized through `raw_of`; any other block is the system allocator's own.
unsafe impl GlobalAlloc for CacheLineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocate(layout, |l| System.alloc(l))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        allocate(layout, |l| System.alloc_zeroed(l))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !large(layout) {
            return System.dealloc(ptr, layout);
        }
        if let Some(l) = raw_layout(layout.size()) {
            System.dealloc(raw_of(ptr).0, l);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        match (large(layout), large(new)) {
            (false, false) => System.realloc(ptr, layout, new_size),
            (true, true) => {
                let (Some(old_raw), Some(_)) = (raw_layout(layout.size()), raw_layout(new_size))
                else {
                    return std::ptr::null_mut();
                };
                let (raw, off) = raw_of(ptr);
                let raw = System.realloc(raw, old_raw, new_size + LINE);
                if raw.is_null() {
                    return raw;
                }
                // The system block may have moved to another offset from a cache line.
                let new_off = LINE - raw as usize % LINE;
                if new_off != off {
                    std::ptr::copy(raw.add(off), raw.add(new_off), layout.size().min(new_size));
                }
                place(raw)
            }
            _ => {
                let out = self.alloc(new);
                if !out.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, out, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large blocks are 64-byte aligned, small ones keep their alignment, and a reallocation
    /// across the threshold (either way) keeps the bytes.
    #[test]
    fn large_blocks_are_cache_line_aligned_and_realloc_keeps_the_bytes() {
        let a = CacheLineAligned;
        for size in [LARGE, 3 * LARGE + 5, 1 << 22] {
            let layout = Layout::from_size_align(size, 1).unwrap();
            // SAFETY: a non-zero layout; the block is freed with the same layout.
            unsafe {
                let p = a.alloc(layout);
                assert!(
                    !p.is_null() && (p as usize).is_multiple_of(64),
                    "{size} bytes at {p:?}"
                );
                a.dealloc(p, layout);
            }
        }
        let small = Layout::from_size_align(100, 4).unwrap();
        // SAFETY: each pointer is used within its block's current size and freed once with
        // the layout of its last size.
        unsafe {
            let p = a.alloc(small);
            assert!((p as usize).is_multiple_of(4));
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let q = a.realloc(p, small, 2 * LARGE);
            assert!((q as usize).is_multiple_of(64), "grown past the threshold");
            assert!((0..100).all(|i| *q.add(i) == i as u8));
            let grown = Layout::from_size_align(2 * LARGE, 4).unwrap();
            let r = a.realloc(q, grown, 50);
            assert!((0..50).all(|i| *r.add(i) == i as u8));
            a.dealloc(r, Layout::from_size_align(50, 4).unwrap());
            // Large to large, across glibc's mmap threshold and back: the block moves.
            let mut size = LARGE + 3;
            let mut p = a.alloc(Layout::from_size_align(size, 1).unwrap());
            for i in 0..size {
                *p.add(i) = (i % 251) as u8;
            }
            for next in [1 << 22, 3 << 20, LARGE + 100, 1 << 23] {
                p = a.realloc(p, Layout::from_size_align(size, 1).unwrap(), next);
                assert!(
                    (p as usize).is_multiple_of(64),
                    "{size} -> {next} bytes at {p:?}"
                );
                let kept = size.min(next);
                assert!(
                    (0..kept).all(|i| *p.add(i) == (i % 251) as u8),
                    "{size} -> {next}"
                );
                for i in kept..next {
                    *p.add(i) = (i % 251) as u8;
                }
                size = next;
            }
            a.dealloc(p, Layout::from_size_align(size, 1).unwrap());
            let z = Layout::from_size_align(1 << 21, 8).unwrap();
            let p = a.alloc_zeroed(z);
            assert!((p as usize).is_multiple_of(64) && (0..1 << 21).all(|i| *p.add(i) == 0));
            a.dealloc(p, z);
        }
    }
}
