//! The shared conformance suite: every library kernel, on every device this build can run,
//! bit-exact against the reference interpreter on proptest inputs (normal data mixed with 0, -0,
//! subnormals, ±inf, NaN, huge values, or blocks of exact 4-bit midpoints and their neighbours; sizes 1, 3, odd, not a multiple of
//! the block, several blocks). Devices that cannot run here are skipped with a printed reason.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use qforge::devices::available_devices;
use qforge::ir::{count_mismatches, library, OwnedArg};
use qforge::runtime::{Device, InterpreterDevice};

/// An f32 drawn from normal-looking data mixed with edge values.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -3.0f32..3.0,
        1 => prop::sample::select(vec![
            0.0, -0.0, f32::MIN_POSITIVE / 3.0, -f32::MIN_POSITIVE / 5.0, f32::from_bits(1),
            f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 3.0e38, -3.0e38, 1.0, -1.0, 0.5,
            0.8614784, -0.33791524, 0.0052083335, 1e-30,
            // Where exp/erf/tanh/sigmoid change regime: exp overflows f32 above 88.72284 and
            // leaves the normal (subnormal) range below -87.33655 (-103.97208).
            88.0, -88.0, 88.72284, -87.33655, -103.97208, 89.0,
        ]),
        1 => any::<u32>().prop_map(f32::from_bits),
    ]
}

/// Values whose scaled form lands exactly on a 4-bit decision midpoint (or a code value) when the
/// block's absmax is 1.0, which `±1.0` in the mix makes likely: the tie-breaking rules.
fn tie_value() -> impl Strategy<Value = f32> {
    let mut ties: Vec<f32> = vec![1.0, -1.0, 0.0, -0.0];
    for m in library::maps::nf4_midpoints()
        .into_iter()
        .chain(library::maps::fp4_midpoints())
    {
        ties.extend([
            m,
            -m,
            f32::from_bits(m.to_bits() + 1),
            f32::from_bits(m.to_bits() - 1),
        ]);
    }
    ties.extend(library::QuantType::Nf4.code());
    prop::sample::select(ties)
}

fn lengths(blocksize: usize) -> Vec<usize> {
    vec![1, 3, blocksize - 1, blocksize + 1, 2 * blocksize + 3]
}

#[test]
fn every_library_kernel_is_bit_exact_on_every_device() {
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
            Err(e) => println!("skipped cpu-llvm without AVX-512: {e}"),
        }
    }
    for u in &unavailable {
        println!("skipped on {}: {}", u.backend, u.reason);
    }
    if devices.is_empty() {
        println!("skipped: no device besides the interpreter can run on this machine");
        return;
    }
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for entry in library::catalog() {
        let kernel = entry.build().expect("library kernels build");
        let mut runner = TestRunner::new(Config {
            cases: 4,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = prop::sample::select(lengths(entry.blocksize())).prop_flat_map(|n| {
            prop_oneof![
                prop::collection::vec(value(), n),
                prop::collection::vec(tie_value(), n)
            ]
        });
        let result = runner.run(&strategy, |values| {
            let mut reference = entry.example_args(&values).expect("example args");
            let fresh = reference.clone();
            InterpreterDevice
                .launch(&kernel, &mut OwnedArg::borrow_all(&mut reference))
                .expect("interpreter runs");
            for (device, label) in devices.iter().zip(&labels) {
                let mut args = fresh.clone();
                device
                    .launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
                    .expect("device runs");
                let (bad, total) = count_mismatches(&kernel, &reference, &args);
                prop_assert_eq!(
                    bad,
                    0,
                    "{} on {}: {} of {} elements differ (n = {})",
                    kernel.name,
                    label,
                    bad,
                    total,
                    values.len()
                );
            }
            Ok(())
        });
        checked += 1;
        if let Err(e) = result {
            failures.push(e.to_string());
        }
    }
    println!("{checked} kernels checked on {} device(s)", devices.len());
    assert!(
        failures.is_empty(),
        "{} kernels not bit-exact:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
