//! transformers loads what `qforge quantize` writes, exactly as bitsandbytes would have quantized
//! it: tiny models built by transformers itself (`scripts/hf_models.py`: GPT-2 with `Conv1D` and a
//! tied head, Llama untied (bf16, sharded) and tied (f16), BERT, Qwen2-MoE and Mixtral) are
//! quantized by the `qforge` binary with several option sets, loaded with transformers, and
//! compared with bitsandbytes' on-the-fly quantization of the original folder with the same
//! options (`scripts/hf_check.py`): the same modules quantized, every quantized tensor identical
//! byte for byte, identical logits. The only differences allowed are bitsandbytes' CPU-path
//! differences that `docs/compat.md` documents, each proven element by element and counted: the
//! sign of FP4 zero codes (category (b); outputs still identical) and double-quantization codes
//! where bitsandbytes' CPU LUT quantizer misses the nearest code (category (c); qforge's code is
//! the nearer neighbour; it changes that block's scale and so the logits). `dequantize`'s output
//! is compared byte for byte with bitsandbytes' dequantization of the same quantized checkpoint,
//! and the int8-blockwise layout must be refused by transformers.
//!
//! Needs the Python of `scripts/install-transformers.sh` (`target/transformers-venv`, or
//! `QFORGE_TRANSFORMERS_PYTHON`); without it the test reports `transformers` unavailable
//! (a skip, or a failure where it is required: docs/testing.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's python, if it imports torch, transformers and bitsandbytes.
fn python() -> Option<PathBuf> {
    let py = std::env::var_os("QFORGE_TRANSFORMERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/transformers-venv/bin/python"));
    if !py.exists() {
        qforge_testkit::unavailable(
            "transformers",
            format!(
                "{} is missing (run scripts/install-transformers.sh)",
                py.display()
            ),
        );
        return None;
    }
    let ok = Command::new(&py)
        .args(["-c", "import torch, transformers, bitsandbytes"])
        .env("HF_HUB_OFFLINE", "1")
        .output();
    match ok {
        Ok(o) if o.status.success() => Some(py),
        Ok(o) => {
            qforge_testkit::unavailable(
                "transformers",
                format!(
                    "{} cannot import torch, transformers, bitsandbytes: {}",
                    py.display(),
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ),
            );
            None
        }
        Err(e) => {
            qforge_testkit::unavailable("transformers", format!("{}: {e}", py.display()));
            None
        }
    }
}

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

/// One conversion and its check.
struct Case {
    job: String,
    model: &'static str,
    args: Vec<&'static str>,
    /// What hf_check.py compares (its JSON job, less paths).
    check: Value,
}

fn case(model: &'static str, tag: &str, args: &[&'static str], check: Value) -> Case {
    Case {
        job: format!("{model}/{tag}"),
        model,
        args: args.to_vec(),
        check,
    }
}

fn four_bit(qt: &str, double: bool, storage: &str) -> Value {
    json!({"check": "quantized", "format": "4bit", "quant_type": qt, "double_quant": double,
           "quant_storage": storage})
}

fn cases() -> Vec<Case> {
    let int8 = json!({"check": "quantized", "format": "int8"});
    let mut cases = Vec::new();
    for m in [
        "gpt2",
        "llama-untied",
        "llama-tied",
        "bert",
        "qwen2-moe",
        "mixtral",
    ] {
        cases.push(case(m, "nf4", &[], four_bit("nf4", false, "uint8")));
        cases.push(case(m, "int8", &["--quant-type", "int8"], int8.clone()));
    }
    cases.push(case(
        "gpt2",
        "fp4-bf16-storage",
        &["--quant-type", "fp4", "--quant-storage", "bfloat16"],
        four_bit("fp4", false, "bfloat16"),
    ));
    cases.push(case(
        "llama-untied",
        "nf4-f32-storage",
        &["--quant-storage", "float32"],
        four_bit("nf4", false, "float32"),
    ));
    // Kept Linear modules are listed in llm_int8_skip_modules; bitsandbytes gets the same list.
    cases.push(case(
        "llama-untied",
        "skip-down-proj",
        &["--skip", "down_proj"],
        json!({"check": "quantized", "format": "4bit", "quant_type": "nf4", "double_quant": false,
               "quant_storage": "uint8", "skip_from_config": true}),
    ));
    // Double quantization: byte-identical once the offset follows torch's CPU mean.
    for m in ["gpt2", "llama-tied", "qwen2-moe"] {
        cases.push(case(
            m,
            "nf4-double",
            &["--double-quant"],
            four_bit("nf4", true, "uint8"),
        ));
    }
    cases.push(case(
        "llama-tied",
        "int8-blockwise",
        &["--quant-type", "int8-blockwise"],
        json!({"check": "refused"}),
    ));
    cases
}

