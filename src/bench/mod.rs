//! `qforge bench`: a quick benchmark of the library kernels on one device (about half a minute on 2 cores),
//! each case compared with the baselines it names; `--suite train` runs the training-shape
//! matmul cases of [`train_cases`] instead, with GFLOP/s and the fraction of the CPU's measured
//! peak ([`peak`]).
//!
//! A [`BenchCase`] describes one kernel at one shape: its name, shape string, dtype, the bytes it
//! reads plus writes, a [`Runner`] that runs it once on a device, and its [`Baseline`]s, each
//! with its own runner. [`time_median`] times a runner (one untimed warm-up call, then repeats
//! until about [`Timing::target`] has passed and at least [`Timing::min_runs`] runs are done) and
//! [`run_bench`] turns every (case, baseline) pair into a [`BenchRow`]. The cases are listed in
//! [`cases::cases`], the baselines built by [`baselines`]; [`report`] prints the rows.
//!
//! Adding a case is a few lines in [`cases::cases`]: a library kernel with
//! [`cases::library_case`], or any closure with [`BenchCase::new`] and [`BenchCase::baseline`]
//! (and [`BenchCase::flops`] when its floating-point operation count is known: its rows then
//! carry GFLOP/s).

use std::time::{Duration, Instant};

use qforge_ir::DType;
use qforge_runtime::Device;

use crate::error::{Error, Result};

pub mod adapter_cases;
pub mod baselines;
pub mod cases;
pub mod int8_cases;
pub mod matmul_cases;
pub mod optim_cases;
pub mod peak;
pub mod report;
pub mod train_cases;

/// Runs a kernel or a baseline once on a device. The first call is the untimed warm-up: it may
/// build inputs, allocate and touch buffers, and compile the kernel; later calls should only run.
pub type Runner = Box<dyn FnMut(&dyn Device) -> Result<()>>;

/// A reference point a kernel's time is divided into.
pub struct Baseline {
    /// Name in the output (`memcpy`, `fp32_gemm`).
    pub name: String,
    /// Runs the baseline once.
    pub run: Runner,
}

/// One kernel at one shape, with the baselines it is compared with.
pub struct BenchCase {
    /// Kernel name in the output (what `--filter` matches), e.g. `dequantize_4bit_nf4`.
    pub kernel: String,
    /// Shape in words, e.g. `n=16777216`.
    pub shape: String,
    /// The dtype of the kernel's float data.
    pub dtype: DType,
    /// Bytes the kernel reads plus the bytes it writes in one run (its memory traffic).
    pub bytes: usize,
    /// Runs the kernel once.
    pub run: Runner,
    /// The baselines, in output order.
    pub baselines: Vec<Baseline>,
    /// Floating-point operations of one run of the kernel (and of each baseline, which computes
    /// the same thing), when declared: `2 * M * N * K` for a matmul. Rows then carry GFLOP/s.
    pub flops: Option<u64>,
}

impl BenchCase {
    /// A case without baselines yet (add them with [`BenchCase::baseline`]).
    pub fn new(
        kernel: impl Into<String>,
        shape: impl Into<String>,
        dtype: DType,
        bytes: usize,
        run: Runner,
    ) -> Self {
        BenchCase {
            kernel: kernel.into(),
            shape: shape.into(),
            dtype,
            bytes,
            run,
            baselines: Vec::new(),
            flops: None,
        }
    }

    /// Adds a baseline.
    pub fn baseline(mut self, baseline: Baseline) -> Self {
        self.baselines.push(baseline);
        self
    }

    /// Declares the floating-point operations of one run (the kernel's and its baselines').
    pub fn flops(mut self, flops: u64) -> Self {
        self.flops = Some(flops);
        self
    }
}

/// How long [`time_median`] keeps repeating a runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Keep running until this much time has passed in timed runs...
    pub target: Duration,
    /// ...and at least this many timed runs are done...
    pub min_runs: usize,
    /// ...but never more runs than this.
    pub max_runs: usize,
}

impl Timing {
    /// `qforge bench`: about 0.3 s per measurement, at least 5 runs, at most 10 000.
    pub const QUICK: Timing = Timing {
        target: Duration::from_millis(300),
        min_runs: 5,
        max_runs: 10_000,
    };

    /// `qforge bench --suite train`: runs of up to seconds each (M = 2048), so about 0.5 s per
    /// measurement and at least 3 runs.
    pub const TRAIN: Timing = Timing {
        target: Duration::from_millis(500),
        min_runs: 3,
        max_runs: 1000,
    };
}

