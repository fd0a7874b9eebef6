//! The `qforge` binary on bad input: each case gets a clear one-line error naming the file,
//! tensor or value, a non-zero exit, and no output file left behind.

use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::tensor::{Dtype, TensorView};

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

fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.to_string(),
                TensorView::new(*d, s.clone(), b).expect("valid view"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).expect("write test file");
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn good_file(dir: &Path) -> PathBuf {
    let p = dir.join("in.safetensors");
    let w: Vec<f32> = (0..8 * 64)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    write_st(
        &p,
        &[
            (
                "model.layers.0.mlp.down_proj.weight",
                Dtype::F32,
                vec![8, 64],
                f32s(&w),
            ),
            (
                "model.layers.0.mlp.down_proj.bias",
                Dtype::F32,
                vec![8],
                f32s(&[0.5; 8]),
            ),
            (
                "model.embed_tokens.weight",
                Dtype::F32,
                vec![4, 4],
                f32s(&[1.0; 16]),
            ),
        ],
    );
    p
}

/// Runs a failing command and checks exit code, message and that `out` was not created.
fn fails(args: &[&str], out: &Path, needle: &str) {
    let (code, _, err) = qforge(args);
    assert_ne!(code, 0, "{args:?} should fail");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one-line error expected: {err}"
    );
    assert!(
        err.contains(needle),
        "{args:?}: error should mention '{needle}': {err}"
    );
    assert!(!out.exists(), "{args:?} left an output file");
    let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary files left behind: {leftovers:?}"
    );
}

#[test]
fn bad_inputs_give_clear_errors_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    let out = dir.path().join("out.safetensors");
    let o = out.to_str().unwrap();
    let g = good.to_str().unwrap();

    let missing = dir.path().join("missing.safetensors");
    fails(
        &["quantize", missing.to_str().unwrap(), "-o", o],
        &out,
        "missing.safetensors",
    );

    let bytes = std::fs::read(&good).unwrap();
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    fails(
        &["quantize", truncated.to_str().unwrap(), "-o", o],
        &out,
        "truncated.safetensors",
    );

    let tiny = dir.path().join("tiny.safetensors");
    std::fs::write(&tiny, [1u8, 2, 3]).unwrap();
    fails(
        &["quantize", tiny.to_str().unwrap(), "-o", o],
        &out,
        "truncated",
    );

    let corrupt = dir.path().join("corrupt.safetensors");
    let mut c = bytes.clone();
    c[8] = b'[';
    std::fs::write(&corrupt, &c).unwrap();
    fails(
        &["quantize", corrupt.to_str().unwrap(), "-o", o],
        &out,
        "corrupt.safetensors",
    );

    // A header whose offsets point past the end of the file.
    let header = br#"{"w.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}}"#;
    let mut off = (header.len() as u64).to_le_bytes().to_vec();
    off.extend_from_slice(header);
    off.extend_from_slice(&[0u8; 16]);
    let offsets = dir.path().join("offsets.safetensors");
    std::fs::write(&offsets, &off).unwrap();
    fails(
        &["quantize", offsets.to_str().unwrap(), "-o", o],
        &out,
        "offsets.safetensors",
    );

    // A 2-D weight that no rule places (no config.json: the generic rules) names the tensor.
    let odd = dir.path().join("odd.safetensors");
    write_st(
        &odd,
        &[("proj.weight", Dtype::I32, vec![2, 2], vec![0u8; 16])],
    );
    fails(
        &["quantize", odd.to_str().unwrap(), "-o", o],
        &out,
        "tensor 'proj.weight': shape [2, 2]: cannot tell whether",
    );

    fails(
        &["quantize", g, "-o", o, "--blocksize", "48"],
        &out,
        "blocksize 48",
    );
    fails(
        &["quantize", g, "-o", o, "--quant-type", "int3"],
        &out,
        "int3",
    );
    fails(&["quantize", g, "-o", g], &out, "is the input file");

    let nan = dir.path().join("nan.safetensors");
    let mut w = vec![0.25f32; 8 * 64];
    w[77] = f32::NAN;
    let a = "model.layers.0.self_attn.q_proj.weight";
    write_st(&nan, &[(a, Dtype::F32, vec![8, 64], f32s(&w))]);
    fails(
        &["quantize", nan.to_str().unwrap(), "-o", o],
        &out,
        "'model.layers.0.self_attn.q_proj.weight' has a non-finite value NaN at flat index 77",
    );
    let (code, _, err) = qforge(&[
        "quantize",
        nan.to_str().unwrap(),
        "-o",
        o,
        "--allow-nonfinite",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.exists());
    std::fs::remove_file(&out).unwrap();

    fails(&["dequantize", g, "-o", o], &out, "no quantized weights");
    fails(
        &["quantize", g, "-o", o, "--device", "tpu"],
        &out,
        "unknown device 'tpu'",
    );
}

