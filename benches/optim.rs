//! One optimizer step on 16 Mi `f32` parameters on a CPU device, all in the same run: fp32
//! AdamW (`adamw32`), 8-bit blockwise AdamW (`adamw8bit`) and the 4-bit AdamW recipes ZIP-SR
//! (`adamw4bit_zip_sr`) and ZE-EDEN (`adamw4bit_ze_eden`), each next to a memcpy of the bytes
//! its step touches (parameters read and written, gradients, codes, scales). The cases are
//! `qforge bench`'s (`src/bench/optim_cases.rs`: moments filled by a few untimed warm-up steps,
//! then one more step per run on the same buffers). Criterion reports params/s; the summary at
//! the end prints, per case, params/s, GB/s of the touched bytes and the ratios baseline time /
//! kernel time against `adamw32` and against the memcpy (above 1: the step is faster).
//!
//! Run: `cargo bench --bench optim` (`-- --quick` for a short run; `QFORGE_BENCH_ELEMENTS`
//! overrides the 16 Mi parameter count, `QFORGE_BENCH_FILTER=8bit` keeps matching cases only,
//! `QFORGE_BENCH_DEVICE=cpu-llvm` with `--features llvm` times the LLVM CPU device).

use std::time::Duration;

use criterion::{criterion_group, Criterion, SamplingMode, Throughput};
use qforge::bench::baselines::MEMCPY;
use qforge::bench::cases::CaseSize;
use qforge::bench::optim_cases::{optim_cases, ADAMW32};
use qforge::bench::{time_median, Runner, Timing};
use qforge::runtime::Device;

/// The timing behind the summary's ratios: the median of 3 runs after a warm-up (a 4-bit step
/// takes seconds on 2 cores).
const SUMMARY: Timing = Timing {
    target: Duration::ZERO,
    min_runs: 3,
    max_runs: 3,
};

fn size() -> CaseSize {
    std::env::var("QFORGE_BENCH_ELEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(CaseSize::Full, CaseSize::Elements)
}

/// Times one runner for the summary.
fn median(run: &mut Runner, dev: &dyn Device) -> Duration {
    time_median(run, dev, &SUMMARY).expect("times")
}

/// One summary line's measurements.
struct Row {
    kernel: String,
    bytes: usize,
    step: Duration,
    memcpy: Duration,
}

fn bench(c: &mut Criterion) {
    // `QFORGE_BENCH_DEVICE=cpu-llvm` (with `--features llvm`) times the LLVM CPU device.
    let name = std::env::var("QFORGE_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    let dev = qforge::devices::device_by_name(&name).expect("the bench device");
    let dev = dev.as_ref();
    let filter = std::env::var("QFORGE_BENCH_FILTER").unwrap_or_default();
    let n = size().elements();
    let mut cases = optim_cases(size());
    let shape = cases.first().map(|c| c.shape.clone()).unwrap_or_default();
    let mut group = c.benchmark_group(format!("optim_step {shape} f32"));
    // Flat sampling: every sample runs the same (small) number of steps, which keeps a 2-second
    // 4-bit step at 10 samples instead of criterion's linear ramp of 55.
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements(n as u64));
    let mut rows = Vec::new();
    for case in &mut cases {
        // adamw32 always runs: it is every other case's baseline.
        if !(case.kernel == ADAMW32 || case.kernel.contains(&filter)) {
            continue;
        }
        (case.run)(dev).expect("warm-up");
        group.bench_function(&case.kernel, |b| b.iter(|| (case.run)(dev).expect("runs")));
        let step = median(&mut case.run, dev);
        let Some(memcpy) = case.baselines.iter_mut().find(|b| b.name == MEMCPY) else {
            panic!("{} has no memcpy baseline", case.kernel);
        };
        (memcpy.run)(dev).expect("warm-up");
        let id = format!("{MEMCPY}_{}_bytes", case.kernel);
        group.bench_function(id, |b| b.iter(|| (memcpy.run)(dev).expect("runs")));
        let memcpy = median(&mut memcpy.run, dev);
        rows.push(Row {
            kernel: case.kernel.clone(),
            bytes: case.bytes,
            step,
            memcpy,
        });
    }
    group.finish();

    let Some(adamw32) = rows.iter().find(|r| r.kernel == ADAMW32).map(|r| r.step) else {
        panic!("the optimizer cases have no {ADAMW32}");
    };
    let secs = |t: Duration| t.as_secs_f64();
    println!(
        "\nsummary ({n} f32 parameters, {} threads; ratios are baseline time / kernel time):",
        std::thread::available_parallelism().map_or(1, |p| p.get())
    );
    for r in &rows {
        println!(
            "  {}: {:.1} ms, {:.3e} params/s, {:.2} GB/s of {:.1} MiB touched; {ADAMW32} / \
             kernel = {:.3}; {MEMCPY} / kernel = {:.3} (memcpy {:.1} ms)",
            r.kernel,
            secs(r.step) * 1e3,
            n as f64 / secs(r.step),
            r.bytes as f64 / secs(r.step) / 1e9,
            r.bytes as f64 / (1u64 << 20) as f64,
            secs(adamw32) / secs(r.step),
            secs(r.memcpy) / secs(r.step),
            secs(r.memcpy) * 1e3,
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
