//! The pipeline's contract: every library kernel compiles for every target, deterministically,
//! into an artifact whose manifest describes the kernel and whose `.qir` parses back to it.

use qforge_ir::Kernel;

use super::*;
use crate::ptx::SmTarget;
use crate::wgsl::WgslOptions;

/// Every target kind (CPU objects at the baseline and AVX2 levels).
fn targets() -> Vec<Target> {
    vec![
        Target::cpu_object(CpuLevel::X86_64),
        Target::cpu_object(CpuLevel::X86_64V3),
        Target::Clif {
            level: CpuLevel::X86_64V2,
        },
        Target::LlvmIr(LlvmTarget::for_level(CpuLevel::X86_64V4)),
        Target::Ptx(SmTarget::Sm90),
        Target::Wgsl(WgslOptions::SOFTWARE),
        Target::Spirv(WgslOptions::HARDWARE),
        Target::StableHlo { dim: 8 },
    ]
}

fn library() -> Vec<Kernel> {
    qforge_kernels::catalog()
        .iter()
        .map(|s| s.build().expect("library kernels build"))
        .collect()
}

/// The manifest of `a` describes `kernel`, round-trips through JSON, and matches the code.
fn check_artifact(kernel: &Kernel, target: &Target, a: &Artifact) {
    let m = &a.manifest;
    let what = format!("{} for {}", kernel.name, target.kind());
    assert_eq!(m.kernel, kernel.name, "{what}");
    assert_eq!(m.content_hash, hex(kernel.content_hash()), "{what}");
    assert_eq!(m.target, target.kind(), "{what}");
    assert_eq!(m.params.len(), kernel.params.len(), "{what}");
    for ((_, p), info) in kernel.params.iter().zip(&m.params) {
        assert_eq!(p.name, info.name, "{what}");
    }
    assert_eq!(
        qforge_ir::text::parse(&a.qir).expect("qir parses"),
        *kernel,
        "{what}"
    );
    assert_eq!(
        Manifest::from_json(&m.to_json()).expect("manifest parses"),
        *m,
        "{what}"
    );
    m.check_code(&a.code.bytes()).expect("code hash matches");
    assert!(!m.passes.is_empty(), "{what}");
}

#[test]
fn every_library_kernel_compiles_for_a_cpu_object_with_a_faithful_manifest() {
    let target = Target::cpu_object(CpuLevel::X86_64V3);
    for kernel in library() {
        let a = compile(&kernel, &target, &Options::default())
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        check_artifact(&kernel, &target, &a);
        let Code::Object(bytes) = &a.code else {
            panic!("{}: not an object", kernel.name)
        };
        assert_eq!(&bytes[..4], b"\x7fELF", "{}", kernel.name);
        let Launch::Cpu { symbol, slots, .. } = &a.manifest.launch else {
            panic!("{}: not a CPU launch", kernel.name)
        };
        assert_eq!(
            *symbol,
            cpu_symbol(&kernel.name, kernel.content_hash(), CpuLevel::X86_64V3)
        );
        let symbol_bytes = symbol.as_bytes();
        assert!(
            bytes.windows(symbol_bytes.len()).any(|w| w == symbol_bytes),
            "{}: symbol not in the object",
            kernel.name
        );
        assert_eq!(
            *slots,
            qforge_ir::cpu_abi::ArgLayout::from_counts(
                kernel.params.len(),
                a.manifest.tables.len(),
                true
            )
            .len()
        );
    }
}

#[test]
fn a_sample_of_kernels_compiles_for_every_target_deterministically() {
    let kernels = library();
    for kernel in kernels.iter().step_by(29) {
        for target in targets() {
            let a = compile(kernel, &target, &Options::default())
                .unwrap_or_else(|e| panic!("{} for {target:?}: {e}", kernel.name));
            check_artifact(kernel, &target, &a);
            let again = compile(kernel, &target, &Options::default()).expect("compiles again");
            assert_eq!(
                a, again,
                "{} for {target:?} is not deterministic",
                kernel.name
            );
        }
    }
}

#[test]
fn the_text_targets_emit_what_the_backends_emit() {
    let kernel = library()
        .into_iter()
        .find(|k| k.name == "quantize_4bit_nf4_bs64_f32")
        .expect("in the library");
    let ptx = compile(&kernel, &Target::Ptx(SmTarget::Sm80), &Options::default()).expect("ptx");
    assert_eq!(
        ptx.code.text(),
        Some(
            crate::ptx::ptx_text(&kernel, SmTarget::Sm80)
                .expect("ptx")
                .as_str()
        )
    );
    let wgsl = compile(
        &kernel,
        &Target::Wgsl(WgslOptions::HARDWARE),
        &Options::default(),
    )
    .expect("wgsl");
    assert_eq!(
        wgsl.code.text(),
        Some(
            crate::Backend::emit_text(&crate::wgsl::WgslBackend, &kernel)
                .expect("wgsl")
                .as_str()
        )
    );
    let hlo = compile(
        &kernel,
        &Target::StableHlo {
            dim: crate::stablehlo::TEXT_DIM,
        },
        &Options::default(),
    )
    .expect("hlo");
    assert_eq!(
        hlo.code.text(),
        Some(
            crate::Backend::emit_text(&crate::stablehlo::StableHloBackend, &kernel)
                .expect("hlo")
                .as_str()
        )
    );
}

