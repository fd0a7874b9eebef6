//! `qforge quantize` / `dequantize` on Hugging Face model folders and on the inputs people have:
//! sharded checkpoints in and out (index, shard sizes, config.json, copied files, --overwrite),
//! architecture-aware module selection with a truthful `llm_int8_skip_modules`, GPT-2 `Conv1D`
//! weights, chunked processing equal to one launch, dtypes copied through, pickle files refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

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

fn ok(args: &[&str]) -> String {
    let (code, out, err) = qforge(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

fn fails(args: &[&str], needle: &str) -> String {
    let (code, _, err) = qforge(args);
    assert_ne!(code, 0, "{args:?} should fail");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: want '{needle}': {err}");
    err
}

/// A tensor for [`write_st`]: name, dtype name, shape, bytes.
type T = (String, &'static str, Vec<usize>, Vec<u8>);

/// Writes a safetensors file by hand (any dtype name, as transformers' writer lays it out).
fn write_st(path: &Path, tensors: &[T]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut at = 0usize;
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + bytes.len()]}),
        );
        at += bytes.len();
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_string(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(h.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(path, file).unwrap();
}

/// Deterministic pseudo-random f32 values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bf16b(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

fn t(name: &str, dtype: &'static str, shape: &[usize], bytes: Vec<u8>) -> T {
    (name.to_string(), dtype, shape.to_vec(), bytes)
}

/// A tiny Llama-layout folder: 2 layers, bf16, in `shards` shards with an index.
fn llama_folder(dir: &Path, shards: usize) -> PathBuf {
    std::fs::create_dir_all(dir.join("extra")).unwrap();
    let (h, f) = (64usize, 96usize);
    let mut all: Vec<T> = vec![
        t(
            "model.embed_tokens.weight",
            "BF16",
            &[32, h],
            bf16b(&values(32 * h, 1)),
        ),
        t("model.norm.weight", "BF16", &[h], bf16b(&vec![1.0; h])),
        t(
            "lm_head.weight",
            "BF16",
            &[32, h],
            bf16b(&values(32 * h, 2)),
        ),
    ];
    for l in 0..2 {
        for (i, (n, shape)) in [
            ("self_attn.q_proj", [h, h]),
            ("self_attn.k_proj", [32, h]),
            ("self_attn.v_proj", [32, h]),
            ("self_attn.o_proj", [h, h]),
            ("mlp.gate_proj", [f, h]),
            ("mlp.up_proj", [f, h]),
            ("mlp.down_proj", [h, f]),
        ]
        .into_iter()
        .enumerate()
        {
            let name = format!("model.layers.{l}.{n}.weight");
            let v = values(shape[0] * shape[1], 10 + 10 * l as u64 + i as u64);
            all.push((name, "BF16", shape.to_vec(), bf16b(&v)));
        }
        all.push(t(
            &format!("model.layers.{l}.input_layernorm.weight"),
            "BF16",
            &[h],
            bf16b(&vec![1.0; h]),
        ));
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let per = all.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    if shards == 1 {
        write_st(&dir.join("model.safetensors"), &all);
    } else {
        for (s, part) in all.chunks(per).enumerate() {
            let name = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
            write_st(&dir.join(&name), part);
            for (n, ..) in part {
                weight_map.insert(n.clone(), json!(name));
            }
        }
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_string_pretty(
                &json!({"metadata": {"total_size": 1}, "weight_map": weight_map}),
            )
            .unwrap(),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&json!({"model_type": "llama", "hidden_size": h,
            "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": false}))
        .unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), b"{\"tok\": 1}").unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        b"{\"do_sample\": false}",
    )
    .unwrap();
    std::fs::write(dir.join("extra/notes.txt"), b"kept").unwrap();
    dir.to_path_buf()
}

/// Every tensor of a model folder (or file): name -> (dtype, shape, bytes), following the index.
fn read_model(path: &Path) -> std::collections::BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut f: Vec<PathBuf> = std::fs::read_dir(path)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        f.sort();
        f
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = std::collections::BTreeMap::new();
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: serde_json::Map<String, Value> =
            serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        for (name, v) in header {
            if name == "__metadata__" {
                continue;
            }
            let o = v["data_offsets"].as_array().unwrap();
            let (b, e) = (
                o[0].as_u64().unwrap() as usize,
                o[1].as_u64().unwrap() as usize,
            );
            let shape = v["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            out.insert(
                name,
                (
                    v["dtype"].as_str().unwrap().to_string(),
                    shape,
                    bytes[8 + n + b..8 + n + e].to_vec(),
                ),
            );
        }
    }
    out
}