/// The median time of `run` on `dev`: one untimed warm-up call, then timed calls until
/// `timing.target` has passed and `timing.min_runs` calls are done (or `timing.max_runs`). With
/// an even count the median is the mean of the two middle times.
///
/// # Errors
/// The first error of any call.
pub fn time_median(run: &mut Runner, dev: &dyn Device, timing: &Timing) -> Result<Duration> {
    run(dev)?;
    let mut times = Vec::new();
    let start = Instant::now();
    let max_runs = timing.max_runs.max(timing.min_runs).max(1);
    while times.len() < max_runs
        && (times.len() < timing.min_runs.max(1) || start.elapsed() < timing.target)
    {
        let t = Instant::now();
        run(dev)?;
        times.push(t.elapsed());
    }
    times.sort();
    let mid = times.len() / 2;
    Ok(if times.len() % 2 == 1 {
        times[mid]
    } else {
        (times[mid - 1] + times[mid]) / 2
    })
}

/// One (kernel, shape, baseline) result.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    /// Kernel name.
    pub kernel: String,
    /// Shape in words.
    pub shape: String,
    /// Dtype name (`f32`).
    pub dtype: String,
    /// Bytes read plus written by one kernel run.
    pub bytes: usize,
    /// Median kernel time in seconds.
    pub median_s: f64,
    /// `bytes / median_s`.
    pub bytes_per_s: f64,
    /// Baseline name.
    pub baseline: String,
    /// Median baseline time in seconds.
    pub baseline_median_s: f64,
    /// `baseline_median_s / median_s`: above 1 the kernel is faster than the baseline.
    pub ratio: f64,
    /// The case's declared floating-point operations per run ([`BenchCase::flops`]).
    pub flops: Option<u64>,
    /// `flops / median_s / 1e9`.
    pub gflops: Option<f64>,
    /// `flops / baseline_median_s / 1e9`.
    pub baseline_gflops: Option<f64>,
    /// `gflops` over the measured peak of the row's dtype ([`BenchRow::with_peak`]).
    pub peak_fraction: Option<f64>,
    /// `baseline_gflops` over the measured f32 peak (the baselines compute in f32).
    pub baseline_peak_fraction: Option<f64>,
}

impl BenchRow {
    /// A row from the two medians.
    pub fn new(case: &BenchCase, median: Duration, baseline: &str, base: Duration) -> Self {
        let median_s = median.as_secs_f64();
        let baseline_median_s = base.as_secs_f64();
        BenchRow {
            kernel: case.kernel.clone(),
            shape: case.shape.clone(),
            dtype: case.dtype.to_string(),
            bytes: case.bytes,
            median_s,
            bytes_per_s: case.bytes as f64 / median_s,
            baseline: baseline.to_string(),
            baseline_median_s,
            ratio: baseline_median_s / median_s,
            flops: case.flops,
            gflops: case.flops.map(|f| f as f64 / median_s / 1e9),
            baseline_gflops: case.flops.map(|f| f as f64 / baseline_median_s / 1e9),
            peak_fraction: None,
            baseline_peak_fraction: None,
        }
    }

    /// The row with its fractions of `peak` set (rows without flops are unchanged): the kernel
    /// against the peak of its dtype ([`peak::Peak::for_dtype`]), the baseline against the f32
    /// peak.
    pub fn with_peak(mut self, peak: &peak::Peak) -> Self {
        let per_s = |g: Option<f64>| g.map(|g| g * 1e9);
        self.peak_fraction =
            per_s(self.gflops).map(|f| f / peak.for_dtype(&self.dtype).flops_per_s);
        self.baseline_peak_fraction = per_s(self.baseline_gflops).map(|f| f / peak.f32.flops_per_s);
        self
    }
}

/// Keeps the cases whose kernel name, or their line `KERNEL SHAPE DTYPE` (e.g.
/// `matmul_4bit_nf4_train M=512,K=4096,N=4096 f32`), contains `filter` (all of them without
/// one).
///
/// # Errors
/// [`Error::Usage`] when the filter matches no case, naming the filter and the kernels.
pub fn filter_cases(cases: Vec<BenchCase>, filter: Option<&str>) -> Result<Vec<BenchCase>> {
    let Some(filter) = filter else {
        return Ok(cases);
    };
    let names: Vec<String> = cases.iter().map(|c| c.kernel.clone()).collect();
    let kept: Vec<BenchCase> = cases
        .into_iter()
        .filter(|c| format!("{} {} {}", c.kernel, c.shape, c.dtype).contains(filter))
        .collect();
    if kept.is_empty() {
        let mut names = names;
        names.dedup();
        return Err(Error::Usage(format!(
            "--filter '{filter}' matches no bench case (kernels: {})",
            names.join(", ")
        )));
    }
    Ok(kept)
}

