//! How `qforge bench` prints its rows: JSON lines ([`json_line`]) or an aligned table
//! ([`Table`]) under a header naming the device ([`header_lines`]).

use super::{BenchCase, BenchRow, Timing};

/// The JSON line of a row: `kernel`, `shape`, `dtype`, `median_s`, `bytes_per_s`, `baseline`,
/// `baseline_median_s`, `ratio`, in that order. Times and bytes/s keep 6 significant digits, the
/// ratio 4 (computed from the unrounded medians). A case that declares its FLOP
/// ([`BenchCase::flops`]) adds `flops`, `gflops` and `baseline_gflops` (4 significant digits),
/// and a row measured against a peak ([`BenchRow::with_peak`]) `peak_fraction` and
/// `baseline_peak_fraction` (fractions, not percent; 4 digits); rows without them have none of
/// these fields.
pub fn json_line(row: &BenchRow) -> String {
    let mut v = serde_json::json!({
        "kernel": row.kernel,
        "shape": row.shape,
        "dtype": row.dtype,
        "median_s": significant(row.median_s, 6),
        "bytes_per_s": significant(row.bytes_per_s, 6),
        "baseline": row.baseline,
        "baseline_median_s": significant(row.baseline_median_s, 6),
        "ratio": significant(row.ratio, 4),
    });
    if let Some(map) = v.as_object_mut() {
        if let Some(f) = row.flops {
            map.insert("flops".into(), f.into());
        }
        for (key, value) in [
            ("gflops", row.gflops),
            ("baseline_gflops", row.baseline_gflops),
            ("peak_fraction", row.peak_fraction),
            ("baseline_peak_fraction", row.baseline_peak_fraction),
        ] {
            if let Some(x) = value {
                map.insert(key.into(), significant(x, 4).into());
            }
        }
    }
    v.to_string()
}

/// `x` rounded to `digits` significant decimal digits (non-finite values unchanged).
pub fn significant(x: f64, digits: usize) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    format!("{:.*e}", digits.max(1) - 1, x).parse().unwrap_or(x)
}

/// The lines above the table: the device, how times are taken, what the baselines and the ratio
/// are, and on a wgpu device the warning that lavapipe (wgpu without a GPU) gives CPU times.
pub fn header_lines(device_name: &str, backend: &str, timing: &Timing) -> Vec<String> {
    let mut lines = vec![
        format!("qforge bench on device '{device_name}' (backend {backend})"),
        format!(
            "median of at least {} runs (about {:.1} s each measurement) after one warm-up run",
            timing.min_runs,
            timing.target.as_secs_f64()
        ),
        "baselines: memcpy = a host memcpy of the bytes the kernel reads + writes (a host copy \
         on every device, for now)"
            .to_string(),
        "ratio = baseline median / kernel median (above 1: the kernel is faster than the baseline)"
            .to_string(),
    ];
    if backend == qforge_codegen::wgsl::BACKEND {
        let lower = device_name.to_lowercase();
        lines.push(if lower.contains("llvmpipe") || lower.contains("lavapipe") {
            "note: this adapter is Mesa's lavapipe, a CPU Vulkan driver (no GPU): these times are \
             CPU times"
                .to_string()
        } else {
            "note: on lavapipe (the wgpu device without a GPU) times are CPU times".to_string()
        });
    }
    lines
}

/// Column widths for the human table, fixed from the case list before anything runs so rows
/// can be printed as they come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    kernel: usize,
    shape: usize,
    dtype: usize,
    baseline: usize,
    /// GFLOP/s columns (some case declares its FLOP).
    gflops: bool,
    /// `% peak` columns ([`Table::with_peak_columns`]).
    peak: bool,
}

const MEDIAN_W: usize = 10;
const RATE_W: usize = 11;
const RATIO_W: usize = 9;
const GFLOPS_W: usize = 8;
const BASE_GFLOPS_W: usize = 12;
const PEAK_W: usize = 7;
const BASE_PEAK_W: usize = 11;

impl Table {
    /// Widths that fit every case and baseline name (and the column titles).
    pub fn for_cases(cases: &[BenchCase]) -> Table {
        let max = |title: &str, f: &dyn Fn(&BenchCase) -> Vec<usize>| {
            cases
                .iter()
                .flat_map(f)
                .chain([title.len()])
                .max()
                .unwrap_or(title.len())
        };
        Table {
            kernel: max("kernel", &|c| vec![c.kernel.len()]),
            shape: max("shape", &|c| vec![c.shape.len()]),
            dtype: max("dtype", &|c| vec![c.dtype.to_string().len()]),
            baseline: max("baseline", &|c| {
                c.baselines.iter().map(|b| b.name.len()).collect()
            }),
            gflops: cases.iter().any(|c| c.flops.is_some()),
            peak: false,
        }
    }

