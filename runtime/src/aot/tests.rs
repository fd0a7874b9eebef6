//! The loader's checks: artifacts are matched by content hash, and a missing, stale,
//! unrunnable, corrupted or wrong-target artifact gives the policy's error or fallback, named.

use qforge_ir::{Access, Arg, DType, Dim, Kernel, KernelBuilder, Scalar, ScalarType};

use super::*;
use crate::device::Device;

/// `x[i] = x[i] * factor` over `n` work items, named `name`.
pub(crate) fn scale(name: &str, factor: f32) -> Kernel {
    let mut b = KernelBuilder::new(name);
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

/// A hand-written implementation of `scale(_, 2.0)` with the kernel ABI (slot 1: `x`).
unsafe extern "C" fn doubled(args: *const u64, begin: u32, end: u32) {
    // SAFETY: the launcher passes the slots of a bound launch: slot 1 points at `n` f32s and
    // begin..end lies within 0..n.
    unsafe {
        let x = *args.add(1) as *mut f32;
        for i in begin..end {
            *x.add(i as usize) *= 2.0;
        }
    }
}

fn record(name: &'static str, hash: u64) -> AotKernel {
    AotKernel {
        name,
        content_hash: hash,
        manifest_version: MANIFEST_VERSION,
        level: "x86-64",
        features: &[],
        backend: "cranelift",
        vector_lanes: 4,
        bounds_checks: true,
        params: 2,
        tables: &[],
        entry: doubled,
        qir: "",
    }
}

fn leak(records: Vec<AotKernel>) -> &'static [&'static AotKernel] {
    let refs: Vec<&'static AotKernel> = records
        .into_iter()
        .map(|r| &*Box::leak(Box::new(r)))
        .collect();
    Box::leak(refs.into_boxed_slice())
}

