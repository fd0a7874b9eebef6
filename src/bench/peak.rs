//! The CPU's measured peak arithmetic rate, the denominator of the train suite's `% of peak`:
//! a throughput loop of independent multiply-adds on as many threads as the device uses, for
//! about [`PEAK_DURATION`], never a clock speed times a guessed instruction rate.
//!
//! * f32: [`ACCUMULATORS`] independent accumulators, each updated `acc = acc * a + b` with one
//!   fused multiply-add per step, in the widest vectors the CPU has (AVX-512F 16 lanes, else
//!   AVX2 + FMA 8 lanes, else scalar `f32::mul_add`; runtime detection). One FMA is 2 FLOP per
//!   lane.
//! * bf16: on Linux x86-64 with AMX-BF16, [`ACCUMULATORS`] `tdpbf16ps` per step on 4
//!   independent 16 x 16 f32 tiles (16 pairs of bf16 products per output: 16 384 FLOP per
//!   instruction; `src/probe/amx.rs`); else with `avx512bf16` the loop above of `vdpbf16ps`, which
//!   adds two bf16 products to each of 16 f32 lanes: 2 multiplies + 2 adds = 4 FLOP per lane, 64
//!   FLOP per instruction. The faster of the two is the CPU's bf16 peak (on the development VM
//!   AMX's is about 26 times `vdpbf16ps`').
//!
//! Enough accumulators hide the instruction latency (4-6 cycles on current x86 cores, up to two
//! instructions issued per cycle), so the loop is bound by the FMA units alone: the rate a
//! perfect kernel would reach. The threads start together; the peak is the sum over threads of
//! each thread's operations per second of its own CPU time (Linux: `CLOCK_THREAD_CPUTIME_ID`,
//! elsewhere wall time), so other processes sharing the cores do not lower it; the rate in wall
//! time (operations over the longest thread's wall time) is kept too and shows how much of the
//! CPU the loop got.

use std::sync::Barrier;
use std::time::{Duration, Instant};

/// How long each thread of [`measure_peak`] runs its loop: about 0.2 s.
pub const PEAK_DURATION: Duration = Duration::from_millis(200);

/// Independent accumulators of each loop (12 vectors: enough for 2 issues per cycle at a
/// latency of 6; 14 of the 16 `ymm` registers with the two operands under AVX2).
pub const ACCUMULATORS: u64 = 12;

/// Loop steps per call between two clock reads (about 1 ms with AVX-512).
const CHUNK: u64 = 1 << 16;

/// The instruction set a loop runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakIsa {
    /// 512-bit `vfmadd` (AVX-512F), 16 f32 lanes.
    Avx512,
    /// 256-bit `vfmadd` (AVX2 + FMA), 8 f32 lanes.
    Avx2Fma,
    /// Scalar `f32::mul_add`, 1 lane.
    Scalar,
    /// 512-bit `vdpbf16ps` (AVX512_BF16), 16 f32 lanes of 2 bf16 products each.
    Avx512Bf16,
    /// AMX `tdpbf16ps` on 16 x 16 f32 tiles, 16 bf16 pairs per output.
    AmxBf16,
}

impl PeakIsa {
    /// Name in the bench header.
    pub fn name(self) -> &'static str {
        match self {
            PeakIsa::Avx512 => "avx512f vfmadd",
            PeakIsa::Avx2Fma => "avx2+fma vfmadd",
            PeakIsa::Scalar => "scalar mul_add",
            PeakIsa::Avx512Bf16 => "avx512_bf16 vdpbf16ps",
            PeakIsa::AmxBf16 => "amx_bf16 tdpbf16ps",
        }
    }

    /// FLOP of one instruction: lanes x 2 for an FMA, 16 lanes x 4 for `vdpbf16ps`, 256
    /// outputs x 16 pairs x 4 for `tdpbf16ps`.
    pub fn flops_per_instruction(self) -> u64 {
        match self {
            PeakIsa::Avx512 => 16 * 2,
            PeakIsa::Avx2Fma => 8 * 2,
            PeakIsa::Scalar => 2,
            PeakIsa::Avx512Bf16 => 16 * 4,
            PeakIsa::AmxBf16 => 256 * 16 * 4,
        }
    }

    /// FLOP of `steps` loop steps ([`ACCUMULATORS`] instructions each).
    pub fn flops(self, steps: u64) -> u64 {
        steps * ACCUMULATORS * self.flops_per_instruction()
    }
}

/// The widest f32 FMA this CPU runs.
pub fn f32_isa() -> PeakIsa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return PeakIsa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return PeakIsa::Avx2Fma;
        }
    }
    PeakIsa::Scalar
}

