//! The custom op on every device this build has, bit for bit against the interpreter (the same
//! fixed conformance cases as the library's kernels, and `qforge check`'s rows), and against the
//! unfused path: the plain-Rust RMSNorm model, then the library's `quantize_4bit`.

use qforge::conformance::check_entry;
use qforge::devices::available_devices;
use qforge::ir::DType;
use qforge::kernels::ops::{quantize_4bit, Absmax4, QuantType};
use qforge::kernels::CatalogEntry;
use qforge::runtime::{Device, HostTensor, InterpreterDevice};
use qforge_example_custom_op::{rmsnorm_model, rmsnorm_quantize_4bit, RmsNormNf4Entry};

fn entries() -> Vec<RmsNormNf4Entry> {
    let mut out = Vec::new();
    for blocksize in [32, 64] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            out.push(RmsNormNf4Entry { blocksize, dtype });
        }
    }
    out
}

/// Every device compiled in, or the reason it is skipped (a failure where `qforge_testkit`
/// requires it).
fn devices() -> Vec<Box<dyn Device>> {
    let (devices, unavailable) = available_devices();
    for u in &unavailable {
        qforge_testkit::unavailable(u.device, &u.reason);
    }
    devices
}

#[test]
fn the_custom_op_joins_the_conformance_suite_on_every_device() {
    let devices = devices();
    let labelled: Vec<(&str, &dyn Device)> =
        devices.iter().map(|d| (d.backend(), d.as_ref())).collect();
    for e in entries() {
        check_entry(&e, &labelled).unwrap_or_else(|f| panic!("{}:\n{f}", e.name()));
    }
    println!("checked on {} device(s)", labelled.len());
}

#[test]
fn the_custom_op_joins_qforge_check() {
    let devices = devices();
    let entries = entries();
    let list: Vec<&dyn CatalogEntry> = entries.iter().map(|e| e as &dyn CatalogEntry).collect();
    let rows = qforge::cli::check::run_check_entries(&devices, &[], &list, &mut |_| {}).unwrap();
    assert!(qforge::cli::check::passed(&rows), "{rows:#?}");
    let exact = rows.iter().filter(|r| r.status == "exact").count();
    // The interpreter row and one row per device, for every entry.
    assert_eq!(exact, entries.len() * (1 + devices.len()), "{rows:#?}");
    for line in qforge::cli::check::table(&rows, &[]) {
        println!("{line}");
    }
}

/// Rows of normal-looking data, then a zero row, a row with a NaN, a row of huge values and a
/// row of subnormals.
fn input(rows: usize, d: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut v: Vec<f32> = (0..(rows - 4) * d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 6.0 - 3.0
        })
        .collect();
    v.extend(std::iter::repeat_n(0.0, d));
    v.extend((0..d).map(|k| if k == 3 { f32::NAN } else { 1.0 }));
    v.extend((0..d).map(|k| 3.0e38 * if k % 2 == 0 { 1.0 } else { -0.5 }));
    v.extend((0..d).map(|k| f32::from_bits(1 + k as u32)));
    v
}

#[test]
fn the_fused_op_equals_rmsnorm_then_quantize_4bit() {
    let mut devices = devices();
    devices.push(Box::new(InterpreterDevice));
    for (d, blocksize) in [(384usize, 64u32), (96, 32), (4096, 4096)] {
        let rows = 7;
        let x = input(rows, d);
        let weight: Vec<f32> = (0..d).map(|k| 0.75 + (k % 5) as f32 * 0.125).collect();
        let eps = 1e-6f32;
        // Unfused: the model of the RMSNorm step, then the library's quantize_4bit.
        let y = HostTensor::from_f32(vec![rows, d], &rmsnorm_model(&x, d, &weight, eps)).unwrap();
        let xt = HostTensor::from_f32(vec![rows, d], &x).unwrap();
        for dev in &devices {
            let (want_packed, state) =
                quantize_4bit(dev.as_ref(), &y, QuantType::Nf4, blocksize as usize, false).unwrap();
            let Absmax4::Plain(want_absmax) = state.absmax else {
                unreachable!("no double quantization requested")
            };
            let (packed, absmax) =
                rmsnorm_quantize_4bit(dev.as_ref(), &xt, &weight, eps, blocksize).unwrap();
            assert_eq!(packed, want_packed, "{} d = {d}: codes", dev.name());
            assert_eq!(absmax.len(), want_absmax.len());
            for (i, (a, b)) in absmax.iter().zip(&want_absmax).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                    "{} d = {d}: absmax {i}: {a} vs {b}",
                    dev.name()
                );
            }
        }
    }
}

#[test]
fn bad_input_is_an_error_naming_it() {
    let dev = InterpreterDevice;
    let x = HostTensor::from_f32(vec![2, 96], &[1.0; 192]).unwrap();
    let err = |r: qforge::Result<(Vec<u8>, Vec<f32>)>| r.unwrap_err().to_string();
    let e = err(rmsnorm_quantize_4bit(&dev, &x, &[1.0; 95], 1e-6, 32));
    assert!(
        e.contains("weight has 95 values") && e.contains("d = 96"),
        "{e}"
    );
    let e = err(rmsnorm_quantize_4bit(&dev, &x, &[1.0; 96], 1e-6, 64));
    assert!(e.contains("multiple of the blocksize 64"), "{e}");
    let e = err(rmsnorm_quantize_4bit(&dev, &x, &[1.0; 96], 1e-6, 48));
    assert!(e.contains("48"), "{e}");
    let flat = HostTensor::from_f32(vec![192], &[1.0; 192]).unwrap();
    let e = err(rmsnorm_quantize_4bit(&dev, &flat, &[1.0; 192], 1e-6, 64));
    assert!(e.contains("2-D"), "{e}");
}

/// The IR text of the macro-built kernel, reviewed in diffs.
#[test]
fn kernel_ir_snapshot() {
    let k = qforge_example_custom_op::rmsnorm_nf4(32, DType::BF16).unwrap();
    insta::assert_snapshot!(qforge::ir::text::print(k.kernel()));
}