/// Times every case and each of its baselines on `dev`, in order, and calls `on_row` as each
/// row is ready (so output can stream). Each case is dropped, with its buffers, once measured.
///
/// # Errors
/// The first error of a kernel or baseline run, prefixed with the case it came from.
pub fn run_bench(
    dev: &dyn Device,
    cases: Vec<BenchCase>,
    timing: &Timing,
    on_row: &mut dyn FnMut(&BenchRow),
) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    for mut case in cases {
        let context = |what: &str, e: Error| {
            Error::Usage(format!(
                "bench {} ({}): {what} failed: {e}",
                case.kernel, case.shape
            ))
        };
        let median = time_median(&mut case.run, dev, timing).map_err(|e| context("kernel", e))?;
        // Free the kernel's buffers before the baselines allocate theirs.
        case.run = Box::new(|_| Ok(()));
        let baselines = std::mem::take(&mut case.baselines);
        for mut b in baselines {
            let base = time_median(&mut b.run, dev, timing)
                .map_err(|e| context(&format!("baseline {}", b.name), e))?;
            let row = BenchRow::new(&case, median, &b.name, base);
            on_row(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_runtime::InterpreterDevice;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A runner that sleeps `ms` milliseconds and counts its calls.
    fn sleeper(ms: u64, calls: Rc<Cell<usize>>) -> Runner {
        Box::new(move |_| {
            calls.set(calls.get() + 1);
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        })
    }

    #[test]
    fn time_median_warms_up_then_runs_at_least_min_runs() {
        let calls = Rc::new(Cell::new(0));
        let mut run = sleeper(2, Rc::clone(&calls));
        let timing = Timing {
            target: Duration::ZERO,
            min_runs: 5,
            max_runs: 100,
        };
        let m = time_median(&mut run, &InterpreterDevice, &timing).expect("runs");
        assert_eq!(calls.get(), 6, "one warm-up plus five timed runs");
        assert!(m >= Duration::from_millis(2), "{m:?}");
    }

    #[test]
    fn time_median_repeats_until_the_target_then_stops_at_max_runs() {
        let calls = Rc::new(Cell::new(0));
        let mut run = sleeper(1, Rc::clone(&calls));
        let timing = Timing {
            target: Duration::from_millis(40),
            min_runs: 2,
            max_runs: 1000,
        };
        time_median(&mut run, &InterpreterDevice, &timing).expect("runs");
        // 40 ms of 1 ms sleeps: well over 2 runs, and far below 1000.
        assert!(
            calls.get() > 5 && calls.get() < 100,
            "{} calls",
            calls.get()
        );
        let calls = Rc::new(Cell::new(0));
        let mut run = sleeper(1, Rc::clone(&calls));
        let capped = Timing {
            target: Duration::from_secs(60),
            min_runs: 1,
            max_runs: 3,
        };
        time_median(&mut run, &InterpreterDevice, &capped).expect("runs");
        assert_eq!(calls.get(), 4, "warm-up plus max_runs");
    }

    #[test]
    fn time_median_is_the_median_not_the_mean() {
        // Run times 1, 1, 1, 1, 30 ms after the warm-up: the median is about 1 ms; a mean would be
        // about 7 ms.
        let calls = Rc::new(Cell::new(0usize));
        let c = Rc::clone(&calls);
        let mut run: Runner = Box::new(move |_| {
            c.set(c.get() + 1);
            let ms = if c.get() == 6 { 30 } else { 1 };
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        });
        let timing = Timing {
            target: Duration::ZERO,
            min_runs: 5,
            max_runs: 5,
        };
        let m = time_median(&mut run, &InterpreterDevice, &timing).expect("runs");
        assert!(m < Duration::from_millis(15), "{m:?}");
    }

    #[test]
    fn time_median_passes_errors_on() {
        let mut run: Runner = Box::new(|_| Err(Error::Usage("boom".into())));
        let e = time_median(&mut run, &InterpreterDevice, &Timing::QUICK).expect_err("fails");
        assert_eq!(e.to_string(), "boom");
    }

    fn dummy(kernel: &str, bytes: usize) -> BenchCase {
        BenchCase::new(kernel, "n=1", DType::F32, bytes, Box::new(|_| Ok(())))
    }

    #[test]
    fn filter_keeps_substring_matches_and_rejects_an_empty_result() {
        let cases = || {
            vec![
                dummy("dequantize_4bit_nf4", 1),
                dummy("quantize_4bit_nf4", 1),
                BenchCase::new("mm", "M=16,K=64", DType::BF16, 1, Box::new(|_| Ok(()))),
            ]
        };
        // A shape and dtype select one case of a kernel's line.
        let kept = filter_cases(cases(), Some("mm M=16,K=64 bf16")).expect("the line matches");
        assert_eq!(kept.len(), 1);
        assert!(filter_cases(cases(), Some("mm M=16,K=64 f32")).is_err());
        let all = filter_cases(cases(), None).expect("no filter");
        assert_eq!(all.len(), 3);
        let kept = filter_cases(cases(), Some("quantize_4bit_nf4")).expect("both match");
        assert_eq!(kept.len(), 2);
        let kept = filter_cases(cases(), Some("dequantize")).expect("one matches");
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].kernel, "dequantize_4bit_nf4");
        let e = filter_cases(cases(), Some("gemv"))
            .err()
            .expect("none match");
        let msg = e.to_string();
        assert!(
            msg.contains("'gemv'") && msg.contains("quantize_4bit_nf4"),
            "{msg}"
        );
    }

    #[test]
    fn run_bench_makes_one_row_per_baseline_with_ratio_base_over_kernel() {
        let calls = Rc::new(Cell::new(0));
        let quick = |ms| Baseline {
            name: format!("sleep{ms}"),
            run: sleeper(ms, Rc::new(Cell::new(0))),
        };
        let case = BenchCase::new("k", "n=8", DType::F32, 4000, sleeper(5, Rc::clone(&calls)))
            .baseline(quick(1))
            .baseline(quick(12));
        let timing = Timing {
            target: Duration::ZERO,
            min_runs: 3,
            max_runs: 3,
        };
        let mut streamed = 0;
        let rows = run_bench(&InterpreterDevice, vec![case], &timing, &mut |_| {
            streamed += 1
        })
        .expect("runs");
        assert_eq!((rows.len(), streamed, calls.get()), (2, 2, 4));
        assert_eq!(rows[0].baseline, "sleep1");
        assert_eq!(rows[1].baseline, "sleep12");
        for r in &rows {
            assert_eq!(r.ratio, r.baseline_median_s / r.median_s);
            assert_eq!(r.bytes_per_s, 4000.0 / r.median_s);
            assert_eq!((r.kernel.as_str(), r.dtype.as_str()), ("k", "f32"));
        }
        // Sleeping 1 ms is faster than 5 ms, 12 ms slower (sleeps only overshoot, by little).
        assert!(rows[0].ratio < 1.0 && rows[1].ratio > 1.0, "{rows:?}");
    }

    #[test]
    fn declared_flops_give_gflops_and_a_peak_fraction() {
        let timing = Timing {
            target: Duration::ZERO,
            min_runs: 1,
            max_runs: 1,
        };
        let case = |dtype| {
            BenchCase::new("k", "n=8", dtype, 1, sleeper(2, Rc::new(Cell::new(0))))
                .flops(6_000_000)
                .baseline(Baseline {
                    name: "b".into(),
                    run: sleeper(4, Rc::new(Cell::new(0))),
                })
        };
        let rows = run_bench(
            &InterpreterDevice,
            vec![
                case(DType::F32),
                case(DType::BF16),
                dummy("plain", 1).baseline(Baseline {
                    name: "b".into(),
                    run: Box::new(|_| Ok(())),
                }),
            ],
            &timing,
            &mut |_| {},
        )
        .expect("runs");
        let rate = |flops_per_s| peak::Rate {
            isa: peak::PeakIsa::Scalar,
            flops_per_s,
            wall_flops_per_s: flops_per_s,
        };
        let with_bf16 = peak::Peak {
            threads: 1,
            f32: rate(1e9),
            bf16: Some(rate(4e9)),
        };
        let without = peak::Peak {
            bf16: None,
            ..with_bf16
        };
        for (r, bf16_peak) in [(&rows[0], 1e9), (&rows[1], 4e9)] {
            assert_eq!(r.flops, Some(6_000_000));
            let g = r.gflops.expect("declared");
            let b = r.baseline_gflops.expect("declared");
            assert_eq!(g, 6e6 / r.median_s / 1e9);
            assert_eq!(b, 6e6 / r.baseline_median_s / 1e9);
            let p = r.clone().with_peak(&with_bf16);
            assert_eq!(p.peak_fraction, Some(g * 1e9 / bf16_peak), "{}", r.dtype);
            assert_eq!(p.baseline_peak_fraction, Some(b * 1e9 / 1e9));
            // Without a bf16 peak every dtype is against the f32 one.
            let q = r.clone().with_peak(&without);
            assert_eq!(q.peak_fraction, Some(g * 1e9 / 1e9));
        }
        let plain = rows[2].clone().with_peak(&with_bf16);
        assert_eq!(
            (plain.flops, plain.gflops, plain.peak_fraction),
            (None, None, None)
        );
    }

    #[test]
    fn run_bench_names_the_case_of_a_failure() {
        let case = dummy("k", 1).baseline(Baseline {
            name: "broken".into(),
            run: Box::new(|_| Err(Error::Usage("no buffer".into()))),
        });
        let e = run_bench(&InterpreterDevice, vec![case], &Timing::QUICK, &mut |_| {})
            .expect_err("baseline fails");
        assert_eq!(
            e.to_string(),
            "bench k (n=1): baseline broken failed: no buffer"
        );
    }
}