/// The fastest bf16 dot product this CPU runs: AMX `tdpbf16ps` where the CPU and the kernel
/// offer it (Linux x86-64), else `vdpbf16ps`, else none.
pub fn bf16_isa() -> Option<PeakIsa> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if crate::probe::amx_available() {
        return Some(PeakIsa::AmxBf16);
    }
    vdpbf16ps_isa()
}

/// `vdpbf16ps` when this CPU has it.
fn vdpbf16ps_isa() -> Option<PeakIsa> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            return Some(PeakIsa::Avx512Bf16);
        }
    }
    None
}

/// Runs `steps` steps of `isa`'s loop with every operand `1.0` (each f32 FMA step adds 1 to each
/// lane of each accumulator, each `vdpbf16ps` step adds 2) and returns the sum of every lane of
/// every accumulator (exact below 2^24 per lane): what the FLOP accounting is checked against.
/// `None` when this CPU lacks `isa`.
pub fn run_loop(isa: PeakIsa, steps: u64) -> Option<f64> {
    let one = std::hint::black_box(1.0f32);
    match isa {
        PeakIsa::Scalar => Some(scalar_loop(steps, one, one)),
        #[cfg(target_arch = "x86_64")]
        PeakIsa::Avx512 if f32_isa() == PeakIsa::Avx512 => {
            // SAFETY: the CPU has AVX-512F (checked by `f32_isa`).
            Some(unsafe { x86::avx512_loop(steps, one, one) })
        }
        #[cfg(target_arch = "x86_64")]
        PeakIsa::Avx2Fma
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma") =>
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            Some(unsafe { x86::avx2_loop(steps, one, one) })
        }
        #[cfg(target_arch = "x86_64")]
        PeakIsa::Avx512Bf16 if vdpbf16ps_isa().is_some() => {
            // SAFETY: the CPU has AVX-512F and AVX512_BF16 (checked by `vdpbf16ps_isa`).
            Some(unsafe { x86::avx512bf16_loop(steps, one, one) })
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        PeakIsa::AmxBf16 => crate::probe::amx_peak_loop(steps),
        _ => None,
    }
}

/// One measured peak.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// The loop's instructions.
    pub isa: PeakIsa,
    /// FLOP per second of CPU time, summed over the threads: the peak.
    pub flops_per_s: f64,
    /// FLOP over the longest thread's wall time: what the loop got with the machine's other
    /// load (equal to `flops_per_s` on an otherwise idle machine, up to noise).
    pub wall_flops_per_s: f64,
}

/// The CPU's measured peaks on `threads` threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peak {
    /// Threads the loops ran on.
    pub threads: usize,
    /// f32 FMA peak.
    pub f32: Rate,
    /// bf16 dot-product peak ([`bf16_isa`]), when the CPU has one.
    pub bf16: Option<Rate>,
}

impl Peak {
    /// The peak a kernel with `dtype` activations is measured against: the bf16 dot-product
    /// peak for bf16 when the CPU has one, else the f32 FMA peak.
    pub fn for_dtype(&self, dtype: &str) -> Rate {
        match (dtype, self.bf16) {
            ("bf16", Some(r)) => r,
            _ => self.f32,
        }
    }
}

/// Measures the f32 peak (and the bf16 one when the CPU has a bf16 dot product) on `threads` threads
/// (at least 1), each loop running about `duration` per thread.
pub fn measure_peak(threads: usize, duration: Duration) -> Peak {
    let f32 = f32_isa();
    Peak {
        threads: threads.max(1),
        f32: measure(f32, threads, duration),
        bf16: bf16_isa().map(|isa| measure(isa, threads, duration)),
    }
}

/// The rates of `isa`'s loop on `threads` threads started together, each running chunks of
/// [`CHUNK`] steps until `duration` of wall time has passed.
fn measure(isa: PeakIsa, threads: usize, duration: Duration) -> Rate {
    let threads = threads.max(1);
    let start = Barrier::new(threads);
    // Per thread: steps, wall time, CPU time.
    let results: Vec<(u64, Duration, Duration)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let (t, cpu) = (Instant::now(), thread_cpu_time());
                    let mut steps = 0u64;
                    loop {
                        std::hint::black_box(run_loop(isa, CHUNK));
                        steps += CHUNK;
                        if t.elapsed() >= duration {
                            break;
                        }
                    }
                    let wall = t.elapsed();
                    let cpu = match (cpu, thread_cpu_time()) {
                        (Some(a), Some(b)) if b > a => b - a,
                        _ => wall,
                    };
                    (steps, wall, cpu)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or((0, Duration::ZERO, Duration::ZERO)))
            .collect()
    });
    let secs = |d: Duration| d.as_secs_f64().max(1e-9);
    let flops: u64 = results.iter().map(|&(steps, _, _)| isa.flops(steps)).sum();
    let longest = results
        .iter()
        .map(|&(_, t, _)| t)
        .max()
        .unwrap_or(Duration::ZERO);
    Rate {
        isa,
        flops_per_s: results
            .iter()
            .map(|&(steps, _, cpu)| isa.flops(steps) as f64 / secs(cpu))
            .sum(),
        wall_flops_per_s: flops as f64 / secs(longest),
    }
}

