//! The `qforge` process around its outputs: SIGTERM and Ctrl-C remove what was being written and
//! exit 143 / 130; runs writing into one folder are serialized by a lock; temporary files of
//! killed runs are removed by the next run; `finetune --layers 99` without `--model` is an error.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qforge"))
}

/// A Llama-layout file with one `[rows, 1024]` f32 weight, and a config beside it.
fn model(dir: &Path, rows: usize) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    let n = rows * 1024;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| (((i * 7919) % 2003) as f32 / 1001.0 - 1.0).to_le_bytes())
        .collect();
    let header = json!({
        "model.layers.0.mlp.down_proj.weight":
            {"dtype": "F32", "shape": [rows, 1024], "data_offsets": [0, data.len()]}
    })
    .to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    let p = dir.join("model.safetensors");
    std::fs::write(&p, file).unwrap();
    p
}

fn temps(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".qforge-"))
        .collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "gave up waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn signals_remove_the_partial_output_and_exit_128_plus_the_signal() {
    let tmp = tempfile::tempdir().unwrap();
    // The interpreter device is slow: the run is still writing when the signal comes.
    let input = model(&tmp.path().join("in"), 1024);
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let out_dir = tmp.path().join(format!("out-{sig}"));
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join("model.safetensors");
        let mut child = bin()
            .args(["quantize", input.to_str().unwrap(), "-o"])
            .arg(&out)
            .args(["--device", "interpreter"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("the temporary output", || !temps(&out_dir).is_empty());
        // SAFETY: kill(2) on the pid of a child this test started and has not waited for.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(code), "signal {sig}: {err}");
        assert!(err.contains("no output written"), "{err}");
        assert!(!out.exists(), "signal {sig} left an output");
        assert!(
            !out_dir.join("config.json").exists(),
            "signal {sig} left a config"
        );
        assert!(temps(&out_dir).is_empty(), "{:?}", temps(&out_dir));
    }
}

#[test]
fn runs_into_one_folder_are_serialized() {
    let tmp = tempfile::tempdir().unwrap();
    let input = model(&tmp.path().join("in"), 64);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("model.safetensors");
    // Another writer holds the folder's lock: the run waits, says so, and writes only after.
    let holder = std::fs::File::open(&out_dir).unwrap();
    holder.lock().unwrap();
    let mut child = bin()
        .args(["quantize", input.to_str().unwrap(), "-o"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines
        .next()
        .expect("qforge printed nothing on stderr: it did not wait for the folder's lock")
        .unwrap();
    assert!(
        first.contains("waiting for another qforge run writing into"),
        "{first}"
    );
    assert!(!out.exists() && temps(&out_dir).is_empty());
    holder.unlock().unwrap();
    assert!(child.wait().unwrap().success());
    assert!(out.exists());

    // Two runs at once with different formats: the file and its config always agree.
    let runs: Vec<_> = ["nf4", "fp4"]
        .iter()
        .map(|qt| {
            bin()
                .args(["quantize", input.to_str().unwrap(), "-o"])
                .arg(&out)
                .args(["--quant-type", qt, "--overwrite"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut r in runs {
        assert!(r.wait().unwrap().success());
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("config.json")).unwrap()).unwrap();
    let qt = config["quantization_config"]["bnb_4bit_quant_type"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(
        st.names()
            .iter()
            .any(|n| n.ends_with(&format!("bitsandbytes__{qt}"))),
        "config says {qt}, the file has {:?}",
        st.names()
    );
}

#[test]
fn leftovers_of_killed_runs_are_removed_and_live_ones_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let input = model(&tmp.path().join("in"), 8);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir_all(out_dir.join(".qforge-4000000-2.tmpdir")).unwrap();
    std::fs::write(out_dir.join(".qforge-4000000-2.tmpdir/shard"), b"x").unwrap();
    std::fs::write(out_dir.join(".qforge-4000000-1.tmp"), b"partial").unwrap();
    std::fs::write(out_dir.join("unrelated.tmp"), b"mine").unwrap();
    // A temporary file some live run still holds (locked) is not touched.
    let live = out_dir.join(".qforge-4000001-3.tmp");
    std::fs::write(&live, b"live").unwrap();
    let held = std::fs::File::open(&live).unwrap();
    held.lock().unwrap();
    let status = bin()
        .args(["quantize", input.to_str().unwrap(), "-o"])
        .arg(out_dir.join("model.safetensors"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let mut left = temps(&out_dir);
    left.sort();
    assert_eq!(left, [".qforge-4000001-3.tmp"]);
    assert!(out_dir.join("unrelated.tmp").exists());
    drop(held);
}

#[test]
fn finetune_layers_past_the_synthetic_model_are_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("ft");
    let o = bin()
        .args(["finetune", "--layers", "99", "--steps", "1", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the built-in synthetic model has layers 0..=5; --layers 99 needs --model"),
        "{err}"
    );
    assert!(!out.join("merged.safetensors").exists());
}
