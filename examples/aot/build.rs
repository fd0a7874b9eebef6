//! Compiles the example's kernels ahead of time: two library kernels and the example's own, for
//! every CPU feature level of the target architecture (linked into the binary), plus PTX, WGSL
//! and StableHLO text artifacts (embedded).

#[path = "src/custom.rs"]
mod custom;

use qforge_codegen::ptx::SmTarget;
use qforge_codegen::wgsl::WgslOptions;
use qforge_codegen::Target;
use qforge_ir::DType;

fn main() {
    let report = qforge_build::Builder::new()
        .library("quantize_4bit_nf4_bs64_f32")
        .library("dequantize_4bit_nf4_bs64_f32")
        .typed(custom::scaled_residual(DType::F32))
        .typed(custom::scaled_residual(DType::BF16))
        .text_target(Target::Ptx(SmTarget::Sm90))
        .text_target(Target::Wgsl(WgslOptions::HARDWARE))
        .text_target(Target::StableHlo { dim: 64 })
        .run();
    // Compile times per kernel and target, for docs/aot.md's figures.
    let timings: String = report
        .timings
        .iter()
        .map(|(kernel, target, s)| format!("{kernel}\t{target}\t{:.2} ms\n", s * 1e3))
        .collect();
    let out = std::env::var("OUT_DIR").unwrap_or_default();
    let _ = std::fs::write(std::path::Path::new(&out).join("timings.txt"), timings);
}