/// The calling thread's CPU time (Linux), `None` elsewhere or on failure.
fn thread_cpu_time() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux defines.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc == 0 && ts.tv_sec >= 0 && ts.tv_nsec >= 0 {
            return Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
        }
        None
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The scalar loop: [`ACCUMULATORS`] independent `acc = acc.mul_add(a, b)`.
fn scalar_loop(steps: u64, a: f32, b: f32) -> f64 {
    let mut acc = [0.0f32; ACCUMULATORS as usize];
    for _ in 0..steps {
        for x in &mut acc {
            *x = x.mul_add(a, b);
        }
    }
    acc.iter().map(|&x| f64::from(x)).sum()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Runs `$step` on twelve accumulators `$acc0..$acc11` `steps` times (explicit variables,
    /// so they stay in registers at any optimization level).
    macro_rules! twelve {
        ($steps:expr, $zero:expr, |$a:ident| $step:expr, $reduce:expr) => {{
            let (mut a0, mut a1, mut a2, mut a3) = ($zero, $zero, $zero, $zero);
            let (mut a4, mut a5, mut a6, mut a7) = ($zero, $zero, $zero, $zero);
            let (mut a8, mut a9, mut a10, mut a11) = ($zero, $zero, $zero, $zero);
            for _ in 0..$steps {
                a0 = {
                    let $a = a0;
                    $step
                };
                a1 = {
                    let $a = a1;
                    $step
                };
                a2 = {
                    let $a = a2;
                    $step
                };
                a3 = {
                    let $a = a3;
                    $step
                };
                a4 = {
                    let $a = a4;
                    $step
                };
                a5 = {
                    let $a = a5;
                    $step
                };
                a6 = {
                    let $a = a6;
                    $step
                };
                a7 = {
                    let $a = a7;
                    $step
                };
                a8 = {
                    let $a = a8;
                    $step
                };
                a9 = {
                    let $a = a9;
                    $step
                };
                a10 = {
                    let $a = a10;
                    $step
                };
                a11 = {
                    let $a = a11;
                    $step
                };
            }
            [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]
                .into_iter()
                .map($reduce)
                .sum::<f64>()
        }};
    }

    /// Twelve independent 512-bit FMA chains, `acc = acc * a + b`.
    #[target_feature(enable = "avx512f")]
    pub(super) fn avx512_loop(steps: u64, a: f32, b: f32) -> f64 {
        let (va, vb) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
        twelve!(
            steps,
            _mm512_setzero_ps(),
            |x| _mm512_fmadd_ps(x, va, vb),
            |x| f64::from(_mm512_reduce_add_ps(x))
        )
    }

    /// Twelve independent 256-bit FMA chains, `acc = acc * a + b`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn avx2_loop(steps: u64, a: f32, b: f32) -> f64 {
        let (va, vb) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
        twelve!(
            steps,
            _mm256_setzero_ps(),
            |x| _mm256_fmadd_ps(x, va, vb),
            |x| {
                let mut lanes = [0.0f32; 8];
                // SAFETY: `lanes` holds 8 f32; an unaligned store needs no alignment.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
                lanes.iter().map(|&v| f64::from(v)).sum::<f64>()
            }
        )
    }

    /// Twelve independent `vdpbf16ps` chains, `acc += a0 * b0 + a1 * b1` per f32 lane with every
    /// bf16 pair element `a` (resp. `b`) rounded from f32.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn avx512bf16_loop(steps: u64, a: f32, b: f32) -> f64 {
        let va = _mm512_cvtne2ps_pbh(_mm512_set1_ps(a), _mm512_set1_ps(a));
        let vb = _mm512_cvtne2ps_pbh(_mm512_set1_ps(b), _mm512_set1_ps(b));
        twelve!(
            steps,
            _mm512_setzero_ps(),
            |x| _mm512_dpbf16_ps(x, va, vb),
            |x| f64::from(_mm512_reduce_add_ps(x))
        )
    }
}

/// The CPU model (`model name` in `/proc/cpuinfo`), when the system says.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