fn run(dev: &dyn Device, kernel: &Kernel) -> crate::Result<Vec<f32>> {
    let mut x: Vec<u8> = [1.0f32, -3.5, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dev.launch(
        kernel,
        &mut [Arg::Scalar(Scalar::U32(3)), Arg::Write(&mut x)],
    )?;
    Ok(x.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[test]
fn an_artifact_runs_when_its_content_hash_matches() {
    let kernel = scale("scale2", 2.0);
    let dev = AotDevice::new(
        leak(vec![record("scale2", kernel.content_hash())]),
        Policy::RequireAot,
    )
    .expect("device");
    assert_eq!(run(&dev, &kernel).expect("runs"), vec![2.0, -7.0, 0.5]);
    assert_eq!(dev.level_of(&kernel), Some("x86-64"));
}

#[test]
fn stale_missing_and_unrunnable_artifacts_are_named_errors_under_require() {
    let built = scale("scale2", 2.0);
    let changed = scale("scale2", 3.0);
    let dev = AotDevice::new(
        leak(vec![record("scale2", built.content_hash())]),
        Policy::RequireAot,
    )
    .expect("device");
    let e = run(&dev, &changed).expect_err("stale").to_string();
    assert!(
        e.contains("'scale2' is stale") && e.contains(&format!("{:016x}", built.content_hash())),
        "{e}"
    );
    let e = run(&dev, &scale("other", 2.0))
        .expect_err("missing")
        .to_string();
    assert!(
        e.contains("'other'") && e.contains("not compiled ahead of time"),
        "{e}"
    );

    // A program without any CPU artifact (QFORGE_AOT_LEVELS=none) says so.
    let empty = AotDevice::new(&[], Policy::RequireAot).expect("device");
    let e = run(&empty, &built).expect_err("none built").to_string();
    assert!(
        e.contains("no ahead-of-time CPU kernels at all") && e.contains("QFORGE_AOT_LEVELS=none"),
        "{e}"
    );

    let mut wrong_cpu = record("scale2", built.content_hash());
    wrong_cpu.level = "imaginary";
    wrong_cpu.features = &["no-such-feature"];
    let dev = AotDevice::new(leak(vec![wrong_cpu]), Policy::RequireAot).expect("device");
    let e = run(&dev, &built).expect_err("unrunnable").to_string();
    assert!(
        e.contains("lacks the features") && e.contains("imaginary"),
        "{e}"
    );
    assert!(AotDevice::for_level(
        leak(vec![record("scale2", 1)]),
        Policy::RequireAot,
        "x86-64-v9"
    )
    .is_err());
}

#[test]
fn records_of_another_version_or_without_bounds_checks_are_refused() {
    let mut old = record("scale2", 1);
    old.manifest_version = MANIFEST_VERSION + 1;
    let e = AotDevice::new(leak(vec![old]), Policy::RequireAot)
        .expect_err("version")
        .to_string();
    assert!(
        e.contains("'scale2'") && e.contains("manifest version"),
        "{e}"
    );
    let mut unchecked = record("scale2", 1);
    unchecked.bounds_checks = false;
    let e = AotDevice::new(leak(vec![unchecked]), Policy::RequireAot)
        .expect_err("checks")
        .to_string();
    assert!(e.contains("without bounds checks"), "{e}");
}

#[cfg(feature = "compiler")]
#[test]
fn prefer_falls_back_to_the_jit_and_jit_only_ignores_artifacts() {
    let built = scale("scale2", 2.0);
    let changed = scale("scale2", 3.0);
    let records = leak(vec![record("scale2", built.content_hash())]);
    let dev = AotDevice::new(records, Policy::PreferAot).expect("device");
    assert_eq!(
        run(&dev, &changed).expect("JIT fallback"),
        vec![3.0, -10.5, 0.75]
    );
    // A record whose code disagrees with its kernel shows which path ran: JitOnly compiles
    // the kernel itself, so `scale(_, 2.0)` still doubles, through the JIT.
    let dev = AotDevice::new(records, Policy::JitOnly).expect("device");
    assert_eq!(run(&dev, &built).expect("JIT"), vec![2.0, -7.0, 0.5]);
}

fn text(code: &'static [u8], code_hash: u64) -> TextArtifact {
    TextArtifact {
        name: "scale2",
        content_hash: 7,
        target: "ptx",
        settings: &[("sm", "sm_90")],
        manifest_version: MANIFEST_VERSION,
        code,
        code_hash,
        manifest: "{}",
    }
}

#[test]
fn text_artifacts_check_hash_target_settings_version_and_code() {
    let code: &'static [u8] = b".version 8.0";
    let good = text(code, qforge_ir::cpu_abi::fnv1a(code));
    assert_eq!(
        good.code_for(7, "ptx", &[("sm", "sm_90")]).expect("ok"),
        code
    );
    let err = |r: crate::Result<&[u8]>| r.expect_err("refused").to_string();
    let e = err(good.code_for(8, "ptx", &[]));
    assert!(e.contains("'scale2'") && e.contains("stale"), "{e}");
    let e = err(good.code_for(7, "wgsl", &[]));
    assert!(e.contains("target 'ptx'"), "{e}");
    let e = err(good.code_for(7, "ptx", &[("sm", "sm_80")]));
    assert!(e.contains("sm=sm_90") && e.contains("sm=sm_80"), "{e}");
    let e = err(text(code, 1).code_for(7, "ptx", &[]));
    assert!(e.contains("corrupted"), "{e}");
    let mut old = text(code, qforge_ir::cpu_abi::fnv1a(code));
    old.manifest_version = 0;
    let e = err(old.code_for(7, "ptx", &[]));
    assert!(e.contains("manifest version 0"), "{e}");
}

/// `scale(_, 2.0)` run backwards: a record whose code is visibly not `doubled`.
unsafe extern "C" fn halved(args: *const u64, begin: u32, end: u32) {
    // SAFETY: as `doubled`.
    unsafe {
        let x = *args.add(1) as *mut f32;
        for i in begin..end {
            *x.add(i as usize) *= 0.5;
        }
    }
}

#[test]
fn llvm_records_are_preferred_at_the_same_level_and_set_the_vector_lanes() {
    let kernel = scale("scale2", 2.0);
    let hash = kernel.content_hash();
    let cranelift = record("scale2", hash);
    let mut llvm = record("scale2", hash);
    llvm.backend = "llvm";
    llvm.vector_lanes = 8;
    // A higher level wins over the backend: the baseline LLVM record loses to a v2 Cranelift
    // record (here with the wrong code, to see which ran).
    let mut v2 = record("scale2", hash);
    v2.level = "x86-64-v2";
    v2.entry = halved;
    let dev = AotDevice::new(leak(vec![llvm, cranelift]), Policy::RequireAot).expect("device");
    assert_eq!(dev.record_of(&kernel).map(|r| r.backend), Some("llvm"));
    assert_eq!(dev.caps().vector_lanes, 8);
    assert_eq!(dev.backend(), "llvm-aot");
    assert_eq!(run(&dev, &kernel).expect("runs"), vec![2.0, -7.0, 0.5]);
    let mut llvm = record("scale2", hash);
    llvm.backend = "llvm";
    let records = leak(vec![record("scale2", hash), llvm, v2]);
    let dev = AotDevice::new(records, Policy::RequireAot).expect("device");
    assert_eq!(dev.level_of(&kernel), Some("x86-64-v2"));
    assert_eq!(run(&dev, &kernel).expect("runs"), vec![0.5, -1.75, 0.125]);
    let dev = AotDevice::for_level(records, Policy::RequireAot, "x86-64").expect("device");
    assert_eq!(dev.record_of(&kernel).map(|r| r.backend), Some("llvm"));
    let cranelift_only =
        AotDevice::new(leak(vec![record("scale2", hash)]), Policy::RequireAot).expect("device");
    assert_eq!(cranelift_only.caps().vector_lanes, 4);
    assert_eq!(cranelift_only.backend(), "cranelift-aot");
}
