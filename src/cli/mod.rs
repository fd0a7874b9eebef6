//! The commands behind the `qforge` binary, as library functions (the binary only parses
//! arguments and prints).

pub mod check;
pub mod check_libtpu;
pub mod compile;
pub mod list;
pub mod signals;
