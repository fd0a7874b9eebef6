//! NF4 quantize and dequantize on the wgpu device against the CPU device in the same run
//! (16 Mi f32 values by default; `QFORGE_BENCH_ELEMENTS` overrides). On a machine without a GPU
//! the wgpu device is Mesa's lavapipe, a CPU Vulkan driver: those are CPU numbers, not GPU
//! numbers. Times include the host-device copies a `launch` does.
//!
//! Run: `cargo bench --features wgpu --bench wgpu`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use qforge::ir::{DType, OwnedArg};
use qforge::kernels::{KernelSpec, Quant4Op, Quant4Spec, QuantType};
use qforge::runtime::{CpuDevice, Device, WgpuDevice};

fn median(reps: usize, mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[reps / 2]
}

fn main() {
    let n: usize = std::env::var("QFORGE_BENCH_ELEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 20);
    let wgpu = match WgpuDevice::new() {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: no wgpu adapter: {e}");
            return;
        }
    };
    let cpu = CpuDevice::new().expect("cpu device");
    let xs: Vec<f32> = (0..n)
        .map(|i| ((i.wrapping_mul(2654435761) % 2001) as f32 - 1000.0) / 250.0)
        .collect();
    println!("{n} elements; wgpu adapter: {}", wgpu.name());
    for (what, spec) in [
        (
            "dequantize_4bit nf4 bs64 f32",
            KernelSpec::Quant4(Quant4Spec {
                op: Quant4Op::Dequantize,
                quant_type: QuantType::Nf4,
                blocksize: 64,
                dtype: DType::F32,
            }),
        ),
        (
            "quantize_4bit nf4 bs64 f32",
            KernelSpec::Quant4(Quant4Spec {
                op: Quant4Op::Quantize,
                quant_type: QuantType::Nf4,
                blocksize: 64,
                dtype: DType::F32,
            }),
        ),
    ] {
        let kernel = spec.build().expect("kernel builds");
        let args = spec.example_args(&xs).expect("example args");
        let mut times = Vec::new();
        for dev in [&cpu as &dyn Device, &wgpu as &dyn Device] {
            // Outputs are overwritten by every launch, so one argument list serves all repetitions.
            let mut a = args.clone();
            dev.launch(&kernel, &mut OwnedArg::borrow_all(&mut a))
                .expect("warm-up launch");
            let t = median(5, || {
                dev.launch(black_box(&kernel), &mut OwnedArg::borrow_all(&mut a))
                    .expect("launch");
            });
            times.push(t);
        }
        println!(
            "  {what}: cpu {:.1} ms, wgpu {:.1} ms (wgpu/cpu time ratio {:.2})",
            times[0].as_secs_f64() * 1e3,
            times[1].as_secs_f64() * 1e3,
            times[1].as_secs_f64() / times[0].as_secs_f64()
        );
    }
}
