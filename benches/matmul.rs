//! The fused NF4 matmul on the CPU device (GEMV `M = 1` and GEMM `M = 16` at `(K, N)` =
//! (4096, 4096), (4096, 11008), (8192, 8192), f32 and bf16 activations), each case in the same
//! run as an fp32 GEMM of the same shape (the `gemm` crate) and a memcpy of the bytes the 4-bit
//! kernel reads. The cases are `qforge bench`'s (`src/bench/matmul_cases.rs`); the summary at the
//! end prints the ratios baseline time / kernel time (above 1: the kernel is faster).
//!
//! Run: `cargo bench --bench matmul` (`QFORGE_BENCH_FILTER=M=1,` keeps matching shapes only;
//! `QFORGE_BENCH_DEVICE=cpu-llvm` with `--features llvm` times the LLVM CPU device).

use std::time::Duration;

use criterion::{criterion_group, Criterion, Throughput};
use qforge::bench::cases::CaseSize;
use qforge::bench::matmul_cases::matmul_cases;

fn bench(c: &mut Criterion) {
    // `QFORGE_BENCH_DEVICE=cpu-llvm` (with `--features llvm`) times the LLVM CPU device.
    let name = std::env::var("QFORGE_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    let dev = qforge::devices::device_by_name(&name).expect("the bench device");
    let dev = dev.as_ref();
    let filter = std::env::var("QFORGE_BENCH_FILTER").unwrap_or_default();
    let mut summary = Vec::new();
    for mut case in matmul_cases(CaseSize::Full) {
        if !case.shape.contains(&filter) {
            continue;
        }
        let id = format!("{} {} {}", case.kernel, case.shape, case.dtype);
        let mut group = c.benchmark_group(&id);
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(2));
        group.throughput(Throughput::Bytes(case.bytes as u64));
        (case.run)(dev).expect("warm-up");
        group.bench_function("kernel", |b| b.iter(|| (case.run)(dev).expect("runs")));
        let kernel_time =
            qforge::bench::time_median(&mut case.run, dev, &qforge::bench::Timing::QUICK)
                .expect("times");
        for base in &mut case.baselines {
            (base.run)(dev).expect("warm-up");
            group.bench_function(&base.name, |b| b.iter(|| (base.run)(dev).expect("runs")));
            let t = qforge::bench::time_median(&mut base.run, dev, &qforge::bench::Timing::QUICK)
                .expect("times");
            summary.push(format!(
                "{id}: {} / kernel = {:.3}",
                base.name,
                t.as_secs_f64() / kernel_time.as_secs_f64()
            ));
        }
        group.finish();
    }
    println!(
        "\nratios (baseline time / kernel time):\n{}",
        summary.join("\n")
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
