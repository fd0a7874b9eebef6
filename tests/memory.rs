//! Peak memory of `qforge quantize` and `dequantize`: bounded by the largest tensor plus a
//! constant, independent of the checkpoint's total size (inputs are memory-mapped and released
//! chunk by chunk, outputs streamed tensor by tensor). Measured with the kernel's own figures: the
//! peak resident set (`VmHWM` of `/proc/self/status`) that the binary prints, checked against
//! `getrusage(RUSAGE_CHILDREN)`. This file holds one test, so no other child of this process
//! counts in `getrusage`.

use std::path::Path;
use std::process::Command;

use serde_json::json;

/// Elements of each weight: bf16 [1024, 4096] = 8 MiB, the largest tensor.
const ROWS: usize = 1024;
const COLS: usize = 4096;
const MIB: u64 = 1 << 20;
/// The constant of the bound: the binary, its JIT-compiled kernels and one chunk's working set
/// (4 Mi elements: the input chunk, its f32 copy, the packed codes and the dequantized chunk for
/// the error figures).
const CONSTANT: u64 = 160 * MIB;

/// A sharded bf16 Llama-layout folder of `layers` layers x 2 weights, 2 weights per shard.
fn folder(dir: &Path, layers: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
    let mut weight_map = serde_json::Map::new();
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let nbytes = ROWS * COLS * 2;
    for l in 0..layers {
        let name = format!("model-{:05}-of-{layers:05}.safetensors", l + 1);
        let mut header = serde_json::Map::new();
        let mut data = Vec::with_capacity(2 * nbytes);
        for (i, w) in ["mlp.up_proj", "mlp.down_proj"].iter().enumerate() {
            let t = format!("model.layers.{l}.{w}.weight");
            header.insert(
                t.clone(),
                json!({"dtype": "BF16", "shape": [ROWS, COLS],
                       "data_offsets": [i * nbytes, (i + 1) * nbytes]}),
            );
            weight_map.insert(t, json!(name));
            for _ in 0..ROWS * COLS {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
                data.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        let mut h = serde_json::to_string(&header).unwrap();
        while !h.len().is_multiple_of(8) {
            h.push(' ');
        }
        let mut file = (h.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(h.as_bytes());
        file.extend_from_slice(&data);
        std::fs::write(dir.join(&name), file).unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
}

/// Runs the binary; returns the peak RSS it printed.
fn peak(args: &[&str]) -> u64 {
    let out = Command::new(env!("CARGO_BIN_EXE_qforge"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| {
            l.strip_prefix("peak RSS ")?
                .strip_suffix(" bytes")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no peak RSS line: {stdout}"))
}

/// The largest peak resident set of any waited-for child, in bytes.
fn children_max_rss() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) },
        0
    );
    ru.ru_maxrss as u64 * 1024
}

#[test]
fn peak_memory_does_not_grow_with_the_checkpoint() {
    if !Path::new("/proc/self/status").exists() {
        println!("skipped: no /proc/self/status to read the peak RSS from");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let largest = (ROWS * COLS * 2) as u64;
    let mut figures = Vec::new();
    for layers in [4, 8] {
        let input = tmp.path().join(format!("in-{layers}"));
        folder(&input, layers);
        let total = 2 * layers as u64 * largest;
        let q = tmp.path().join(format!("q-{layers}"));
        let r = tmp.path().join(format!("r-{layers}"));
        let quantize = peak(&[
            "quantize",
            input.to_str().unwrap(),
            "-o",
            q.to_str().unwrap(),
            "--double-quant",
        ]);
        let dequantize = peak(&["dequantize", q.to_str().unwrap(), "-o", r.to_str().unwrap()]);
        println!(
            "{} MiB checkpoint (largest tensor {} MiB): quantize peak RSS {:.1} MiB, dequantize {:.1} MiB",
            total / MIB,
            largest / MIB,
            quantize as f64 / MIB as f64,
            dequantize as f64 / MIB as f64
        );
        for (what, p) in [("quantize", quantize), ("dequantize", dequantize)] {
            assert!(
                p <= largest + CONSTANT,
                "{what} of a {} MiB checkpoint peaked at {} MiB, over the largest tensor ({} MiB) \
                 + {} MiB",
                total / MIB,
                p / MIB,
                largest / MIB,
                CONSTANT / MIB
            );
        }
        figures.push((total, quantize, dequantize));
        std::fs::remove_dir_all(&input).unwrap();
        std::fs::remove_dir_all(&r).unwrap();
    }
    // Twice the checkpoint, the same largest tensor: the peak may not follow the total (it would
    // grow by 128 MiB if the input or output were held whole).
    let (small, big) = (figures[0], figures[1]);
    for (what, a, b) in [("quantize", small.1, big.1), ("dequantize", small.2, big.2)] {
        assert!(
            b <= a + 16 * MIB,
            "{what}: peak RSS {} MiB for {} MiB, {} MiB for {} MiB: it grows with the checkpoint",
            a / MIB,
            small.0 / MIB,
            b / MIB,
            big.0 / MIB
        );
    }
    let max = figures.iter().map(|f| f.1.max(f.2)).max().unwrap();
    let ru = children_max_rss();
    assert!(
        ru + 4 * MIB >= max && ru <= max + 4 * MIB,
        "getrusage says {ru}, VmHWM {max}"
    );
}
