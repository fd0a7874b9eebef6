//! `qforge bench` as a user runs it: JSON lines with the documented fields, the ratio as the
//! quotient of the two medians, the human table, and clear errors for a bad device or filter.

fn qforge(args: &[&str]) -> (i32, String, String) {
    qforge_testkit::run(env!("CARGO_BIN_EXE_qforge"), args)
}

/// Within `rel` relative difference.
fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[test]
fn json_lines_for_nf4_dequantize_have_the_documented_fields() {
    let (code, stdout, stderr) = qforge(&["bench", "--json", "--filter", "dequantize_4bit_nf4"]);
    assert_eq!(code, 0, "stderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    // One case (quantize_4bit_nf4 does not contain the filter) with one baseline.
    assert_eq!(lines.len(), 1, "{stdout}");
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
        let obj = v.as_object().expect("a JSON object");
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "kernel",
                "shape",
                "dtype",
                "median_s",
                "bytes_per_s",
                "baseline",
                "baseline_median_s",
                "ratio"
            ],
            "{line}"
        );
        assert_eq!(v["kernel"], "dequantize_4bit_nf4");
        assert_eq!(v["shape"], "n=16777216");
        assert_eq!(v["dtype"], "f32");
        assert_eq!(v["baseline"], "memcpy");
        let num = |k: &str| {
            v[k].as_f64()
                .unwrap_or_else(|| panic!("{k} is a number: {line}"))
        };
        let (median, rate, base, ratio) = (
            num("median_s"),
            num("bytes_per_s"),
            num("baseline_median_s"),
            num("ratio"),
        );
        assert!(
            median > 0.0 && base > 0.0 && rate > 0.0 && ratio > 0.0,
            "{line}"
        );
        // Seconds, not milliseconds: 76 MB in under a minute and over 10 us.
        assert!(median < 60.0 && median > 1e-5, "{line}");
        // ratio = baseline / kernel, rounded to 4 significant digits from unrounded medians
        // that are printed with 6.
        assert!(close(ratio, base / median, 1e-3), "{line}");
        // bytes/s * s = the bytes NF4 dequantize of 16 Mi f32 moves, counted by hand: 8 MiB of
        // packed codes + 256 Ki f32 absmax read, 64 MiB of f32 written.
        let bytes = (8u64 << 20) + (1 << 20) + (64 << 20);
        assert!(close(rate * median, bytes as f64, 1e-4), "{line}");
    }
}

#[test]
fn table_on_the_interpreter_is_aligned_and_says_it_is_scaled_down() {
    let (code, stdout, stderr) = qforge(&[
        "bench",
        "--device",
        "interpreter",
        "--filter",
        "dequantize_blockwise",
    ]);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.contains("'interpreter'")),
        "the header names the device: {stdout}"
    );
    let title = stdout
        .lines()
        .find(|l| l.starts_with("kernel"))
        .expect("a title line");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("dequantize_blockwise_dynamic"))
        .expect("a row for the 8-bit case");
    assert!(
        row.contains("n=262144 (interpreter: scaled down from 16777216)"),
        "{row}"
    );
    assert_eq!(title.find("shape"), row.find("n=262144"), "{title}\n{row}");
    assert_eq!(title.find("baseline"), row.find("memcpy"), "{title}\n{row}");
    assert_eq!(title.len(), row.len(), "{title}\n{row}");
}

#[test]
fn a_bad_device_is_a_clear_error() {
    let (code, stdout, stderr) = qforge(&["bench", "--device", "tpu9"]);
    assert_eq!(code, 2, "stdout: {stdout}");
    assert!(stdout.is_empty(), "nothing is benchmarked: {stdout}");
    assert!(
        stderr.contains("unknown device 'tpu9'") && stderr.contains("cpu, interpreter"),
        "{stderr}"
    );
}

#[test]
fn a_filter_matching_nothing_is_a_clear_error() {
    let (code, stdout, stderr) = qforge(&["bench", "--json", "--filter", "no_such_kernel"]);
    assert_eq!(code, 2, "stdout: {stdout}");
    assert!(stdout.is_empty(), "nothing is benchmarked: {stdout}");
    assert!(
        stderr.contains("--filter 'no_such_kernel' matches no bench case")
            && stderr.contains("dequantize_4bit_nf4"),
        "{stderr}"
    );
}

/// `qforge bench --device cpu-llvm` on one quick case (`dequantize_4bit_nf4`).
#[cfg(feature = "llvm")]
fn llvm_bench_command() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_qforge"));
    c.args([
        "bench",
        "--device",
        "cpu-llvm",
        "--filter",
        "dequantize_4bit_nf4",
    ]);
    c
}

/// A bad `QFORGE_LLVM_LANES` stops the `cpu-llvm` device with an error naming the variable.
#[cfg(feature = "llvm")]
#[test]
fn a_bad_llvm_lane_override_names_the_variable() {
    for bad in ["3", "abc", "128"] {
        let out = llvm_bench_command()
            .env("QFORGE_LLVM_LANES", bad)
            .output()
            .expect("qforge runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "QFORGE_LLVM_LANES={bad} was accepted"
        );
        assert!(
            stderr.contains(&format!("QFORGE_LLVM_LANES=\"{bad}\"")),
            "{stderr}"
        );
    }
}

/// `QFORGE_PERF_MAP=1` names each kernel the `cpu-llvm` JIT loads in the process's
/// `/tmp/perf-<pid>.map`, as `perf report` reads it.
#[cfg(all(feature = "llvm", target_os = "linux"))]
#[test]
fn a_perf_map_names_the_jit_kernels() {
    let child = llvm_bench_command()
        .env("QFORGE_PERF_MAP", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("qforge runs");
    let map = std::path::PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
    let out = child.wait_with_output().expect("qforge runs");
    let text = std::fs::read_to_string(&map).unwrap_or_default();
    let _ = std::fs::remove_file(&map);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.ends_with(" qforge:dequantize_4bit_nf4_bs64_f32"))
        .unwrap_or_else(|| panic!("no line for the kernel in {}:\n{text}", map.display()));
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields.len(), 3, "{line}");
    let start = u64::from_str_radix(fields[0], 16).expect("a hex start");
    let size = u64::from_str_radix(fields[1], 16).expect("a hex size");
    assert!(start > 0 && size > 0, "{line}");
}

#[test]
fn the_train_suite_reports_gflops_and_the_fraction_of_peak() {
    // The interpreter's train cases are scaled down (seconds); `dx` keeps the input gradients.
    let (code, stdout, stderr) = qforge(&[
        "bench",
        "--suite",
        "train",
        "--json",
        "--device",
        "interpreter",
        "--filter",
        "dx",
    ]);
    assert_eq!(code, 0, "stderr: {stderr}");
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(!rows.is_empty(), "{stdout}");
    for v in &rows {
        assert!(v["kernel"].as_str().unwrap().contains("dx"), "{v}");
        assert_eq!(v["baseline"], "fp32_gemm", "{v}");
        let flops = v["flops"].as_f64().expect("flops");
        let median = v["median_s"].as_f64().expect("median");
        let gflops = v["gflops"].as_f64().expect("gflops");
        assert!(close(gflops, flops / median / 1e9, 1e-3), "{v}");
        let fraction = v["peak_fraction"].as_f64().expect("peak_fraction");
        assert!(fraction > 0.0 && fraction.is_finite(), "{v}");
    }
    let (code, _, stderr) = qforge(&["bench", "--suite", "fast"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("fast"), "{stderr}");
}
