//! With the `aot` feature: every library kernel compiled ahead of time for every CPU feature
//! level of the target architecture, linked into the crate (`qforge::aot_kernels`, device
//! `cpu-aot`). Without it: nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "aot")]
    qforge_build::Builder::new().whole_library().run();
}
