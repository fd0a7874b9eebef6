//! The fused NF4 matmul at training shapes (issue 25): the forward `matmul_4bit_nf4_train` and
//! the input gradient `matmul_4bit_dx_nf4_train` at M = 16, 128, 512, 2048 and (K, N) =
//! (4096, 4096), (4096, 11008), (11008, 4096), f32 and bf16 activations, each in the same run as
//! `fp32_gemm` (the same product by the `gemm` crate in f32 on a dequantized copy of the
//! weight, on the device's threads). The cases are `qforge bench --suite train`'s
//! (`src/bench/train_cases.rs`); the summary at the end prints, per case, the ratio baseline
//! time / kernel time (above 1: the kernel is faster), the GFLOP/s of both (2 M N K FLOP per
//! run) and the kernel's fraction of the CPU's measured peak for its dtype
//! (`src/bench/peak.rs`).
//!
//! Run: `cargo bench --bench matmul_train` (`QFORGE_BENCH_FILTER=M=16,` keeps matching
//! `kernel shape` strings only, e.g. `dx_nf4_train M=512,`; `QFORGE_BENCH_DEVICE=cpu-llvm` with
//! `--features llvm` times the LLVM CPU device). Criterion takes 10 samples per function, its
//! minimum; at M = 2048 the input gradient takes seconds per run today, so the whole list takes
//! tens of minutes: filter.

use std::time::Duration;

#[global_allocator]
static ALLOCATOR: qforge::aligned_alloc::CacheLineAligned = qforge::aligned_alloc::CacheLineAligned;

use criterion::{criterion_group, Criterion, SamplingMode, Throughput};
use qforge::bench::baselines::host_threads;
use qforge::bench::cases::CaseSize;
use qforge::bench::peak::{measure_peak, PEAK_DURATION};
use qforge::bench::train_cases::train_cases;
use qforge::bench::{time_median, BenchCase, BenchRow, Timing};

fn bench(c: &mut Criterion) {
    // `QFORGE_BENCH_DEVICE=cpu-llvm` (with `--features llvm`) times the LLVM CPU device.
    let name = std::env::var("QFORGE_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    let dev = qforge::devices::device_by_name(&name).expect("the bench device");
    let dev = dev.as_ref();
    let filter = std::env::var("QFORGE_BENCH_FILTER").unwrap_or_default();
    let peak = measure_peak(host_threads(dev), PEAK_DURATION);
    let mut summary = Vec::new();
    for mut case in train_cases(CaseSize::Full) {
        let id = format!("{} {} {}", case.kernel, case.shape, case.dtype);
        if !format!("{} {}", case.kernel, case.shape).contains(&filter) {
            continue;
        }
        let mut group = c.benchmark_group(&id);
        group.sample_size(10);
        group.sampling_mode(SamplingMode::Flat);
        group.warm_up_time(Duration::from_millis(1));
        group.measurement_time(Duration::from_secs(1));
        if let Some(flops) = case.flops {
            group.throughput(Throughput::Elements(flops));
        }
        (case.run)(dev).expect("warm-up");
        group.bench_function("kernel", |b| b.iter(|| (case.run)(dev).expect("runs")));
        let kernel_time = time_median(&mut case.run, dev, &Timing::TRAIN).expect("times");
        // Free the kernel's buffers before the baselines allocate theirs.
        case.run = Box::new(|_| Ok(()));
        let baselines = std::mem::take(&mut case.baselines);
        for mut base in baselines {
            (base.run)(dev).expect("warm-up");
            group.bench_function(&base.name, |b| b.iter(|| (base.run)(dev).expect("runs")));
            let t = time_median(&mut base.run, dev, &Timing::TRAIN).expect("times");
            summary.push(line(&case, &id, &base.name, kernel_time, t, &peak));
        }
        group.finish();
    }
    println!(
        "\nmeasured peak on {} threads: f32 {:.1} GFLOP/s ({}), bf16 {}",
        peak.threads,
        peak.f32.flops_per_s / 1e9,
        peak.f32.isa.name(),
        peak.bf16.map_or("none".into(), |r| format!(
            "{:.1} GFLOP/s ({})",
            r.flops_per_s / 1e9,
            r.isa.name()
        ))
    );
    println!(
        "ratios (baseline time / kernel time), GFLOP/s (criterion's elements/s are FLOP/s) and \
         % of peak:\n{}",
        summary.join("\n")
    );
}

/// One summary line: ratio, GFLOP/s of kernel and baseline, the kernel's % of its dtype's peak.
fn line(
    case: &BenchCase,
    id: &str,
    base: &str,
    kernel: Duration,
    baseline: Duration,
    peak: &qforge::bench::peak::Peak,
) -> String {
    let row = BenchRow::new(case, kernel, base, baseline).with_peak(peak);
    let g = |x: Option<f64>| x.map_or("-".into(), |g| format!("{g:.1}"));
    format!(
        "{id}: {base} / kernel = {:.3}, kernel {} GFLOP/s ({}% of peak), {base} {} GFLOP/s",
        row.ratio,
        g(row.gflops),
        row.peak_fraction
            .map_or("-".into(), |p| format!("{:.1}", p * 100.0)),
        g(row.baseline_gflops),
    )
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