fn config(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn sharded_folders_round_trip_with_index_config_and_companion_files() {
    let tmp = tempfile::tempdir().unwrap();
    let input = llama_folder(&tmp.path().join("in"), 3);
    let out = tmp.path().join("out");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let stdout = ok(&["quantize", i, "-o", o, "--max-shard-size", "20KB"]);
    assert!(stdout.contains("14 tensors quantized"), "{stdout}");
    // Shards of at most 20 KB (a tensor group larger than that gets a shard of its own), and an
    // index that names every tensor's shard correctly.
    let index: Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let wm = index["weight_map"].as_object().unwrap();
    let shards: std::collections::BTreeSet<&str> =
        wm.values().map(|v| v.as_str().unwrap()).collect();
    assert!(shards.len() > 2, "{shards:?}");
    for s in &shards {
        let file = out.join(s);
        let tensors = read_model(&file);
        for name in tensors.keys() {
            assert_eq!(wm[name], json!(s), "{name} is in {s}");
        }
        let size = std::fs::metadata(&file).unwrap().len();
        assert!(
            size <= 20_000 || tensors.len() <= 6,
            "{s}: {size} bytes, {} tensors",
            tensors.len()
        );
    }
    assert_eq!(wm.len(), read_model(&out).len());
    // config.json: the input's keys plus a truthful quantization_config.
    let c = config(&out);
    assert_eq!(c["hidden_size"], 64);
    let q = &c["quantization_config"];
    assert_eq!(q["load_in_4bit"], true);
    assert_eq!(q["llm_int8_skip_modules"], json!(["lm_head"]));
    // The folder's other files are copied, weights are not.
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        b"{\"tok\": 1}"
    );
    assert!(out.join("generation_config.json").is_file());
    assert_eq!(std::fs::read(out.join("extra/notes.txt")).unwrap(), b"kept");
    // No temporary leftovers beside the output.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".qforge-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // A folder gives a folder: a file name as its output is refused.
    let as_file = tmp.path().join("out.safetensors");
    fails(
        &["quantize", i, "-o", as_file.to_str().unwrap()],
        "is a model folder, so the output is a folder too",
    );
    assert!(!as_file.exists());

    // An existing output folder is refused, then replaced with --overwrite.
    fails(
        &["quantize", i, "-o", o],
        "already exists; pass --overwrite",
    );
    std::fs::write(out.join("stale.txt"), b"old").unwrap();
    ok(&["quantize", i, "-o", o, "--overwrite", "--quant-type", "fp4"]);
    assert!(
        !out.join("stale.txt").exists(),
        "the old folder is replaced whole"
    );
    assert_eq!(
        config(&out)["quantization_config"]["bnb_4bit_quant_type"],
        "fp4"
    );
    assert_eq!(
        read_model(&out).len(),
        read_model(&input).len() + 14 * 3,
        "each quantized weight gains absmax, quant_map and the quant state"
    );

    // dequantize restores a folder: same tensor names, shapes and dtypes, the unquantized tensors
    // byte for byte, and a config without quantization_config.
    let back = tmp.path().join("back");
    ok(&["dequantize", o, "-o", back.to_str().unwrap()]);
    let (a, b) = (read_model(&input), read_model(&back));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, (dtype, shape, bytes)) in &a {
        assert_eq!((&b[name].0, &b[name].1), (dtype, shape), "{name}");
        if !name.contains("proj") {
            assert_eq!(&b[name].2, bytes, "{name}");
        }
    }
    assert!(config(&back).get("quantization_config").is_none());
    assert!(back.join("tokenizer.json").is_file());
}