    /// Adds the `% peak` and `base % peak` columns (rows from [`BenchRow::with_peak`]); only
    /// with GFLOP/s columns.
    pub fn with_peak_columns(mut self) -> Table {
        self.peak = self.gflops;
        self
    }

    /// The column titles.
    pub fn title(&self) -> String {
        self.join(
            [
                "kernel", "shape", "dtype", "median", "bytes/s", "baseline", "ratio",
            ],
            ["GFLOP/s", "base GFLOP/s", "% peak", "base % peak"],
        )
    }

    /// One row (`-` where a row lacks a value its column shows).
    pub fn line(&self, row: &BenchRow) -> String {
        let opt = |x: Option<f64>, f: fn(f64) -> String| x.map_or("-".to_string(), f);
        let gflops = |g: f64| format!("{g:.1}");
        let percent = |p: f64| format!("{:.1}%", p * 100.0);
        self.join(
            [
                &row.kernel,
                &row.shape,
                &row.dtype,
                &time(row.median_s),
                &rate(row.bytes_per_s),
                &row.baseline,
                &ratio(row.ratio),
            ],
            [
                &opt(row.gflops, gflops),
                &opt(row.baseline_gflops, gflops),
                &opt(row.peak_fraction, percent),
                &opt(row.baseline_peak_fraction, percent),
            ],
        )
    }

    fn join(&self, c: [&str; 7], extra: [&str; 4]) -> String {
        let mut line = format!(
            "{:kw$}  {:sw$}  {:dw$}  {:>MEDIAN_W$}  {:>RATE_W$}  {:bw$}  {:>RATIO_W$}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            kw = self.kernel,
            sw = self.shape,
            dw = self.dtype,
            bw = self.baseline,
        );
        if self.gflops {
            line.push_str(&format!(
                "  {:>GFLOPS_W$}  {:>BASE_GFLOPS_W$}",
                extra[0], extra[1]
            ));
        }
        if self.peak {
            line.push_str(&format!(
                "  {:>PEAK_W$}  {:>BASE_PEAK_W$}",
                extra[2], extra[3]
            ));
        }
        line.trim_end().to_string()
    }
}

/// Seconds in us, ms or s.
fn time(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// Bytes per second in GB/s, MB/s or kB/s (decimal units).
fn rate(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB/s", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB/s", b / 1e6)
    } else {
        format!("{:.2} kB/s", b / 1e3)
    }
}

