//! Buffers of the host's operand copies ([`super::host`]), kept on the calling thread between
//! products. A fresh `vec![0; len]` is zeroed by `calloc` (glibc serves a freed block of several
//! MiB again from its heap and clears it) or by the kernel's page faults, a pass over memory as
//! long as the copy itself: taken from here, the copy is the only pass.

use std::cell::RefCell;

/// Buffers kept per thread: a product copies at most two operands.
const KEPT: usize = 2;

/// The largest buffer kept, in bytes: above it the buffer is freed, so a thread holds at most
/// [`KEPT`] times this much between products.
const KEPT_BYTES: usize = 64 << 20;

thread_local! {
    static BUFFERS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of at least `len` bytes with unspecified contents (zeros, or bytes of an earlier
/// copy): the caller writes every byte of `[..len]` it reads back.
pub(crate) fn take(len: usize) -> Vec<u8> {
    let kept = BUFFERS.with(|b| {
        let mut b = b.borrow_mut();
        // The shortest kept buffer of `len` bytes or more, else the longest (grown below).
        let fits = (0..b.len())
            .filter(|&i| b[i].len() >= len)
            .min_by_key(|&i| b[i].len());
        let at = fits.or_else(|| (0..b.len()).max_by_key(|&i| b[i].len()));
        at.map(|i| b.swap_remove(i))
    });
    let mut buf = kept.unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, 0);
    }
    buf
}

/// Keeps `buf` for a later [`take`] on this thread (or frees it: above [`KEPT_BYTES`], or the
/// shortest of more than [`KEPT`]).
pub(crate) fn keep(buf: Vec<u8>) {
    if buf.len() > KEPT_BYTES {
        return;
    }
    BUFFERS.with(|b| {
        let mut b = b.borrow_mut();
        b.push(buf);
        if b.len() > KEPT {
            let shortest = (0..b.len()).min_by_key(|&i| b[i].len());
            if let Some(i) = shortest {
                b.swap_remove(i);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{keep, take, KEPT};

    /// A kept buffer comes back whole (its bytes as left) when it is long enough, else the
    /// longest kept one grown with zeros; at most [`KEPT`] are kept, the longest.
    #[test]
    fn kept_buffers_are_reused_longest_kept() {
        let a = vec![7u8; 100];
        let at = a.as_ptr();
        keep(a);
        let b = take(60);
        assert_eq!((b.as_ptr(), b.len()), (at, 100));
        keep(b);
        let grown = take(150);
        assert_eq!(grown.len(), 150);
        assert!(grown[..100].iter().all(|&x| x == 7) && grown[100..].iter().all(|&x| x == 0));
        for n in [10, 20, 30] {
            keep(vec![1; n]);
        }
        keep(grown);
        let lens: Vec<usize> = (0..=KEPT).map(|_| take(0).len()).collect();
        assert_eq!(lens, [30, 150, 0], "{lens:?}");
    }
}
