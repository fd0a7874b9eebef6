//! The build-script contract, on a temporary `OUT_DIR`: files are written only when their
//! content changes, output is deterministic, and a bad kernel or name fails the build with its
//! name.

use std::path::Path;

use qforge_build::Builder;
use qforge_codegen::compile::CpuLevel;
use qforge_codegen::wgsl::WgslOptions;
use qforge_codegen::Target;
use qforge_ir::{Access, DType, Dim, Kernel, KernelBuilder, ScalarType};

/// `x[i] = x[i] * factor`.
fn scale(factor: f32) -> Kernel {
    let mut b = KernelBuilder::new("scale");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::ReadWrite);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let v = b.load(x, i);
    let f = b.const_f32(factor);
    let y = b.mul(v, f);
    b.store(x, i, y);
    b.finish()
}

fn builder(dir: &Path, factor: f32) -> Builder {
    Builder::new()
        .out_dir(dir)
        .cpu_levels(&[CpuLevel::X86_64, CpuLevel::X86_64V3])
        .library("dequantize_4bit_nf4_bs64_f32")
        .kernel(scale(factor))
        .text_target(Target::Wgsl(WgslOptions::HARDWARE))
}

/// Every file under `dir` with its bytes, sorted by path.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(tree(&path));
        } else {
            out.push((
                path.display().to_string(),
                std::fs::read(&path).expect("file"),
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn files_are_rewritten_only_when_their_content_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = builder(dir.path(), 2.0).build().expect("builds");
    // 2 kernels x (2 levels + 1 text target) x 3 files, the manifest, the library, the Rust.
    assert_eq!(first.written.len(), 2 * 3 * 3 + 3, "{:?}", first.written);
    let again = builder(dir.path(), 2.0).build().expect("builds");
    assert!(
        again.written.is_empty(),
        "unchanged build rewrote {:?}",
        again.written
    );
    let changed = builder(dir.path(), 3.0).build().expect("builds");
    // The changed kernel's new files, and the files that list every artifact.
    assert!(
        changed.written.iter().all(|f| !f.contains("dequantize")),
        "{:?}",
        changed.written
    );
    assert!(
        changed
            .written
            .iter()
            .any(|f| f.starts_with("qforge/scale-")),
        "{:?}",
        changed.written
    );
    for shared in [
        "qforge/manifest.json",
        "qforge_kernels.rs",
        "libqforge_aot_",
    ] {
        assert!(
            changed.written.iter().any(|f| f.starts_with(shared)),
            "{shared}: {:?}",
            changed.written
        );
    }
    // The old kernel's artifacts are gone: `qforge/` holds exactly this build's files.
    let files = std::fs::read_dir(dir.path().join("qforge"))
        .expect("qforge dir")
        .count();
    assert_eq!(files, 2 * 3 * 3 + 1);
}

#[test]
fn two_builds_are_byte_identical() {
    let (a, b) = (
        tempfile::tempdir().expect("a"),
        tempfile::tempdir().expect("b"),
    );
    builder(a.path(), 2.0).build().expect("builds");
    builder(b.path(), 2.0).build().expect("builds");
    let strip = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        tree(dir)
            .into_iter()
            .map(|(p, bytes)| {
                (
                    p.trim_start_matches(&dir.display().to_string()).to_string(),
                    bytes,
                )
            })
            .collect()
    };
    assert_eq!(strip(a.path()), strip(b.path()));
}

#[test]
fn the_generated_rust_names_every_artifact() {
    let dir = tempfile::tempdir().expect("tempdir");
    builder(dir.path(), 2.0).build().expect("builds");
    let rust = std::fs::read_to_string(dir.path().join("qforge_kernels.rs")).expect("rust");
    for name in [
        "SCALE__X86_64_V3",
        "SCALE__X86_64:",
        "DEQUANTIZE_4BIT_NF4_BS64_F32__X86_64_V3",
        "pub static KERNELS",
        "pub static TEXT",
    ] {
        assert!(rust.contains(name), "{name} missing");
    }
    assert_eq!(rust.matches("::aot::TextArtifact = ").count(), 2);
}

#[test]
fn a_broken_kernel_or_unknown_name_fails_the_build_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut broken = scale(2.0);
    broken.name = "broken_scale".into();
    // The grid may only be a constant or a u32 parameter: point it at the f32 buffer.
    broken.grid = Dim::Param(broken.params.iter().last().map(|(h, _)| h).expect("params"));
    let e = Builder::new()
        .out_dir(dir.path())
        .kernel(broken)
        .build()
        .expect_err("does not verify");
    assert!(e.to_string().contains("broken_scale"), "{e}");
    let e = Builder::new()
        .out_dir(dir.path())
        .library("dequantize_4bit_nf4_bs64")
        .build()
        .expect_err("unknown");
    assert!(
        e.to_string()
            .contains("no library kernel 'dequantize_4bit_nf4_bs64'"),
        "{e}"
    );
    assert!(
        e.to_string().contains("dequantize_4bit_nf4_bs64_f32"),
        "close names: {e}"
    );
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_objects_replace_the_cranelift_ones_with_their_lanes_and_features() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = builder(dir.path(), 2.0).build().expect("builds");
    let objects: Vec<_> = report
        .artifacts
        .iter()
        .filter(|a| a.code.text().is_none() && a.manifest.target != "spirv")
        .collect();
    // One object per kernel per level, all LLVM's.
    assert_eq!(objects.len(), 4);
    assert!(
        objects.iter().all(|a| a.manifest.target == "cpu-obj-llvm"),
        "{:?}",
        objects
            .iter()
            .map(|a| &a.manifest.target)
            .collect::<Vec<_>>()
    );
    let rust = std::fs::read_to_string(dir.path().join("qforge_kernels.rs")).expect("rust");
    assert_eq!(rust.matches("backend: \"llvm\"").count(), 4, "{rust}");
    assert_eq!(
        rust.matches("vector_lanes: 8,").count(),
        2,
        "x86-64-v3: 8 lanes"
    );
    assert_eq!(
        rust.matches("vector_lanes: 4,").count(),
        2,
        "x86-64: 4 lanes"
    );
    assert!(
        rust.contains("\"f16c\", \"movbe\""),
        "LLVM's x86-64-v3 model needs F16C and MOVBE"
    );
    assert!(rust.contains("_x86_64_v3_llvm("), "LLVM symbols");
    assert!(dir.path().join("qforge").read_dir().expect("dir").any(|e| e
        .expect("entry")
        .file_name()
        .to_string_lossy()
        .contains("-cpu-obj-llvm-x86-64-v3")));

    let cranelift = tempfile::tempdir().expect("tempdir");
    builder(cranelift.path(), 2.0)
        .llvm(false)
        .build()
        .expect("builds");
    let rust = std::fs::read_to_string(cranelift.path().join("qforge_kernels.rs")).expect("rust");
    assert_eq!(rust.matches("backend: \"cranelift\"").count(), 4, "{rust}");
    assert_eq!(rust.matches("vector_lanes: 4,").count(), 4);
}