/// A ratio with three significant digits and an `x`.
fn ratio(r: f64) -> String {
    if r >= 100.0 {
        format!("{r:.0}x")
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else if r >= 1.0 {
        format!("{r:.2}x")
    } else if r >= 0.01 {
        format!("{r:.3}x")
    } else {
        format!("{r:.2e}x")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Baseline, BenchCase};
    use qforge_ir::DType;

    fn row() -> BenchRow {
        BenchRow {
            kernel: "dequantize_4bit_nf4".into(),
            shape: "n=16777216".into(),
            dtype: "f32".into(),
            bytes: 76_546_048,
            median_s: 0.012_345_678_9,
            bytes_per_s: 76_546_048.0 / 0.012_345_678_9,
            baseline: "memcpy".into(),
            baseline_median_s: 0.024_691_357_8,
            ratio: 0.024_691_357_8 / 0.012_345_678_9,
            flops: None,
            gflops: None,
            baseline_gflops: None,
            peak_fraction: None,
            baseline_peak_fraction: None,
        }
    }

    #[test]
    fn json_has_the_issue_fields_in_order() {
        let line = json_line(&row());
        assert_eq!(
            line,
            "{\"kernel\":\"dequantize_4bit_nf4\",\"shape\":\"n=16777216\",\"dtype\":\"f32\",\
             \"median_s\":0.0123457,\"bytes_per_s\":6200230000.0,\"baseline\":\"memcpy\",\
             \"baseline_median_s\":0.0246914,\"ratio\":2.0}"
        );
    }

    #[test]
    fn json_adds_the_flop_fields_only_when_declared() {
        let mut r = row();
        r.flops = Some(2_000_000_000);
        r.gflops = Some(162.0);
        r.baseline_gflops = Some(81.0);
        let line = json_line(&r);
        let old = json_line(&row());
        // The old fields first, unchanged, then the new ones.
        assert!(line.starts_with(old.trim_end_matches('}')), "{line}");
        assert!(
            line.ends_with(",\"flops\":2000000000,\"gflops\":162.0,\"baseline_gflops\":81.0}"),
            "{line}"
        );
        r.peak_fraction = Some(0.123_456);
        r.baseline_peak_fraction = Some(0.5);
        let line = json_line(&r);
        assert!(
            line.ends_with(",\"peak_fraction\":0.1235,\"baseline_peak_fraction\":0.5}"),
            "{line}"
        );
    }

    #[test]
    fn flop_and_peak_columns_appear_with_flops_and_line_up() {
        let case = BenchCase::new(
            "matmul_4bit_nf4_train",
            "M=16,K=4096,N=4096",
            DType::F32,
            1,
            Box::new(|_| Ok(())),
        )
        .flops(1)
        .baseline(Baseline {
            name: "fp32_gemm".into(),
            run: Box::new(|_| Ok(())),
        });
        let plain = Table::for_cases(&[]);
        assert!(!plain.title().contains("GFLOP/s"));
        let t = Table::for_cases(&[case]);
        assert!(
            t.title().ends_with("GFLOP/s  base GFLOP/s"),
            "{}",
            t.title()
        );
        let t = t.with_peak_columns();
        let title = t.title();
        assert!(title.ends_with("% peak  base % peak"), "{title}");
        let mut r = row();
        r.gflops = Some(97.44);
        r.baseline_gflops = Some(14.1);
        r.peak_fraction = Some(0.844);
        r.baseline_peak_fraction = Some(0.123);
        let line = t.line(&r);
        assert_eq!(line.len(), title.len(), "{title}\n{line}");
        assert!(
            line.ends_with("97.4          14.1    84.4%        12.3%"),
            "{line}"
        );
        // A row without FLOP shows dashes in the same columns.
        let dashes = t.line(&row());
        assert_eq!(dashes.len(), title.len(), "{title}\n{dashes}");
        let tail: Vec<&str> = dashes.split_whitespace().rev().take(4).collect();
        assert_eq!(tail, ["-"; 4], "{dashes}");
    }

    #[test]
    fn significant_digits() {
        assert_eq!(significant(123_456.789, 3), 123_000.0);
        assert_eq!(significant(0.000_123_456, 2), 0.000_12);
        assert_eq!(significant(0.0, 4), 0.0);
        assert!(significant(f64::INFINITY, 4).is_infinite());
    }

    #[test]
    fn table_columns_line_up() {
        let case = BenchCase::new(
            "dequantize_4bit_nf4",
            "n=16777216",
            DType::F32,
            1,
            Box::new(|_| Ok(())),
        )
        .baseline(Baseline {
            name: "fp32_gemm".into(),
            run: Box::new(|_| Ok(())),
        });
        let t = Table::for_cases(&[case]);
        let title = t.title();
        let mut r = row();
        let line = t.line(&r);
        r.kernel = "k".into();
        r.median_s = 2.5;
        r.bytes_per_s = 5e5;
        r.ratio = 0.001;
        let short = t.line(&r);
        // Each column starts at the same offset in the title and both rows.
        for (word, value) in [
            ("shape", "n=16777216"),
            ("dtype", "f32"),
            ("baseline", "memcpy"),
        ] {
            let col = title.find(word).expect("title has the column");
            assert_eq!(line.find(value), Some(col), "{title}\n{line}");
            assert_eq!(short.find(value), Some(col), "{title}\n{short}");
        }
        assert_eq!(line.len(), title.len(), "{title}\n{line}");
        assert_eq!(short.len(), title.len(), "{title}\n{short}");
        assert!(line.contains("12.35 ms") && line.contains("6.20 GB/s") && line.ends_with("2.00x"));
        assert!(
            short.contains("2.500 s")
                && short.contains("500.00 kB/s")
                && short.ends_with("1.00e-3x")
        );
    }

    #[test]
    fn header_names_the_device_and_warns_about_lavapipe() {
        let cpu = header_lines("cpu", "cranelift", &Timing::QUICK);
        assert!(cpu[0].contains("'cpu'"));
        assert!(!cpu.iter().any(|l| l.contains("lavapipe")));
        let lp = header_lines(
            "wgpu (llvmpipe (LLVM 15.0.7, 256 bits), Vulkan)",
            "wgsl",
            &Timing::QUICK,
        );
        assert!(lp
            .last()
            .is_some_and(|l| l.contains("CPU times") && l.contains("this adapter")));
        let gpu = header_lines("wgpu (NVIDIA H200, Vulkan)", "wgsl", &Timing::QUICK);
        assert!(gpu.last().is_some_and(|l| l.contains("on lavapipe")));
    }
}
