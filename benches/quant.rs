//! NF4 quantize and dequantize of 64 Mi f32 values on the CPU device, each against a memcpy in
//! the same run (of the kernel's output bytes, and for quantize also of its input bytes), plus
//! the JIT compile time of one kernel. Throughputs are in bytes written per second; the summary
//! at the end prints the ratios kernel / memcpy.
//!
//! Run: `cargo bench --bench quant` (QFORGE_BENCH_ELEMENTS overrides the 64 Mi element count).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use qforge::ir::{DType, Kernel, OwnedArg};
use qforge::kernels::{KernelSpec, Quant4Op, Quant4Spec, QuantType};
use qforge::runtime::{CpuDevice, Device};

fn elements() -> usize {
    std::env::var("QFORGE_BENCH_ELEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20)
}

fn values(n: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

struct Case {
    kernel: Kernel,
    args: Vec<OwnedArg>,
    out_bytes: usize,
    in_bytes: usize,
}

fn case(spec: KernelSpec, xs: &[f32]) -> Case {
    let kernel = spec.build().expect("kernel builds");
    let args = spec.example_args(xs).expect("example args");
    let out_bytes = args
        .iter()
        .map(|a| {
            if let OwnedArg::Write(b) = a {
                b.len()
            } else {
                0
            }
        })
        .sum();
    let in_bytes = args
        .iter()
        .map(|a| {
            if let OwnedArg::Read(b) = a {
                b.len()
            } else {
                0
            }
        })
        .sum();
    Case {
        kernel,
        args,
        out_bytes,
        in_bytes,
    }
}

fn run(dev: &CpuDevice, c: &mut Case) {
    dev.launch(&c.kernel, &mut OwnedArg::borrow_all(&mut c.args))
        .expect("launch");
}

/// Median of `reps` timings of `f`.
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

fn specs() -> (KernelSpec, KernelSpec) {
    let q = KernelSpec::Quant4(Quant4Spec {
        op: Quant4Op::Quantize,
        quant_type: QuantType::Nf4,
        blocksize: 64,
        dtype: DType::F32,
    });
    let d = KernelSpec::Quant4(Quant4Spec {
        op: Quant4Op::Dequantize,
        quant_type: QuantType::Nf4,
        blocksize: 64,
        dtype: DType::F32,
    });
    (q, d)
}

fn benches(c: &mut Criterion) {
    let n = elements();
    let xs = values(n);
    let dev = CpuDevice::new().expect("cpu device");
    let (q, d) = specs();
    let mut quant = case(q, &xs);
    let mut dequant = case(d, &xs);
    let src = vec![1u8; dequant.out_bytes.max(quant.in_bytes)];
    let mut dst = vec![0u8; src.len()];

    let mut g = c.benchmark_group("nf4_dequantize_64Mi_f32");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Bytes(dequant.out_bytes as u64));
    g.bench_function("memcpy_output_bytes", |b| {
        b.iter(|| dst[..dequant.out_bytes].copy_from_slice(black_box(&src[..dequant.out_bytes])))
    });
    g.bench_function("cpu_device", |b| b.iter(|| run(&dev, &mut dequant)));
    g.finish();

    let mut g = c.benchmark_group("nf4_quantize_64Mi_f32");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Bytes(quant.out_bytes as u64));
    g.bench_function("memcpy_output_bytes", |b| {
        b.iter(|| dst[..quant.out_bytes].copy_from_slice(black_box(&src[..quant.out_bytes])))
    });
    g.bench_function("memcpy_input_bytes", |b| {
        b.iter(|| dst[..quant.in_bytes].copy_from_slice(black_box(&src[..quant.in_bytes])))
    });
    g.bench_function("cpu_device", |b| b.iter(|| run(&dev, &mut quant)));
    g.finish();

    let mut g = c.benchmark_group("jit_compile");
    g.sample_size(20);
    for spec in [q, d] {
        let kernel = spec.build().expect("kernel builds");
        g.bench_function(kernel.name.clone(), |b| {
            b.iter(|| {
                CpuDevice::new()
                    .expect("device")
                    .compile(black_box(&kernel))
                    .expect("compiles")
            })
        });
    }
    g.finish();

    // Ratios in one run (median of 7), the figure the issue asks for.
    let mc_out = median(7, || {
        dst[..dequant.out_bytes].copy_from_slice(&src[..dequant.out_bytes])
    });
    let deq = median(7, || run(&dev, &mut dequant));
    let mc_qout = median(7, || {
        dst[..quant.out_bytes].copy_from_slice(&src[..quant.out_bytes])
    });
    let mc_qin = median(7, || {
        dst[..quant.in_bytes].copy_from_slice(&src[..quant.in_bytes])
    });
    let qt = median(7, || run(&dev, &mut quant));
    let gbs = |bytes: usize, t: Duration| bytes as f64 / t.as_secs_f64() / 1e9;
    println!(
        "\nsummary ({n} elements, {} threads):",
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    println!("  dequantize nf4 bs64 f32: {:.2} GB/s written; memcpy of the output bytes {:.2} GB/s; ratio {:.2}x memcpy",
        gbs(dequant.out_bytes, deq), gbs(dequant.out_bytes, mc_out), mc_out.as_secs_f64() / deq.as_secs_f64());
    println!("  quantize nf4 bs64 f32: {:.1} ms; memcpy of the output bytes {:.1} ms (ratio {:.2}x); memcpy of the input bytes {:.1} ms (ratio {:.2}x)",
        qt.as_secs_f64() * 1e3, mc_qout.as_secs_f64() * 1e3, mc_qout.as_secs_f64() / qt.as_secs_f64(), mc_qin.as_secs_f64() * 1e3, mc_qin.as_secs_f64() / qt.as_secs_f64());
}

criterion_group!(quant, benches);

fn main() {
    quant();
    Criterion::default().configure_from_args().final_summary();
}
