//! The shared conformance suite: every library kernel, on every device this build can run,
//! bit-exact against the reference interpreter. Every kernel gets, in every run, the fixed cases
//! of `qforge::conformance`: one for each pair of a length class (1, 3, blocksize - 1,
//! blocksize + 1, several blocks) and an input kind (normal data mixed with 0, -0, subnormals,
//! ±inf, NaN and huge values; or exact 4-bit midpoints, their neighbours and ±1), drawn
//! deterministically from the kernel's name; then `PROPTEST_CASES` (default 1) random cases
//! whose failures are persisted in `conformance.proptest-regressions`. Devices that cannot run
//! here are skipped with a printed reason, except where `qforge_testkit` requires them (CI),
//! where the test fails.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use qforge::conformance::{check_values, fixed_cases, lengths, tie_values, EDGE_VALUES};
use qforge::devices::{available_devices, DEVICE_NAMES};
use qforge::kernels::{self, CatalogEntry};
use qforge::runtime::Device;

/// An f32 drawn from normal-looking data mixed with edge values.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -3.0f32..3.0,
        1 => prop::sample::select(EDGE_VALUES.to_vec()),
        1 => any::<u32>().prop_map(f32::from_bits),
    ]
}

/// Either input kind at one of the length classes of `blocksize`.
fn inputs(blocksize: usize) -> impl Strategy<Value = Vec<f32>> {
    let lengths: Vec<usize> = lengths(blocksize).map(|(_, n)| n).to_vec();
    prop::sample::select(lengths).prop_flat_map(|n| {
        prop_oneof![
            prop::collection::vec(value(), n),
            prop::collection::vec(prop::sample::select(tie_values()), n),
        ]
    })
}

/// Every device compiled in that the environment requires (`qforge_testkit`) is in this build's
/// device list: a feature dropped from the test command must not make a device vanish.
fn required_devices_are_compiled_in() {
    for name in qforge_testkit::required_names() {
        let is_device =
            ["cpu", "cpu-llvm", "cpu-aot", "wgpu", "cuda", "stablehlo"].contains(&name.as_str());
        assert!(
            !is_device || DEVICE_NAMES.contains(&name.as_str()),
            "{name} is required here but this build lacks its cargo feature (devices: {DEVICE_NAMES:?})"
        );
    }
}

#[test]
fn every_library_kernel_is_bit_exact_on_every_device() {
    required_devices_are_compiled_in();
    let (mut devices, unavailable) = available_devices();
    let mut labels: Vec<String> = devices.iter().map(|d| d.backend().to_string()).collect();
    // On an AVX-512 host, the AVX2 code of `cpu-llvm` too (another host runs it natively).
    #[cfg(all(feature = "llvm", target_arch = "x86_64"))]
    if std::is_x86_feature_detected!("avx512f") {
        let avx2 = qforge::runtime::CpuOptions {
            avx512: false,
            ..Default::default()
        };
        match qforge::runtime::CpuDevice::llvm(avx2) {
            Ok(d) => {
                devices.push(Box::new(d));
                labels.push("llvm without AVX-512".into());
            }
            Err(e) => qforge_testkit::unavailable("cpu-llvm", format!("without AVX-512: {e}")),
        }
    }
    for u in &unavailable {
        qforge_testkit::unavailable(u.device, &u.reason);
    }
    if devices.is_empty() {
        println!("skipped: no device besides the interpreter can run on this machine");
        return;
    }
    let devices: Vec<(&str, &dyn Device)> = labels
        .iter()
        .map(String::as_str)
        .zip(devices.iter().map(|d| d.as_ref()))
        .collect();
    let random = qforge_testkit::random_cases(1);
    // `QFORGE_CONFORMANCE_FILTER=NAME` keeps the kernels whose name contains NAME (a quick
    // check of one family while working on it; CI runs them all).
    let mut catalog = kernels::catalog();
    if let Ok(filter) = std::env::var("QFORGE_CONFORMANCE_FILTER") {
        catalog.retain(|e| e.name().contains(&filter));
        println!(
            "QFORGE_CONFORMANCE_FILTER={filter}: {} kernels",
            catalog.len()
        );
    }
    // Kernels are handed out one at a time to one worker per core (the devices are shared).
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    // Nanoseconds spent in the interpreter and in each device (compiles included).
    let nanos: Vec<AtomicU64> = (0..=devices.len()).map(|_| AtomicU64::new(0)).collect();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(entry) = catalog.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = check_kernel(entry, &devices, &nanos, random) {
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    println!(
        "{} kernels checked on {} device(s) by {workers} threads, 10 fixed + {random} random \
         cases each",
        catalog.len(),
        devices.len()
    );
    let times: Vec<String> = std::iter::once("interpreter")
        .chain(labels.iter().map(String::as_str))
        .zip(&nanos)
        .map(|(label, t)| format!("{label} {:.1} s", t.load(Ordering::Relaxed) as f64 * 1e-9))
        .collect();
    println!("time spent: {}", times.join(", "));
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} kernels not bit-exact:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// One kernel's fixed and random cases on every device against the interpreter; adds the time
/// spent in each (interpreter first) to `nanos`.
fn check_kernel(
    entry: &dyn CatalogEntry,
    devices: &[(&str, &dyn Device)],
    nanos: &[AtomicU64],
    random: u32,
) -> Result<(), String> {
    let kernel = entry
        .build()
        .map_err(|e| format!("{}: {e}", entry.name()))?;
    let mut time = |i: usize, s: f64| {
        nanos[i].fetch_add((s * 1e9) as u64, Ordering::Relaxed);
    };
    let fixed = fixed_cases(&kernel.name, entry.blocksize());
    let mut failures = Vec::new();
    for (label, values) in fixed {
        if let Err(e) = check_values(entry, &kernel, devices, &values, &mut time) {
            failures.push(format!("{label}: {e}"));
        }
    }
    if random > 0 {
        let time = std::sync::Mutex::new(time);
        let result = qforge_testkit::runner(file!(), random).run(&inputs(entry.blocksize()), |v| {
            let mut t = time.lock().unwrap();
            check_values(entry, &kernel, devices, &v, &mut *t).map_err(TestCaseError::fail)
        });
        if let Err(e) = result {
            failures.push(format!("random case: {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
