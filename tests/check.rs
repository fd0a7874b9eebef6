//! `qforge check`, README's main job, in the default build: it exits 0 when every device is
//! bit-exact, its `--json` lines carry the documented fields, and a device that returns one wrong
//! bit makes it fail and name the kernel (a test device that flips one bit of one output).

use qforge::cli::check::{passed, run_check, table, CheckRow};
use qforge::ir::{Arg, Kernel};
use qforge::runtime::{CpuDevice, Device};

/// The kernel these tests check (one, so that a debug build takes seconds).
const FILTER: &str = "dequantize_4bit_nf4_bs64_f32";

fn qforge(args: &[&str]) -> (i32, String, String) {
    qforge_testkit::run(env!("CARGO_BIN_EXE_qforge"), args)
}

#[test]
fn check_exits_0_and_its_json_lines_carry_the_documented_fields() {
    // Every device this build can start (the default), then the CPU device alone.
    for extra in [&[][..], &["--device", "cpu"]] {
        let mut args = vec!["check", "--json", "--filter", FILTER];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = qforge(&args);
        assert_eq!(code, 0, "{args:?}: {stderr}\n{stdout}");
        let mut backends = Vec::new();
        for line in stdout.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            let kernel = v["kernel"].as_str().expect("kernel is a string");
            assert!(kernel.contains(FILTER), "{line}");
            let backend = v["backend"].as_str().expect("backend is a string");
            let status = v["status"].as_str().expect("status is a string");
            assert!(["exact", "mismatch", "skipped"].contains(&status), "{line}");
            let elements = v["elements"].as_u64().expect("elements is a count");
            assert_eq!(v["mismatches"].as_u64(), Some(0), "{line}");
            assert!(v["compile_ms"].as_f64().is_some_and(|t| t >= 0.0), "{line}");
            if status == "exact" {
                assert!(elements > 0, "{line}");
            } else {
                // Only backends without a device here, with the reason.
                assert_eq!(status, "skipped", "{line}");
                assert!(
                    v["reason"].as_str().is_some_and(|r| !r.is_empty()),
                    "{line}"
                );
            }
            backends.push((backend.to_string(), status.to_string()));
        }
        for ran in ["interpreter", "cranelift"] {
            assert!(
                backends.contains(&(ran.to_string(), "exact".to_string())),
                "{args:?}: no exact {ran} row in {backends:?}"
            );
        }
        // The Mosaic backend lowers the kernel: its twin ran where the StableHLO interpreter
        // did (every device), else the module was generated only.
        let stablehlo = backends
            .iter()
            .any(|(b, s)| b == "stablehlo" && s == "exact");
        let mosaic = if stablehlo { "exact" } else { "skipped" };
        assert!(
            backends.contains(&("mosaic".to_string(), mosaic.to_string())),
            "{args:?}: no {mosaic} mosaic row in {backends:?}"
        );
        // libtpu compiled its module where a Python with libtpu is found (CI installs it).
        let libtpu = qforge::cli::check_libtpu::python().is_some();
        let compiled = stdout.lines().any(|l| {
            l.contains("\"backend\":\"libtpu\"")
                && l.contains("\"status\":\"skipped\"")
                && l.contains("compiled (libtpu v5e, v6e)")
        });
        assert_eq!(compiled, libtpu, "{args:?}: libtpu rows {stdout}");
    }
}

#[test]
fn check_prints_a_table_and_refuses_a_filter_that_matches_nothing() {
    let (code, stdout, stderr) = qforge(&["check", "--device", "cpu", "--filter", FILTER]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("bit-exact"), "{stdout}");
    assert!(
        stdout.contains("1 kernels on") && stdout.contains("1 bit-exact, 0 mismatching"),
        "{stdout}"
    );
    let (code, _, stderr) = qforge(&["check", "--filter", "no_such_kernel"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("'no_such_kernel'"), "{stderr}");
    let (code, _, stderr) = qforge(&["check", "--device", "no-such-device"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("'no-such-device'"), "{stderr}");
}

/// The CPU device, except that after every launch of `victim` it flips the lowest bit of the
/// first byte of the first buffer the kernel may write.
struct FlipOneBit {
    cpu: CpuDevice,
    victim: String,
}

impl Device for FlipOneBit {
    fn name(&self) -> &str {
        "flip-one-bit"
    }

    fn backend(&self) -> &'static str {
        "flip-one-bit"
    }

    fn compile(&self, kernel: &Kernel) -> qforge::runtime::Result<()> {
        self.cpu.compile(kernel)
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> qforge::runtime::Result<()> {
        self.cpu.launch(kernel, args)?;
        if kernel.name == self.victim {
            let written = args.iter_mut().find_map(|a| match a {
                Arg::Write(bytes) if !bytes.is_empty() => Some(bytes),
                _ => None,
            });
            written.expect("the victim writes a buffer")[0] ^= 1;
        }
        Ok(())
    }
}

#[test]
fn a_device_that_returns_one_wrong_bit_fails_check_and_is_named() {
    let victim = FILTER.to_string();
    let flip = FlipOneBit {
        cpu: CpuDevice::new().expect("CPU device"),
        victim: victim.clone(),
    };
    let devices: Vec<Box<dyn Device>> = vec![Box::new(flip)];
    let mut seen = Vec::new();
    let rows = run_check(&devices, &[], Some(FILTER), &mut |r: &CheckRow| {
        seen.push(r.clone())
    })
    .expect("check runs");
    assert_eq!(seen, rows, "every row is reported as it is found");
    let bad: Vec<&CheckRow> = rows.iter().filter(|r| r.status == "mismatch").collect();
    assert_eq!(bad.len(), 1, "{rows:?}");
    assert_eq!(
        (
            bad[0].kernel.as_str(),
            bad[0].backend.as_str(),
            bad[0].mismatches
        ),
        (victim.as_str(), "flip-one-bit", 1)
    );
    assert!(!passed(&rows), "a wrong bit must fail the check");
    let lines = table(&rows, &[]);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&victim) && l.contains("1 mismatches")),
        "{lines:#?}"
    );
    assert!(
        lines.last().unwrap().contains("1 mismatching"),
        "{lines:#?}"
    );
    let json = bad[0].to_json();
    assert!(json.contains(&format!("\"kernel\":\"{victim}\"")), "{json}");
    assert!(json.contains("\"status\":\"mismatch\""), "{json}");
}