fn run_checks(py: &Path, jobs: &[Value]) -> Vec<Value> {
    let mut child = Command::new(py)
        .arg(root().join("scripts/hf_check.py"))
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("hf_check.py starts");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for j in jobs {
            writeln!(stdin, "{j}").expect("write job");
        }
    }
    let out = child.wait_with_output().expect("hf_check.py runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("hf_check.py prints JSON lines"))
        .collect()
}

#[test]
fn transformers_loads_every_output_as_bitsandbytes_quantizes_it() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    let built = Command::new(&py)
        .arg(root().join("scripts/hf_models.py"))
        .arg(&models)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("hf_models.py runs");
    assert!(
        built.status.success(),
        "hf_models.py failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut kinds = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&built.stdout).lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        kinds.insert(
            v["name"].as_str().unwrap().to_string(),
            v["kind"].as_str().unwrap().to_string(),
        );
    }
    let mut jobs = Vec::new();
    for c in cases() {
        let orig = models.join(c.model);
        let out = dir.path().join("out").join(c.job.replace('/', "-"));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut args = vec![
            "quantize",
            orig.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend(&c.args);
        let (code, stdout, err) = qforge(&args);
        assert_eq!(code, 0, "{}: qforge quantize failed: {err}", c.job);
        // The folder is complete: config, shards, the input's other files.
        for f in ["config.json", "tokenizer.json"] {
            assert!(out.join(f).is_file(), "{}: {f} missing", c.job);
        }
        // The config says what the checkpoint holds.
        let config: Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        let q = &config["quantization_config"];
        match c.check["format"].as_str() {
            Some("4bit") => {
                for (key, want) in [
                    ("bnb_4bit_quant_type", &c.check["quant_type"]),
                    ("bnb_4bit_use_double_quant", &c.check["double_quant"]),
                    ("bnb_4bit_quant_storage", &c.check["quant_storage"]),
                ] {
                    assert_eq!(&q[key], want, "{}: config {key}", c.job);
                }
                assert_eq!(q["load_in_4bit"], json!(true), "{}", c.job);
            }
            Some("int8") => assert_eq!(q["load_in_8bit"], json!(true), "{}", c.job),
            _ => assert!(q.get("quant_method").is_none(), "{}: {q}", c.job),
        }
        let mut job = c.check.clone();
        job["job"] = json!(c.job);
        job["orig"] = json!(orig);
        job["out"] = json!(out);
        job["kind"] = json!(kinds[c.model]);
        if job["skip_from_config"] == json!(true) {
            let config: Value =
                serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
            let skip = config["quantization_config"]["llm_int8_skip_modules"].clone();
            assert!(
                skip.as_array().unwrap().len() > 1,
                "{}: {skip} {stdout}",
                c.job
            );
            job["skip_modules"] = skip;
        }
        jobs.push(job.clone());
        // dequantize's output against bitsandbytes' own dequantization.
        if c.check["check"] == "quantized" && !c.args.contains(&"--skip") {
            let restored = dir.path().join("restored").join(c.job.replace('/', "-"));
            std::fs::create_dir_all(restored.parent().unwrap()).unwrap();
            let (code, _, err) = qforge(&[
                "dequantize",
                out.to_str().unwrap(),
                "-o",
                restored.to_str().unwrap(),
            ]);
            assert_eq!(code, 0, "{}: qforge dequantize failed: {err}", c.job);
            let mut r = job.clone();
            r["job"] = json!(format!("{}/restored", c.job));
            r["check"] = json!("restored");
            r["restored"] = json!(restored);
            jobs.push(r);
        }
    }
    let results = run_checks(&py, &jobs);
    assert_eq!(results.len(), jobs.len(), "hf_check.py answered every job");
    let mut failures = Vec::new();
    for r in &results {
        let job = r["job"].as_str().unwrap();
        let ok = r["ok"] == json!(true);
        let bad: Vec<String> = r["tensors"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v[0] != json!(0))
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        println!(
            "{job}: {} (outputs equal {}, max |diff| {}, {} tensors compared, documented \
             bitsandbytes-CPU differences {})",
            if ok { "ok" } else { "FAILED" },
            r["outputs_equal"],
            r["max_abs_diff"],
            r["tensors"].as_object().unwrap().len(),
            r.get("explained").unwrap_or(&json!({}))
        );
        if !ok {
            failures.push(format!(
                "{job}: modules differing {}; tensors differing [{}]; error {}",
                r["modules"],
                bad.join("; "),
                r.get("error").unwrap_or(&json!(null))
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
