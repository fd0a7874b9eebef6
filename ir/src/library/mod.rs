//! The op library: bitsandbytes-compatible kernels built with the public [`crate::KernelBuilder`].
