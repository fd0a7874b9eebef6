//! insta snapshots of the library's kernels: the IR text of every kernel (one file per kernel),
//! the full backend text of a few representative kernels, and for every kernel and backend the
//! FNV-1a hash of its text (`snapshots/backend_text_hashes.snap`, one line per kernel), so that
//! any change to any kernel's code shows up in review as a named line without 1,800 files of
//! generated code in the diff. Create new snapshots locally with
//! `INSTA_UPDATE=always cargo test --test snapshots` (CI never writes snapshots).

use qforge::codegen::cranelift::clif_text;
use qforge::codegen::llvm::LlvmOptions;
use qforge::codegen::ptx::{ptx_text, SmTarget};
use qforge::codegen::stablehlo::{StableHloBackend, TEXT_DIM};
use qforge::codegen::wgsl::WgslBackend;
use qforge::codegen::Backend;
use qforge::ir::cpu_abi::fnv1a;
use qforge::ir::{text, verify, Kernel};
use qforge::kernels;

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

/// Kernels whose backend text is kept in full: the NF4 quantize (absmax reduction, the search of
/// the 4-bit code) and dequantize (two codes per byte), the 8-bit blockwise quantize (the search
/// of a 256-entry code) and dequantize (a 256-entry lookup), the NF4 GEMV tile (strided
/// `accumulate`, fused 4-bit decodes) and the 8-bit AdamW step (loops, variables, `fma`).
const REPRESENTATIVE: [&str; 6] = [
    "quantize_4bit_nf4_bs64_f32",
    "dequantize_4bit_nf4_bs64_f32",
    "quantize_blockwise_dynamic_bs256_f32",
    "dequantize_blockwise_dynamic_bs256_f32",
    "matmul_4bit_nf4_bs64_f32_t1x4",
    "adamw8bit_f32",
];

/// The LLVM options of the snapshots: 16 lanes, AVX-512 permutes and VBMI 4-bit decodes.
const LLVM: LlvmOptions = LlvmOptions {
    bounds_checks: true,
    lanes: 16,
    x86_avx512: true,
    x86_avx512_vbmi: true,
    x86_avx2: true,
};

fn library() -> Vec<Kernel> {
    kernels::catalog()
        .iter()
        .map(|e| e.build().expect("library kernels build"))
        .collect()
}

/// Each backend's snapshot text of `kernel`: (file suffix, text). The Mosaic module and its
/// twin only for the kernels that backend lowers (`tests/mosaic.rs` checks the refusals).
fn backend_texts(kernel: &Kernel) -> Vec<(&'static str, String)> {
    let name = &kernel.name;
    let mut texts = vec![
        (
            "clif",
            clif_text(kernel).unwrap_or_else(|e| panic!("{name}: {e}")),
        ),
        (
            "ptx",
            ptx_text(kernel, SmTarget::Sm80).unwrap_or_else(|e| panic!("{name}: {e}")),
        ),
        (
            "wgsl",
            WgslBackend
                .emit_text(kernel)
                .unwrap_or_else(|e| panic!("{name}: {e}")),
        ),
        (
            "stablehlo",
            StableHloBackend
                .emit_text(kernel)
                .unwrap_or_else(|e| panic!("{name}: {e}")),
        ),
        (
            "llvm",
            qforge::codegen::llvm::lower(kernel, &LLVM).unwrap_or_else(|e| panic!("{name}: {e}")),
        ),
    ];
    let shapes = qforge::codegen::stablehlo::Shapes::with_dims(kernel, TEXT_DIM);
    if let Ok(m) = qforge::codegen::mosaic::lower(kernel, &shapes) {
        texts.push(("mosaic", m.text));
        texts.push(("mosaic_twin", m.twin));
    }
    texts
}

#[test]
fn ir_text_of_every_library_kernel() {
    settings().bind(|| {
        for kernel in library() {
            verify(&kernel).expect("library kernels verify");
            let ir = text::print(&kernel);
            assert_eq!(
                text::parse(&ir).expect("printed IR parses"),
                kernel,
                "{} does not round-trip",
                kernel.name
            );
            insta::assert_snapshot!(format!("{}.ir", kernel.name), ir);
        }
    });
}

#[test]
fn backend_text_of_representative_kernels() {
    let kernels = library();
    settings().bind(|| {
        for name in REPRESENTATIVE {
            let kernel = kernels
                .iter()
                .find(|k| k.name == name)
                .unwrap_or_else(|| panic!("{name} is in the catalog"));
            for (suffix, text) in backend_texts(kernel) {
                insta::assert_snapshot!(format!("{name}.{suffix}"), text);
            }
        }
    });
}

#[test]
fn backend_text_hashes_of_every_library_kernel() {
    let lines: Vec<String> = library()
        .iter()
        .map(|kernel| {
            let hashes: Vec<String> = backend_texts(kernel)
                .into_iter()
                .map(|(suffix, text)| format!("{suffix}={:016x}", fnv1a(text.as_bytes())))
                .collect();
            format!("{} {}", kernel.name, hashes.join(" "))
        })
        .collect();
    settings().bind(|| insta::assert_snapshot!("backend_text_hashes", lines.join("\n")));
}

/// A kernel with three results, one per way a sharded program combines them.
const THREE_RESULTS: &str = "kernel three(a: f32[n] read, s: f32 , y: f32[n] write, g: bf16[n] write, t: f32[n] write, n: u32)
grid n
{
  %0: u32 = work_item
  %1: f32 = load a[%0]
  %2: f32 = param s
  %3: f32 = mul %1, %2
  store y[%0] = %3
  store g[%0] = %3 rne
  store t[%0] = %1
}";

/// The sharded program (`codegen/src/stablehlo/spmd.rs`) of a small kernel on 2 ranks: the
/// mesh, the shardings, the manual computation and its three kinds of result combine.
#[test]
fn sharded_stablehlo_program_of_a_small_kernel() {
    use qforge::codegen::stablehlo::spmd::{module, Combine, Place, Plan};
    use qforge::codegen::stablehlo::Shapes;
    let kernel = text::parse(THREE_RESULTS).unwrap();
    let plan = Plan {
        ranks: 2,
        args: vec![
            Place::Split,
            Place::Replicated,
            Place::Replicated,
            Place::Replicated,
            Place::Replicated,
            Place::Replicated,
        ],
        results: vec![
            Combine::Local,
            Combine::GatherLastDim { rows: 2 },
            Combine::SumF32InRankOrder,
        ],
    };
    let shapes = Shapes {
        grid: 4,
        elements: vec![4, 0, 4, 4, 4, 0],
    };
    let text = module(&kernel, &shapes, &plan).unwrap();
    settings().bind(|| insta::assert_snapshot!("spmd_three_results.stablehlo", text));
}
