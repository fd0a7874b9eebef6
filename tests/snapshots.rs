//! insta snapshots of every library kernel: its IR text and its Cranelift IR, one file per
//! (kernel, backend) in `snapshots/`. Review changes in diffs; create new ones locally with
//! `INSTA_UPDATE=always cargo test --test snapshots` (CI never writes snapshots).

use qforge::codegen::cranelift::clif_text;
use qforge::ir::{text, verify};
use qforge::kernels;

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

#[test]
fn ir_text_and_clif_of_every_library_kernel() {
    settings().bind(|| {
        for entry in kernels::catalog() {
            let kernel = entry.build().expect("library kernels build");
            verify(&kernel).expect("library kernels verify");
            let ir = text::print(&kernel);
            assert_eq!(
                text::parse(&ir).expect("printed IR parses"),
                kernel,
                "{} does not round-trip",
                kernel.name
            );
            insta::assert_snapshot!(format!("{}.ir", kernel.name), ir);
            insta::assert_snapshot!(
                format!("{}.clif", kernel.name),
                clif_text(&kernel).expect("lowers to Cranelift")
            );
        }
    });
}

/// LLVM IR text (16 lanes, AVX-512 permutes and VBMI 4-bit decodes) of a few representative
/// kernels: a 4-bit dequantize (one byte, two codes per iteration), an 8-bit dequantize (a
/// 256-entry permute lookup), the NF4 GEMV tile (strided accumulate, fused 4-bit decodes) and an
/// 8-bit quantize (the level search of `search_sorted`, 32 lanes). The text of every kernel is long
/// (vector constants are spelled lane by lane), so only these are kept; `tests/llvm.rs` checks
/// every kernel's text for determinism and fast-math flags.
#[test]
fn llvm_text_of_representative_kernels() {
    use qforge::codegen::llvm::{lower, LlvmOptions};
    let options = LlvmOptions {
        bounds_checks: true,
        lanes: 16,
        x86_avx512: true,
        x86_avx512_vbmi: true,
        x86_avx2: true,
    };
    let names = [
        "dequantize_4bit_nf4_bs64_f32",
        "dequantize_blockwise_dynamic_bs256_f32",
        "matmul_4bit_nf4_bs64_f32_t1x4",
        "quantize_blockwise_dynamic_bs256_f32",
    ];
    settings().bind(|| {
        for name in names {
            let entry = kernels::catalog()
                .into_iter()
                .find(|e| e.name() == name)
                .unwrap_or_else(|| panic!("{name} is in the catalog"));
            let kernel = entry.build().expect("library kernels build");
            let text = lower(&kernel, &options).expect("lowers to LLVM IR");
            insta::assert_snapshot!(format!("{name}.llvm"), text);
        }
    });
}
