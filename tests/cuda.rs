//! The CUDA device (feature `cuda`). Without the NVIDIA driver: `CudaDevice::new` must return an
//! error naming the driver, never panic, and `qforge check --device cuda` must exit 2 with that
//! message. With a GPU: library kernels bit-exact against the interpreter (sizes around the
//! 128-thread block and several blocks), the scalar ABI, `Write` buffers keeping the elements a
//! kernel does not store, an empty grid, and `qforge check --device cuda`. The conformance suite
//! (`tests/conformance.rs`) runs every library kernel on the device through `available_devices`.
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::process::Command;

use qforge::devices::{available_devices, device_by_name, DEVICE_NAMES};
use qforge::ir::{
    count_mismatches, Access, DType, Dim, Kernel, KernelBuilder, OwnedArg, Scalar, ScalarType,
};
use qforge::kernels;
use qforge::runtime::{CudaDevice, Device, InterpreterDevice};

/// Whether a `libcuda.so*` is visible to the dynamic loader here, found without qforge's code:
/// `LD_LIBRARY_PATH`, the usual driver folders, and `ldconfig -p`.
fn libcuda_visible() -> bool {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/lib/x86_64-linux-gnu",
            "/usr/local/nvidia/lib64",
            "/usr/local/cuda/compat",
            "/usr/lib/wsl/lib",
        ]
        .map(PathBuf::from),
    );
    let in_dirs = dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("libcuda.so"))
        })
    });
    in_dirs
        || Command::new("ldconfig")
            .arg("-p")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
}

/// The GPU, or `None` after printing why not (and checking the error names the driver when no
/// driver is installed).
fn gpu() -> Option<CudaDevice> {
    match CudaDevice::new() {
        Ok(d) => {
            println!(
                "GPU: {} (compute capability {:?}, {}, driver {})",
                d.gpu_name(),
                d.compute_capability(),
                d.target().name(),
                d.driver_version()
            );
            Some(d)
        }
        Err(e) => {
            let reason = e.to_string();
            if !libcuda_visible() {
                assert!(
                    reason.contains("CUDA driver not found (libcuda.so)"),
                    "without libcuda the error must name the driver: {reason}"
                );
            }
            assert!(reason.contains("cuda"), "{reason}");
            qforge_testkit::unavailable("cuda", reason);
            None
        }
    }
}

#[test]
fn new_returns_an_error_naming_the_driver_or_a_working_device() {
    // Twice: a second attempt after a failure (cudarc's loader state is process-wide) must
    // behave the same and must not panic either.
    let first = gpu().is_some();
    let second = gpu().is_some();
    assert_eq!(first, second);
    if !libcuda_visible() {
        assert!(!first, "a device started without a visible libcuda");
    }
}

#[test]
fn devices_list_the_ptx_backend_once() {
    assert!(DEVICE_NAMES.contains(&"cuda"), "{DEVICE_NAMES:?}");
    let (devices, unavailable) = available_devices();
    let running = devices.iter().filter(|d| d.backend() == "ptx").count();
    let missing: Vec<_> = unavailable.iter().filter(|u| u.backend == "ptx").collect();
    assert_eq!(
        running + missing.len(),
        1,
        "ptx must be listed exactly once"
    );
    for u in missing {
        assert!(!u.reason.is_empty());
        qforge_testkit::unavailable(u.device, &u.reason);
    }
    match device_by_name("cuda") {
        Ok(d) => assert_eq!((d.name(), d.backend()), ("cuda", "ptx")),
        Err(e) => assert!(e.to_string().contains("cuda"), "{e}"),
    }
}

/// Normal-looking values mixed with edge values (deterministic; an xorshift generator).
fn inputs(n: usize) -> Vec<f32> {
    let edge = [
        0.0,
        -0.0,
        f32::MIN_POSITIVE / 3.0,
        f32::from_bits(1),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        3.0e38,
        -1.0,
        1.0,
        0.5,
        0.8614784,
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if i % 17 == 5 {
                edge[(state % edge.len() as u64) as usize]
            } else {
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            }
        })
        .collect()
}

/// Runs `spec` on `dev` and on the interpreter for each length in `lengths`; returns the
/// number of launches compared.
fn compare(dev: &CudaDevice, spec: &kernels::KernelSpec, lengths: &[usize]) -> usize {
    let kernel = spec.build().expect("library kernel builds");
    for &n in lengths {
        let mut reference = spec.example_args(&inputs(n)).expect("example args");
        let mut args = reference.clone();
        InterpreterDevice
            .launch(&kernel, &mut OwnedArg::borrow_all(&mut reference))
            .expect("interpreter runs");
        dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
            .unwrap_or_else(|e| panic!("{} (n = {n}): {e}", kernel.name));
        let (bad, total) = count_mismatches(&kernel, &reference, &args);
        assert_eq!(bad, 0, "{} (n = {n}): {bad} of {total} differ", kernel.name);
    }
    lengths.len()
}

#[test]
fn library_kernels_are_bit_exact_on_the_gpu() {
    use kernels::KernelSpec as K;
    let Some(dev) = gpu() else { return };
    let mut checked = 0;
    let mut kernels = 0;
    for spec in kernels::catalog() {
        let bs = spec.blocksize();
        // Lengths around the 128-thread block, a partial block, and 128 blocks plus a tail.
        let sweep = [1, 3, 127, 128, 129, bs * 3 + 5, 128 * bs + 7];
        let picked = match spec {
            K::Quant4(kernels::Quant4Spec { blocksize: 64, .. }) | K::DoubleQuant(_) => true,
            K::Blockwise8(kernels::Blockwise8Spec {
                blocksize: 256,
                dtype,
                ..
            }) => dtype == DType::F16,
            _ => false,
        };
        if picked {
            checked += compare(&dev, &spec, &sweep);
            kernels += 1;
        } else if spec.name().starts_with("matmul_4bit") && spec.name().contains("_bs64_") {
            // The fused matmul reduces over n: a few small lengths keep the interpreter quick.
            checked += compare(&dev, &spec, &[1, 3, 64, 131]);
            kernels += 1;
        }
    }
    assert!(kernels >= 20, "{kernels} kernels picked");
    println!(
        "{checked} launches of {kernels} kernels bit-exact on {}",
        dev.gpu_name()
    );
}