#[test]
fn skipped_modules_are_listed_and_unknown_weights_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let input = llama_folder(&tmp.path().join("in"), 1);
    let i = input.to_str().unwrap();
    let out = tmp.path().join("skip");
    ok(&[
        "quantize",
        i,
        "-o",
        out.to_str().unwrap(),
        "--skip",
        "down_proj",
    ]);
    assert_eq!(
        config(&out)["quantization_config"]["llm_int8_skip_modules"],
        json!([
            "layers.0.mlp.down_proj",
            "layers.1.mlp.down_proj",
            "lm_head"
        ])
    );
    let q = read_model(&out);
    assert_eq!(q["model.layers.0.mlp.down_proj.weight"].0, "BF16");
    assert_eq!(q["model.layers.0.mlp.up_proj.weight"].0, "U8");
    // `--skip '^$'` quantizes no embedding: embeddings are never Linear.
    let out2 = tmp.path().join("noskip");
    ok(&["quantize", i, "-o", out2.to_str().unwrap(), "--skip", "^$"]);
    assert_eq!(read_model(&out2)["model.embed_tokens.weight"].0, "BF16");

    // A 2-D weight the architecture table cannot place is an error naming it, unless kept.
    let odd = tmp.path().join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::write(odd.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    write_st(
        &odd.join("model.safetensors"),
        &[
            t(
                "model.layers.0.mlp.down_proj.weight",
                "F32",
                &[8, 64],
                f32b(&values(512, 3)),
            ),
            t(
                "model.layers.0.router.weight",
                "F32",
                &[4, 64],
                f32b(&values(256, 4)),
            ),
        ],
    );
    let o3 = tmp.path().join("odd-out");
    let err = fails(
        &[
            "quantize",
            odd.to_str().unwrap(),
            "-o",
            o3.to_str().unwrap(),
        ],
        "'model.layers.0.router.weight'",
    );
    assert!(
        err.contains("model_type 'llama'") && err.contains("--skip"),
        "{err}"
    );
    assert!(!o3.exists());
    ok(&[
        "quantize",
        odd.to_str().unwrap(),
        "-o",
        o3.to_str().unwrap(),
        "--skip",
        "router",
    ]);
    assert_eq!(
        config(&o3)["quantization_config"]["llm_int8_skip_modules"],
        json!(["layers.0.router", "lm_head"])
    );
}

#[test]
fn gpt2_conv1d_weights_are_transposed_like_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("gpt2");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"model_type": "gpt2"}"#).unwrap();
    // Conv1D stores [in, out]: c_fc is 64 -> 256.
    let w = values(64 * 256, 7);
    write_st(
        &dir.join("model.safetensors"),
        &[
            t(
                "transformer.h.0.mlp.c_fc.weight",
                "F32",
                &[64, 256],
                f32b(&w),
            ),
            t(
                "transformer.wte.weight",
                "F32",
                &[16, 64],
                f32b(&values(1024, 8)),
            ),
        ],
    );
    for qt in ["nf4", "int8"] {
        let out = tmp.path().join(format!("q-{qt}"));
        ok(&[
            "quantize",
            dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--quant-type",
            qt,
        ]);
        let q = read_model(&out);
        if qt == "nf4" {
            let state = &q["transformer.h.0.mlp.c_fc.weight.quant_state.bitsandbytes__nf4"].2;
            let state = String::from_utf8_lossy(state);
            assert!(state.contains("\"shape\": [256, 64]"), "{state}");
        } else {
            assert_eq!(q["transformer.h.0.mlp.c_fc.weight"].1, [256, 64]);
            assert_eq!(q["transformer.h.0.mlp.c_fc.SCB"].1, [256]);
        }
        // dequantize gives the Conv1D layout back, close to the original values.
        let back = tmp.path().join(format!("back-{qt}"));
        ok(&[
            "dequantize",
            out.to_str().unwrap(),
            "-o",
            back.to_str().unwrap(),
        ]);
        let r = read_model(&back);
        let (dtype, shape, bytes) = &r["transformer.h.0.mlp.c_fc.weight"];
        assert_eq!(
            (dtype.as_str(), shape.as_slice()),
            ("F32", &[64usize, 256][..])
        );
        let got: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let err = got
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err < 0.2,
            "{qt}: max error {err} (a wrong transpose gives ~1)"
        );
    }
}

#[test]
fn chunked_runs_write_the_bytes_of_one_launch() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"model_type": "gpt2"}"#).unwrap();
    // 200 x 333 = 66,600 elements: 4+ chunks of 16,384, a partial block and an odd count; one
    // Conv1D (transposed while chunked) and one bf16 Linear-like weight.
    write_st(
        &dir.join("model.safetensors"),
        &[
            t(
                "h.0.mlp.c_fc.weight",
                "F32",
                &[200, 333],
                f32b(&values(66_600, 9)),
            ),
            t(
                "h.0.attn.c_proj.weight",
                "BF16",
                &[111, 300],
                bf16b(&values(33_300, 10)),
            ),
        ],
    );
    let d = dir.to_str().unwrap();
    for args in [
        &["--double-quant"][..],
        &["--quant-type", "fp4"],
        &["--quant-type", "int8"],
        &["--quant-type", "int8-blockwise", "--blocksize", "256"],
    ] {
        let mut outs = Vec::new();
        // 20,000 elements: rounded up to whole blocks (and whole nested blocks of 256 x 64 for
        // double quantization), several chunks per weight.
        for chunk in ["0", "20000"] {
            let out = tmp.path().join(format!("o-{}-{chunk}", args.join("")));
            let mut a = vec![
                "quantize",
                d,
                "-o",
                out.to_str().unwrap(),
                "--chunk-elements",
                chunk,
            ];
            a.extend_from_slice(args);
            ok(&a);
            let back = tmp.path().join(format!("b-{}-{chunk}", args.join("")));
            ok(&[
                "dequantize",
                out.to_str().unwrap(),
                "-o",
                back.to_str().unwrap(),
                "--chunk-elements",
                chunk,
            ]);
            outs.push((read_model(&out), read_model(&back)));
        }
        assert!(outs[0].0 == outs[1].0, "{args:?}: chunked quantize differs");
        assert!(
            outs[0].1 == outs[1].1,
            "{args:?}: chunked dequantize differs"
        );
    }
}