#[test]
fn bad_targets_and_artifacts_are_named_errors() {
    let kernel = library().remove(0);
    let wrong_arch = Target::CpuObject {
        triple: "aarch64-unknown-linux-gnu".into(),
        level: CpuLevel::X86_64V3,
    };
    let e = compile(&kernel, &wrong_arch, &Options::default()).expect_err("wrong arch");
    assert!(
        e.to_string().contains("x86-64-v3") && e.to_string().contains("aarch64"),
        "{e}"
    );
    let e = CpuLevel::from_name("x86-64-v9").expect_err("unknown level");
    assert!(
        e.to_string().contains("x86-64-v9") && e.to_string().contains("x86-64-v4"),
        "{e}"
    );
    let bad_triple = Target::CpuObject {
        triple: "not-a-triple-at-all".into(),
        level: CpuLevel::X86_64,
    };
    assert!(compile(&kernel, &bad_triple, &Options::default()).is_err());

    let a = compile(
        &kernel,
        &Target::cpu_object(CpuLevel::X86_64),
        &Options::default(),
    )
    .expect("compiles");
    let mut corrupted = a.code.bytes();
    corrupted[100] ^= 1;
    let e = a.manifest.check_code(&corrupted).expect_err("corrupted");
    assert!(
        e.to_string().contains(&kernel.name) && e.to_string().contains("corrupted"),
        "{e}"
    );
    let other_version = a
        .manifest
        .to_json()
        .replace("\"manifest_version\": 1", "\"manifest_version\": 2");
    let e = Manifest::from_json(&other_version).expect_err("version");
    assert!(e.to_string().contains("version 2"), "{e}");
}

#[test]
fn an_unverified_kernel_is_refused_before_any_pass() {
    let mut kernel = library().remove(0);
    kernel.grid =
        qforge_ir::Dim::Param(kernel.params.iter().last().map(|(h, _)| h).expect("params"));
    let e = compile(
        &kernel,
        &Target::cpu_object(CpuLevel::X86_64),
        &Options::default(),
    )
    .expect_err("does not verify");
    assert!(matches!(e, crate::Error::Ir(_)), "{e}");
    assert!(e.to_string().contains(&kernel.name), "{e}");
}

#[test]
fn aarch64_objects_compile() {
    let kernel = library()
        .into_iter()
        .find(|k| k.name == "dequantize_4bit_nf4_bs64_f32")
        .expect("in the library");
    let a = compile(
        &kernel,
        &Target::cpu_object(CpuLevel::Aarch64),
        &Options::default(),
    )
    .expect("aarch64");
    let Code::Object(bytes) = &a.code else {
        panic!("not an object")
    };
    assert_eq!(&bytes[..4], b"\x7fELF");
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_objects_compile_for_every_level_deterministically() {
    let kernels = library();
    for kernel in kernels.iter().step_by(29) {
        for level in CpuLevel::ALL {
            let target = Target::llvm_object(level);
            let what = format!("{} at {}", kernel.name, level.name());
            let a = compile(kernel, &target, &Options::default())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            check_artifact(kernel, &target, &a);
            assert_eq!(a.manifest.target, "cpu-obj-llvm", "{what}");
            assert_eq!(
                a.manifest.settings.get("level").map(String::as_str),
                Some(level.name()),
                "{what}"
            );
            let Code::Object(bytes) = &a.code else {
                panic!("{what}: not an object")
            };
            assert_eq!(&bytes[..4], b"\x7fELF", "{what}");
            let Launch::Cpu { symbol, .. } = &a.manifest.launch else {
                panic!("{what}: not a CPU launch")
            };
            assert_eq!(
                *symbol,
                llvm_symbol(&kernel.name, kernel.content_hash(), level),
                "{what}"
            );
            assert_ne!(
                *symbol,
                cpu_symbol(&kernel.name, kernel.content_hash(), level),
                "{what}"
            );
            assert!(
                bytes.windows(symbol.len()).any(|w| w == symbol.as_bytes()),
                "{what}: symbol not in the object"
            );
            // The same passes as the LLVM IR of the level.
            let ir = Target::LlvmIr(LlvmTarget::for_level(level));
            assert_eq!(passes(&target, true), passes(&ir, true), "{what}");
            let again = compile(kernel, &target, &Options::default()).expect("compiles again");
            assert_eq!(a, again, "{what}: not deterministic");
        }
    }
    let wrong_arch = Target::LlvmObject {
        triple: "aarch64-unknown-linux-gnu".into(),
        level: CpuLevel::X86_64V4,
    };
    let e = compile(&kernels[0], &wrong_arch, &Options::default()).expect_err("wrong arch");
    assert!(
        e.to_string().contains("x86-64-v4") && e.to_string().contains("aarch64"),
        "{e}"
    );
}

#[cfg(not(feature = "llvm"))]
#[test]
fn llvm_objects_need_the_llvm_feature() {
    let kernel = library().remove(0);
    let e = compile(
        &kernel,
        &Target::llvm_object(CpuLevel::X86_64V3),
        &Options::default(),
    )
    .expect_err("no llvm");
    assert!(matches!(e, crate::Error::Target(_)), "{e}");
    assert!(
        e.to_string().contains("`llvm` feature") && e.to_string().contains(&kernel.name),
        "{e}"
    );
}
