//! The speed an exact AMX path could reach: a bf16 `[M, K] x [K, N]` product in the `amx 32`
//! order by AMX `tdpbf16ps` (`qforge::probe::bf16_dot::amx32_gemm`: the probe's check GEMM,
//! 32 x 32 blocks of `C`, no further cache blocking; not a library kernel yet,
//! `docs/semantics.md`, "bf16 dot-product instructions"), against the `gemm` crate's f32 GEMM
//! (`qforge bench`'s `fp32_gemm` baseline) on the same shape, at M = 512, K = N = 4096
//! (`QFORGE_BENCH_SHAPE=M,K,N` overrides; multiples of 32). `B` is packed into AMX's pair
//! panels beforehand (`Amx32Weight::pack`, timed apart: a weight is packed once, or decoded
//! straight into the layout). The summary at the end prints the medians, GFLOP/s and the ratio
//! f32 time / AMX time (above 1: AMX is faster). On a CPU or kernel without AMX it prints why
//! and times nothing.
//!
//! Run: `cargo bench --bench amx`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, SamplingMode};
use qforge::bench::baselines::fp32_gemm;
use qforge::probe::bf16_dot::{amx32_gemm, amx32_reference, Amx32Weight, ProbeError};

/// `(M, K, N)` from `QFORGE_BENCH_SHAPE` (three positive multiples of 32), else 512 x 4096 x
/// 4096; anything else ends the bench with a message and exit code 2.
fn shape() -> (usize, usize, usize) {
    let Ok(v) = std::env::var("QFORGE_BENCH_SHAPE") else {
        return (512, 4096, 4096);
    };
    let dims: Vec<Option<usize>> = v.split(',').map(|d| d.trim().parse().ok()).collect();
    match dims[..] {
        [Some(m), Some(k), Some(n)] if [m, k, n].iter().all(|&d| d > 0 && d % 32 == 0) => (m, k, n),
        _ => {
            eprintln!(
                "QFORGE_BENCH_SHAPE={v}: want M,K,N, three positive multiples of 32 (e.g. 512,4096,4096)"
            );
            std::process::exit(2)
        }
    }
}

/// The median of 5 runs after one warm-up.
fn median(mut run: impl FnMut()) -> Duration {
    run();
    let mut times: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[2]
}

fn bench(c: &mut Criterion) {
    let (m, k, n) = shape();
    // bf16 values 1 + j/128 (j < 8) and their f32 copies: every product is exact in f32.
    let bf = |len: usize, step: usize| -> Vec<u16> {
        (0..len).map(|i| 0x3f80 + ((i * step) % 8) as u16).collect()
    };
    let (a, b) = (bf(m * k, 3), bf(n * k, 5));
    let packed = Amx32Weight::pack(&b, n, k).expect("shape() gives multiples of 32");
    let first = match amx32_gemm(&a, m, &packed) {
        Ok(c) => c,
        Err(ProbeError::Unavailable(why)) => return println!("skipped: {why}"),
        Err(e) => panic!("shape() gives multiples of 32: {e}"),
    };
    // Row 0 of C against the order computed by IEEE arithmetic.
    assert_eq!(
        first[..n].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        amx32_reference(&a[..k], &b, (1, n, k))
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        "amx32_gemm's first row is not the amx 32 order"
    );
    let widen = |v: &[u16]| -> Vec<f32> {
        v.iter()
            .map(|&h| f32::from_bits(u32::from(h) << 16))
            .collect()
    };
    let (af, bf32) = (widen(&a), widen(&b));
    let mut cf = vec![0.0f32; m * n];
    let mut group = c.benchmark_group(format!("gemm M={m},K={k},N={n} (AMX bf16, f32 baseline)"));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    let amx = || std::hint::black_box(amx32_gemm(&a, m, &packed).expect("runs"));
    group.bench_function("amx32_gemm", |bench| bench.iter(amx));
    let mut f32_gemm = || fp32_gemm(&af, &bf32, &mut cf, m, k, n).expect("runs");
    group.bench_function("fp32_gemm", |bench| bench.iter(&mut f32_gemm));
    group.finish();
    let (t_amx, t_f32) = (median(|| drop(amx())), median(f32_gemm));
    let t_pack = median(|| drop(Amx32Weight::pack(&b, n, k)));
    let gflops = |t: Duration| 2.0 * (m * n * k) as f64 / t.as_secs_f64() / 1e9;
    println!(
        "\nsummary (M = {m}, K = {k}, N = {n}, {} threads): amx32_gemm {:.2} ms ({:.0} GFLOP/s), \
         fp32_gemm {:.2} ms ({:.0} GFLOP/s); fp32_gemm / amx32_gemm = {:.2}; packing B {:.2} ms",
        std::thread::available_parallelism().map_or(1, |p| p.get()),
        t_amx.as_secs_f64() * 1e3,
        gflops(t_amx),
        t_f32.as_secs_f64() * 1e3,
        gflops(t_f32),
        t_f32.as_secs_f64() / t_amx.as_secs_f64(),
        t_pack.as_secs_f64() * 1e3
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