#[test]
fn other_dtypes_are_copied_and_pickles_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    let tensors = vec![
        t(
            "model.layers.0.mlp.up_proj.weight",
            "F32",
            &[8, 64],
            f32b(&values(512, 1)),
        ),
        // A Linear weight stored as integers is copied and kept (listed in the config).
        t(
            "model.layers.0.mlp.down_proj.weight",
            "I32",
            &[4, 4],
            vec![7; 64],
        ),
        t(
            "model.layers.0.mlp.gate_proj.weight",
            "F64",
            &[2, 2],
            vec![3; 32],
        ),
        t("model.mask", "BOOL", &[3], vec![1, 0, 1]),
        t("model.scales", "F8_E8M0", &[4], vec![127; 4]),
        t("model.fp4", "F4", &[4], vec![0x12, 0x34]),
        t("model.future", "Q9_NEW", &[3], vec![1, 2, 3]),
        // An empty Linear weight is quantized as bitsandbytes does (shape kept in the state).
        t(
            "model.layers.0.self_attn.q_proj.weight",
            "F32",
            &[0, 64],
            vec![],
        ),
    ];
    write_st(&dir.join("model.safetensors"), &tensors);
    let out = tmp.path().join("o");
    let stdout = ok(&[
        "quantize",
        dir.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("dtype I32 is not a float dtype"),
        "{stdout}"
    );
    let q = read_model(&out);
    for (name, dtype, shape, bytes) in &tensors[1..7] {
        assert_eq!(
            q[name],
            (dtype.to_string(), shape.clone(), bytes.clone()),
            "{name}"
        );
    }
    let state = &q["model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4"].2;
    assert!(String::from_utf8_lossy(state).contains("\"shape\": [0, 64]"));
    assert_eq!(q["model.layers.0.self_attn.q_proj.weight"].1, [0, 1]);
    assert_eq!(
        config(&out)["quantization_config"]["llm_int8_skip_modules"],
        json!([
            "layers.0.mlp.down_proj",
            "layers.0.mlp.gate_proj",
            "lm_head"
        ])
    );
    let back = tmp.path().join("b");
    ok(&[
        "dequantize",
        out.to_str().unwrap(),
        "-o",
        back.to_str().unwrap(),
    ]);
    assert_eq!(read_model(&back)["model.future"].2, [1, 2, 3]);

    // Pickle checkpoints: a file, and a folder that only has one.
    let pk = tmp.path().join("pk");
    std::fs::create_dir_all(&pk).unwrap();
    std::fs::write(pk.join("pytorch_model.bin"), b"PK\x03\x04rest of a zip").unwrap();
    std::fs::write(pk.join("config.json"), b"{}").unwrap();
    let o = tmp.path().join("pk-out");
    for input in [pk.join("pytorch_model.bin"), pk.clone()] {
        fails(
            &[
                "quantize",
                input.to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
            ],
            "pickle checkpoints are not read; convert to safetensors",
        );
    }
    let raw = tmp.path().join("model.pt");
    std::fs::write(&raw, b"\x80\x02}q\x00.").unwrap();
    fails(
        &["quantize", raw.to_str().unwrap(), "-o", o.to_str().unwrap()],
        "pickle checkpoints are not read",
    );
    // stdout is not an output.
    fails(
        &["quantize", dir.to_str().unwrap(), "-o", "-"],
        "-o -: writing to stdout is not supported",
    );
    fails(
        &["dequantize", out.to_str().unwrap(), "-o", "-"],
        "-o -: writing to stdout is not supported",
    );
    assert!(!o.exists() && !Path::new("-").exists());
}
