//! A kernel that no one can change any more, shared behind an [`Arc`], with its
//! [`Kernel::fingerprint`] computed once: what a device's compiled-kernel cache can find without
//! hashing or comparing the kernel at every launch.

use std::sync::Arc;

use crate::Kernel;

/// An immutable kernel and its [`Kernel::fingerprint`]. Library kernels are built once and kept
/// as `SharedKernel`s (inside [`crate::dsl::TypedKernel`]); a device that caches compilations by
/// fingerprint takes the fingerprint from here (a hash of the whole kernel costs microseconds
/// per launch for a tiled GEMM) and knows a cached entry holding the same `Arc`
/// ([`SharedKernel::same`]) is this kernel without comparing it statement by statement.
#[derive(Clone, Debug)]
pub struct SharedKernel {
    kernel: Arc<Kernel>,
    fingerprint: u64,
}

impl SharedKernel {
    /// `kernel`, from now on immutable, with its fingerprint.
    pub fn new(kernel: Kernel) -> SharedKernel {
        let fingerprint = kernel.fingerprint();
        SharedKernel {
            kernel: Arc::new(kernel),
            fingerprint,
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The kernel's [`Kernel::fingerprint`] (computed when it was shared).
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The shared kernel, for a cache to keep.
    pub fn arc(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    /// Whether `kernel` is this very kernel (the same allocation, so the same contents: neither
    /// can change while both are alive).
    pub fn same(&self, kernel: &Arc<Kernel>) -> bool {
        Arc::ptr_eq(&self.kernel, kernel)
    }

    /// The kernel, cloned only when it is still shared.
    pub fn into_kernel(self) -> Kernel {
        Arc::try_unwrap(self.kernel).unwrap_or_else(|k| (*k).clone())
    }
}