/// `out[2i] = x[i] * s` (odd elements never stored) and `ks[i] = k + i` over a grid of `n`.
fn strided_kernel() -> Kernel {
    let mut b = KernelBuilder::new("cuda_test_strided");
    let n = b.scalar_param("n", ScalarType::U32);
    let s = b.scalar_param("s", ScalarType::F32);
    let k = b.scalar_param("k", ScalarType::I32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Write,
    );
    let ks = b.buffer_param("ks", DType::I32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let w = b.work_item();
    let v = b.load(x, w);
    let sv = b.param(s);
    let scaled = b.mul(v, sv);
    let two = b.const_u32(2);
    let at = b.mul(w, two);
    b.store(out, at, scaled);
    let wi = b.bitcast(w, ScalarType::I32);
    let kv = b.param(k);
    let sum = b.add(kv, wi);
    b.store(ks, w, sum);
    b.finish()
}

fn f32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn scalars_write_buffers_and_empty_grids_follow_the_abi() {
    let Some(dev) = gpu() else { return };
    let kernel = strided_kernel();
    for n in [0usize, 1, 300] {
        let x = inputs(n);
        let s = -1.5f32;
        let k = -7i32;
        let sentinel = 0x7FC0_1234u32; // a NaN pattern nobody computes
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(n as u32)),
            OwnedArg::Scalar(Scalar::f32(s)),
            OwnedArg::Scalar(Scalar::I32(k)),
            OwnedArg::Read(x.iter().flat_map(|v| v.to_le_bytes()).collect()),
            OwnedArg::Write(sentinel.to_le_bytes().repeat(2 * n)),
            OwnedArg::Write(vec![0xAB; 4 * n]),
        ];
        dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut args))
            .unwrap_or_else(|e| panic!("n = {n}: {e}"));
        // Computed here, independently of any backend.
        let want_out: Vec<u32> = x
            .iter()
            .flat_map(|v| [(v * s).to_bits(), sentinel])
            .collect();
        let want_ks: Vec<u32> = (0..n).map(|i| k.wrapping_add(i as i32) as u32).collect();
        let (OwnedArg::Write(out), OwnedArg::Write(ks)) = (&args[4], &args[5]) else {
            unreachable!("built above")
        };
        let got_out = f32s(out);
        for (i, (g, w)) in got_out.iter().zip(&want_out).enumerate() {
            let both_nan = f32::from_bits(*g).is_nan() && f32::from_bits(*w).is_nan() && i % 2 == 0;
            assert!(g == w || both_nan, "n = {n}, out[{i}]: {g:#x} != {w:#x}");
        }
        assert_eq!(f32s(ks), want_ks, "n = {n}");
    }
    // Compiling again hits the cache and still runs.
    dev.compile(&kernel).expect("cached compile");
}

/// The `qforge` binary, without `check`'s libtpu column (these checks run every kernel; the
/// libtpu compile of every Mosaic module, minutes, is `tests/mosaic.rs`'s and `tests/check.rs`'s).
fn qforge() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qforge"));
    c.env("QFORGE_MOSAIC_PYTHON", "");
    c
}

#[test]
fn check_on_the_cuda_device_runs_or_says_why() {
    let gpu_here = gpu().is_some();
    let out = qforge()
        .args(["check", "--device", "cuda", "--json"])
        .output()
        .expect("runs qforge");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !gpu_here {
        assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
        assert!(stderr.contains("device 'cuda'"), "stderr: {stderr}");
        if !libcuda_visible() {
            assert!(stderr.contains("CUDA driver not found"), "stderr: {stderr}");
        }
        assert!(stdout.is_empty(), "no rows without the device: {stdout}");
        qforge_testkit::unavailable("cuda", stderr.trim());
        return;
    }
    // Every other backend without a device generates its code: any failure is a mismatch.
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let ptx: Vec<&serde_json::Value> = rows.iter().filter(|r| r["backend"] == "ptx").collect();
    let kernels = rows
        .iter()
        .filter(|r| r["backend"] == "interpreter")
        .count();
    assert_eq!(ptx.len(), kernels, "one ptx row per kernel");
    for r in ptx {
        assert_eq!(r["status"], "exact", "{r}");
    }
    assert!(
        rows.iter().all(|r| r["backend"] != "cranelift"),
        "--device cuda must not run the CPU device"
    );
}

#[test]
fn check_with_the_interpreter_device_runs_nothing_else() {
    let out = qforge()
        .args(["check", "--device", "interpreter", "--json"])
        .output()
        .expect("runs qforge");
    // The other backends only generate code here, and every kernel must generate.
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let backends: std::collections::BTreeSet<String> = stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            v["backend"].as_str().unwrap_or("").to_string()
        })
        .collect();
    assert!(backends.contains("interpreter"), "{backends:?}");
    assert!(!backends.contains("cranelift"), "{backends:?}");
    let bad = qforge()
        .args(["check", "--device", "nonesuch"])
        .output()
        .expect("runs qforge");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown device 'nonesuch'"));
}