#[test]
fn quantize_then_dequantize_round_trips_the_layout() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    let q = dir.path().join("q.safetensors");
    let r = dir.path().join("r.safetensors");
    let (code, stdout, err) = qforge(&[
        "quantize",
        good.to_str().unwrap(),
        "-o",
        q.to_str().unwrap(),
        "--double-quant",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("model.layers.0.mlp.down_proj.weight"),
        "{stdout}"
    );
    let bytes = std::fs::read(&q).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<_> = st.names().into_iter().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.down_proj.bias",
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.mlp.down_proj.weight.absmax",
            "model.layers.0.mlp.down_proj.weight.nested_absmax",
            "model.layers.0.mlp.down_proj.weight.nested_quant_map",
            "model.layers.0.mlp.down_proj.weight.quant_map",
            "model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4",
        ]
    );
    let packed = st.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(
        (packed.dtype(), packed.shape()),
        (Dtype::U8, &[256usize, 1][..])
    );
    let json = st
        .tensor("model.layers.0.mlp.down_proj.weight.quant_state.bitsandbytes__nf4")
        .unwrap();
    let json = std::str::from_utf8(json.data()).unwrap();
    assert!(json.starts_with(r#"{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [8, 64], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": "#), "{json}");
    let (code, _, err) = qforge(&["dequantize", q.to_str().unwrap(), "-o", r.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let bytes = std::fs::read(&r).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 3);
    let w = st.tensor("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!((w.dtype(), w.shape()), (Dtype::F32, &[8usize, 64][..]));
}

#[test]
fn outputs_never_replace_what_they_must_not() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    let g = good.to_str().unwrap();

    // A directory (or device, pipe) at the output path is refused, never replaced.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let (code, _, err) = qforge(&["quantize", g, "-o", sub.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        err.contains("is a directory; refusing to replace it"),
        "{err}"
    );
    assert!(sub.is_dir());

    // A read-only existing output is refused.
    let ro = dir.path().join("ro.safetensors");
    std::fs::write(&ro, b"keep").unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    perm.set_readonly(true);
    std::fs::set_permissions(&ro, perm).unwrap();
    let (code, _, err) = qforge(&["quantize", g, "-o", ro.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(err.contains("read-only"), "{err}");
    assert_eq!(std::fs::read(&ro).unwrap(), b"keep");

    // A symlink is written through: the link stays, its target gets the output.
    let target = dir.path().join("target.safetensors");
    let link = dir.path().join("link.safetensors");
    std::fs::write(&target, b"old").unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, _, err) = qforge(&["quantize", g, "-o", link.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(safetensors::SafeTensors::deserialize(&std::fs::read(&target).unwrap()).is_ok());

    // Re-quantizing a quantized file is refused with the reason.
    let (code, _, err) = qforge(&[
        "quantize",
        target.to_str().unwrap(),
        "-o",
        dir.path().join("again.safetensors").to_str().unwrap(),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("already quantized"), "{err}");
}

#[test]
fn colliding_names_and_overflowing_offsets_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let o = out.to_str().unwrap();
    let collide = dir.path().join("collide.safetensors");
    write_st(
        &collide,
        &[
            (
                "model.layers.0.mlp.up_proj.weight",
                Dtype::F32,
                vec![8, 64],
                f32s(&[0.5; 512]),
            ),
            (
                "model.layers.0.mlp.up_proj.weight.absmax",
                Dtype::F32,
                vec![3],
                f32s(&[0.0; 3]),
            ),
        ],
    );
    fails(
        &["quantize", collide.to_str().unwrap(), "-o", o],
        &out,
        "'model.layers.0.mlp.up_proj.weight.absmax'",
    );

    // Finite weights whose absmax mean overflows f32 cannot be double-quantized.
    let big = dir.path().join("big.safetensors");
    write_st(
        &big,
        &[(
            "model.layers.0.mlp.up_proj.weight",
            Dtype::F32,
            vec![8, 64],
            f32s(&[3e38; 512]),
        )],
    );
    fails(
        &["quantize", big.to_str().unwrap(), "-o", o, "--double-quant"],
        &out,
        "'model.layers.0.mlp.up_proj.weight': double quantization needs a finite absmax mean",
    );
}

#[test]
fn config_json_always_describes_the_file_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let dst = dir.path().join("dst");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let input = good_file(&src);
    std::fs::write(
        src.join("config.json"),
        br#"{"hidden_size": 64, "model_type": "llama"}"#,
    )
    .unwrap();
    let out = dst.join("model.safetensors");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let (code, _, err) = qforge(&["quantize", i, "-o", o]);
    assert_eq!(code, 0, "{err}");
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let config = read(&dst.join("config.json"));
    assert_eq!(config["quantization_config"]["bnb_4bit_quant_type"], "nf4");
    assert_eq!(config["hidden_size"], 64);

    // The same run again: the config already says exactly this, so it is kept.
    let (code, _, err) = qforge(&["quantize", i, "-o", o]);
    assert_eq!(code, 0, "{err}");

    // A config.json that says something else (another quant type, or the copied original
    // without quantization_config) is an error naming it, unless --overwrite; nothing is
    // written then.
    let before = std::fs::read(&out).unwrap();
    for other in [
        &["--quant-type", "fp4"][..],
        &["--quant-type", "int8-blockwise"],
    ] {
        let mut args = vec!["quantize", i, "-o", o];
        args.extend_from_slice(other);
        let (code, _, err) = qforge(&args);
        assert_ne!(
            code, 0,
            "{other:?}: a config.json that says something else must be refused"
        );
        assert!(
            err.contains("config.json exists and does not describe the output"),
            "{err}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), before, "{other:?}");
    }
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let (code, _, err) = qforge(&["quantize", i, "-o", o]);
    assert_ne!(code, 0);
    assert!(err.contains("--overwrite"), "{err}");
    let (code, _, err) = qforge(&["quantize", i, "-o", o, "--overwrite"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        read(&dst.join("config.json"))["quantization_config"]["quant_method"],
        "bitsandbytes"
    );

    // Writing next to the input never replaces the input's config.json (it describes the
    // input's own checkpoint) and says so.
    let out3 = src.join("model-nf4.safetensors");
    let (code, stdout, _) = qforge(&["quantize", i, "-o", out3.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(stdout.contains("config.json not written"), "{stdout}");
    assert_eq!(
        std::fs::read(src.join("config.json")).unwrap(),
        br#"{"hidden_size": 64, "model_type": "llama"}"#
    );
}

/// A tensor's dtype, shape and bytes.
type Tensor = (Dtype, Vec<usize>, Vec<u8>);

/// Rewrites a quantized file with one tensor replaced (or removed when `replacement` is `None`).
fn mutate(src: &Path, dst: &Path, name: &str, replacement: Option<Tensor>) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let names: Vec<String> = st.names().into_iter().cloned().collect();
    for n in &names {
        let t = st.tensor(n).unwrap();
        if n != name {
            tensors.push((n.as_str(), t.dtype(), t.shape().to_vec(), t.data().to_vec()));
        }
    }
    if let Some((d, s, b)) = replacement {
        tensors.push((name, d, s, b));
    }
    write_st(dst, &tensors);
}

#[test]
fn dequantize_rejects_inconsistent_quant_states() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    let q = dir.path().join("q.safetensors");
    let (code, _, err) = qforge(&[
        "quantize",
        good.to_str().unwrap(),
        "-o",
        q.to_str().unwrap(),
        "--double-quant",
    ]);
    assert_eq!(code, 0, "{err}");
    let out = dir.path().join("out.safetensors");
    let o = out.to_str().unwrap();
    let w = "model.layers.0.mlp.down_proj.weight";
    let state = format!("{w}.quant_state.bitsandbytes__nf4");
    let json = |text: &str| Some((Dtype::U8, vec![text.len()], text.as_bytes().to_vec()));
    let cases: Vec<(&str, Option<Tensor>, &str)> = vec![
        (
            state.as_str(),
            json("{not json"),
            "quant state JSON is malformed",
        ),
        (
            state.as_str(),
            json(r#"{"quant_type": "fp4", "blocksize": 64, "dtype": "float32", "shape": [8, 64]}"#),
            "its JSON says quant_type 'fp4'",
        ),
        (
            state.as_str(),
            json(
                r#"{"quant_type": "nf4", "blocksize": 48, "dtype": "float32", "shape": [8, 64], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5}"#,
            ),
            "blocksize 48",
        ),
        (
            state.as_str(),
            json(
                r#"{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [8, 64], "nested_blocksize": 128, "nested_dtype": "float32", "nested_offset": 0.5}"#,
            ),
            "nested_blocksize 128",
        ),
        (
            state.as_str(),
            json(
                r#"{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [8, 65], "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5}"#,
            ),
            "packed",
        ),
        (
            "model.layers.0.mlp.down_proj.weight.quant_map",
            Some((Dtype::F32, vec![16], f32s(&[0.5; 16]))),
            "custom code tables are not supported",
        ),
        (
            "model.layers.0.mlp.down_proj.weight.nested_absmax",
            None,
            "companion tensor 'model.layers.0.mlp.down_proj.weight.nested_absmax' is missing",
        ),
        (
            "model.layers.0.mlp.down_proj.weight.absmax",
            Some((Dtype::U8, vec![7], vec![0; 7])),
            "qabsmax",
        ),
    ];
    for (i, (name, replacement, needle)) in cases.into_iter().enumerate() {
        let bad = dir.path().join(format!("bad{i}.safetensors"));
        mutate(&q, &bad, name, replacement);
        let (code, _, err) = qforge(&["dequantize", bad.to_str().unwrap(), "-o", o]);
        assert_ne!(code, 0, "case {i} should fail");
        assert!(
            err.contains("'model.layers.0.mlp.down_proj.weight'") && err.contains(needle),
            "case {i}: {err}"
        );
        assert!(!out.exists());
    }
}

/// `quantize --device wgpu` writes the same bytes as the CPU device (skipped, with the reason,
/// when no wgpu adapter can start here).
#[cfg(feature = "wgpu")]
#[test]
fn quantize_on_wgpu_writes_the_same_bytes_as_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let good = good_file(dir.path());
    for extra in [
        &["--double-quant"][..],
        &["--quant-type", "fp4", "--blocksize", "128"],
        &["--quant-type", "int8-blockwise"],
    ] {
        let mut outs = Vec::new();
        for device in ["cpu", "wgpu"] {
            let out = dir.path().join(format!("{device}.safetensors"));
            let mut args = vec![
                "quantize",
                good.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--device",
                device,
            ];
            args.extend_from_slice(extra);
            let (code, _, err) = qforge(&args);
            if device == "wgpu" && code != 0 && err.contains("adapter") {
                qforge_testkit::unavailable("wgpu", err);
                return;
            }
            assert_eq!(code, 0, "{device} {extra:?}: {err}");
            outs.push(std::fs::read(&out).unwrap());
        }
        assert!(
            outs[0] == outs[1],
            "{extra:?}: wgpu output differs from cpu output"
        );
    }
}
