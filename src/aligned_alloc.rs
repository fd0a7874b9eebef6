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

/// See the module docs.
pub struct CacheLineAligned;

/// `layout`, cache-line aligned when it is large.
fn adjusted(layout: Layout) -> Layout {
    if layout.size() >= LARGE {
        layout.align_to(64).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every block is allocated and freed by `System` with the same adjusted layout (the
// adjustment depends only on the size and alignment a caller passes back unchanged).
unsafe impl GlobalAlloc for CacheLineAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        System.alloc(adjusted(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        System.alloc_zeroed(adjusted(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, adjusted(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        if adjusted(layout).align() == adjusted(new).align() {
            return System.realloc(ptr, adjusted(layout), new_size);
        }
        let out = self.alloc(new);
        if !out.is_null() {
            std::ptr::copy_nonoverlapping(ptr, out, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        out
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
        }
    }
}
