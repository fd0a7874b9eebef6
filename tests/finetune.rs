//! `qforge finetune`: the built-in synthetic run and a run on the real MiniLM checkpoint reduce
//! the held-out error of the NF4 blocks, the merged layer matches the unmerged adapter, the
//! outputs are written, and bad options are clear errors.

use std::path::Path;
use std::process::Command;

use qforge::finetune::{run, write_outputs, FinetuneOptions, FtOptimizer};
use qforge::runtime::CpuDevice;

fn qforge(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qforge"))
        .args(args)
        .output()
        .expect("binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn minilm() -> Option<std::path::PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/models/all-MiniLM-L6-v2/model.safetensors");
    if p.is_file() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{} is missing under CI",
        p.display()
    );
    println!("skipped: {} is missing", p.display());
    None
}

/// Measured (2026-11-29, 200 steps, rank 16, lr 1e-3, batches of 64 of 1024 rows, 256
/// held-out rows): MiniLM layer 0 goes from 0.0980 to 0.0511 (4-bit ZIP-SR), 0.0504 (4-bit
/// ZE-EDEN), 0.0502 (8-bit AdamW), 0.0503 (32-bit AdamW), ratio about 0.52; merged equal, merged
/// and re-quantized about 0.074. The synthetic model goes from 0.1267 to 0.1006 (ratio 0.79; its
/// adapter tensors are under 4096 values, so every optimizer keeps them in f32). The runs are
/// deterministic (fixed seeds, bit-exact kernels); the thresholds sit between the measured
/// ratios and 1, so a change that stops the training from helping fails.
#[test]
fn synthetic_run_reduces_the_error_and_merges_exactly() {
    let dev = CpuDevice::new().unwrap();
    let (r, merged) = run(&dev, &FinetuneOptions::default(), |_, _, _| {}).unwrap();
    println!("{}", r.table());
    assert!(
        r.err_after < 0.85 * r.err_before,
        "{} -> {}",
        r.err_before,
        r.err_after
    );
    assert!((r.err_merged - r.err_after).abs() <= 1e-4 * r.err_after);
    assert_eq!(r.losses.len(), 200);
    assert_eq!(r.losses[199].1, 0.0, "beta reaches 0");
    let dir = tempfile::tempdir().unwrap();
    write_outputs(dir.path(), &r, &merged).unwrap();
    let csv = std::fs::read_to_string(dir.path().join("loss.csv")).unwrap();
    assert_eq!(csv.lines().count(), 201);
    let svg = std::fs::read_to_string(dir.path().join("loss.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    let st = std::fs::read(dir.path().join("merged.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st).unwrap();
    assert_eq!(
        st.tensor("encoder.layer.0.output.dense.weight")
            .unwrap()
            .shape(),
        &[64, 256]
    );
}

#[test]
fn minilm_run_reduces_the_held_out_error() {
    let Some(model) = minilm() else { return };
    let dev = CpuDevice::new().unwrap();
    for optimizer in [
        FtOptimizer::Adamw4bitZipSr,
        FtOptimizer::Adamw4bitZeEden,
        FtOptimizer::Adamw8bit,
        FtOptimizer::Adamw,
    ] {
        let o = FinetuneOptions {
            model: Some(model.clone()),
            optimizer,
            ..FinetuneOptions::default()
        };
        let (r, _) = run(&dev, &o, |_, _, _| {}).unwrap();
        println!("{optimizer:?}\n{}", r.table());
        assert!(
            r.err_after < 0.65 * r.err_before,
            "{} -> {}",
            r.err_before,
            r.err_after
        );
        assert!((r.err_merged - r.err_after).abs() <= 1e-4 * r.err_after);
        assert!(r.err_merged_nf4 < r.err_before);
    }
}

#[test]
fn cli_prints_the_json_line_last_and_rejects_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (code, stdout, stderr) = qforge(&[
        "finetune",
        "--steps",
        "20",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    for key in [
        "layers",
        "steps",
        "err_before",
        "err_after",
        "err_merged",
        "steps_per_s",
        "optimizer_state_bytes",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {last}");
    }
    assert_eq!(v["steps"], 20);
    assert!(out.join("merged.safetensors").is_file());
    let missing = dir.path().join("nope.safetensors");
    for (args, want) in [
        (vec!["finetune", "--rank", "0"], "--rank"),
        (
            vec!["finetune", "--optimizer", "sgd9"],
            "unknown optimizer 'sgd9'",
        ),
        (vec!["finetune", "--steps", "0"], "--steps"),
        (
            vec!["finetune", "--model", missing.to_str().unwrap()],
            "nope.safetensors",
        ),
    ] {
        let (code, _, stderr) = qforge(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    if let Some(model) = minilm() {
        let (code, _, stderr) = qforge(&[
            "finetune",
            "--model",
            model.to_str().unwrap(),
            "--layers",
            "9",
            "--steps",
            "1",
        ]);
        assert_eq!(code, 2);
        assert!(
            stderr.contains("encoder.layer.9.intermediate.dense.weight"),
            "{stderr}"
        );
    }
}