/// The vector features of this CPU that matter to the matmul kernels, in the names
/// `/proc/cpuinfo` uses (`avx512_bf16`).
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        for (name, on) in [
            ("sse4.2", has!("sse4.2")),
            ("avx", has!("avx")),
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("f16c", has!("f16c")),
            ("avx512f", has!("avx512f")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512_vnni", has!("avx512vnni")),
            ("avx512_bf16", has!("avx512bf16")),
            ("avx512_fp16", has!("avx512fp16")),
        ] {
            if on {
                out.push(name);
            }
        }
        #[cfg(target_os = "linux")]
        if crate::probe::amx_available() {
            out.push("amx_bf16");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        for (name, on) in [
            ("neon", has!("neon")),
            ("sve", has!("sve")),
            ("bf16", has!("bf16")),
        ] {
            if on {
                out.push(name);
            }
        }
    }
    out
}

/// The header lines of the train suite: CPU model, vector features and the measured peaks.
pub fn header_lines(peak: &Peak) -> Vec<String> {
    let mut lines = vec![
        format!(
            "cpu: {} ({} threads used)",
            cpu_model().unwrap_or_else(|| "unknown model".into()),
            peak.threads
        ),
        format!("vector features: {}", cpu_features().join(" ")),
    ];
    let rate = |r: &Rate| {
        format!(
            "{:.1} GFLOP/s per CPU-second over the threads ({}, {} s per thread; {:.1} GFLOP/s \
             in wall time with this machine's other load)",
            r.flops_per_s / 1e9,
            r.isa.name(),
            PEAK_DURATION.as_secs_f64(),
            r.wall_flops_per_s / 1e9
        )
    };
    lines.push(format!("measured f32 peak: {}", rate(&peak.f32)));
    lines.push(match &peak.bf16 {
        Some(r) => format!("measured bf16 peak: {}", rate(r)),
        None => "measured bf16 peak: none (no amx_bf16 or avx512_bf16: bf16 rows use the f32 peak)"
            .into(),
    });
    lines.push(
        "% peak = kernel GFLOP/s / the peak of its activation dtype (bf16 rows: the bf16 peak \
         when measured); base % peak = baseline GFLOP/s / the f32 peak"
            .into(),
    );
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_does_the_flops_it_counts() {
        // Every operand is 1.0: an FMA step adds 1 to each lane (2 FLOP: a multiply and an
        // add), a vdpbf16ps step adds 1*1 + 1*1 = 2 (4 FLOP), a tdpbf16ps 16 pairs = 32 to
        // each output (64 FLOP). So the lanes' sum is FLOP / 2.
        let steps = 1000;
        let mut isas = vec![PeakIsa::Scalar, f32_isa()];
        isas.extend(vdpbf16ps_isa());
        isas.extend(bf16_isa());
        for isa in isas {
            let sum = run_loop(isa, steps).expect("this CPU has it");
            assert_eq!(sum, isa.flops(steps) as f64 / 2.0, "{isa:?}");
        }
        assert_eq!(PeakIsa::Avx512.flops(1), 12 * 32);
        assert_eq!(PeakIsa::Avx2Fma.flops(1), 12 * 16);
        assert_eq!(PeakIsa::Avx512Bf16.flops_per_instruction(), 64);
        assert_eq!(PeakIsa::AmxBf16.flops_per_instruction(), 16384);
        assert_eq!(PeakIsa::Scalar.flops(10), 240);
    }

    #[test]
    fn a_loop_the_cpu_lacks_is_none_not_a_crash() {
        if vdpbf16ps_isa().is_none() {
            assert_eq!(run_loop(PeakIsa::Avx512Bf16, 10), None);
        }
        if bf16_isa() != Some(PeakIsa::AmxBf16) {
            assert_eq!(run_loop(PeakIsa::AmxBf16, 10), None);
        }
        if f32_isa() != PeakIsa::Avx512 {
            assert_eq!(run_loop(PeakIsa::Avx512, 10), None);
        }
    }

    #[test]
    fn the_peak_is_finite_and_positive() {
        let peak = measure_peak(2, Duration::from_millis(20));
        assert_eq!(peak.threads, 2);
        let mut rates = vec![peak.f32];
        rates.extend(peak.bf16);
        for r in rates {
            for x in [r.flops_per_s, r.wall_flops_per_s] {
                assert!(x.is_finite() && x > 0.0, "{r:?}");
            }
        }
        assert_eq!(peak.for_dtype("f32"), peak.f32);
        assert_eq!(peak.for_dtype("bf16"), peak.bf16.unwrap_or(peak.f32));
        let lines = header_lines(&peak);
        assert!(
            lines[0].starts_with("cpu: ") && lines[2].contains("GFLOP/s"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_cpu_model_and_features_read_without_failing() {
        // Contents depend on the machine: only their shape is checked.
        if let Some(m) = cpu_model() {
            assert!(!m.is_empty() && !m.contains('\n'));
        }
        let f = cpu_features();
        #[cfg(target_arch = "x86_64")]
        assert!(f.contains(&"sse4.2") || f.is_empty(), "{f:?}");
        let _ = f;
    }
}
