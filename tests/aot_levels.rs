//! Feature `aot`: every library kernel's ahead-of-time object (`build.rs`, qforge-build; LLVM's
//! with the `llvm` feature, else Cranelift's) at every CPU feature level this machine has, bit
//! for bit against the interpreter on the fixed cases of `qforge::conformance`. The `cpu-aot`
//! device of the conformance suite runs only the best level; this runs each one, the baseline
//! included, each with `Policy::RequireAot` (no JIT can stand in for a missing object).
#![cfg(feature = "aot")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use qforge::aot_kernels::KERNELS;
use qforge::conformance::check_entry;
use qforge::kernels;
use qforge::runtime::aot::AotKernel;
use qforge::runtime::{AotDevice, Device, Policy};

/// The records of `level` compiled by `backend`, as the `'static` slice `AotDevice` takes.
fn records(level: &str, backend: &str) -> &'static [&'static AotKernel] {
    let chosen: Vec<&'static AotKernel> = KERNELS
        .iter()
        .copied()
        .filter(|k| k.level == level && k.backend == backend)
        .collect();
    Box::leak(chosen.into_boxed_slice())
}

#[test]
fn every_library_kernel_is_bit_exact_at_every_feature_level_this_cpu_has() {
    let catalog = kernels::catalog();
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for k in KERNELS {
        if !pairs.contains(&(k.level, k.backend)) {
            pairs.push((k.level, k.backend));
        }
    }
    let mut labels = Vec::new();
    let mut devices: Vec<AotDevice> = Vec::new();
    for (level, backend) in pairs {
        let records = records(level, backend);
        // Every library kernel has an object at every level built.
        assert_eq!(
            records.len(),
            catalog.len(),
            "{backend} objects at {level}: {} of {} library kernels",
            records.len(),
            catalog.len()
        );
        match AotDevice::for_level(records, Policy::RequireAot, level) {
            Ok(dev) => {
                labels.push(format!("cpu-aot {level} ({backend})"));
                devices.push(dev);
            }
            Err(e) => println!("skipped {level} ({backend}): {e}"),
        }
    }
    assert!(
        !devices.is_empty(),
        "no feature level of the AOT objects runs here"
    );
    let devices: Vec<(&str, &dyn Device)> = labels
        .iter()
        .map(String::as_str)
        .zip(devices.iter().map(|d| d as &dyn Device))
        .collect();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(entry) = catalog.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if let Err(e) = check_entry(entry, &devices) {
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    println!("{} kernels checked on {}", catalog.len(), labels.join(", "));
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} kernels not bit-exact:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
