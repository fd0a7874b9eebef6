//! The builder versions of kernels now written in the kernel language, kept to prove the two
//! equal (tests only).

pub mod activation;
pub mod blockwise8;
pub mod quant4;
