//! What the CPU's bf16 dot-product instructions compute (the training-speed issue: "establish
//! what this machine's instruction does with an exhaustive-enough probe before relying on it").
//!
//! Both instructions add products of bf16 pairs into f32 accumulators, with denormal inputs read
//! as zero (DAZ), denormal results flushed to zero (FTZ), round to nearest even, MXCSR ignored:
//! * `vdpbf16ps` (AVX512_BF16): lane `j` of 16 adds `a[2j] * b[2j]` and `a[2j+1] * b[2j+1]`.
//!   Intel's pseudo-code (SDM vol. 2, VDPBF16PS) adds the odd pair first, then the even one,
//!   each as an FMA into the lane.
//! * `tdpbf16ps` (AMX-BF16): output `(m, n)` of a 16 x 16 tile adds, for `K` pair rows `k`,
//!   `A[m][2k] * B[k][2n]` and `A[m][2k+1] * B[k][2n+1]`. Intel's pseudo-code accumulates the
//!   even and the odd products in two temporaries before a horizontal add into the tile.
//!
//! A probe runs the instruction on generated inputs ([`super::cases`]) and compares each result,
//! bit for bit (any NaN equals any NaN), with every [`Model`]. On the development Xeon
//! (Sapphire-Rapids class) `vdpbf16ps` agrees with [`Model::OddFirstDazFtz`] and `tdpbf16ps`
//! with [`Model::PairChainsDazFtz`] on every case, and each disagrees with every other model
//! (`docs/semantics.md`, "bf16 dot-product instructions").

use std::fmt;

use super::cases::Cases;

/// A candidate definition of the instructions' arithmetic, per f32 output: pairs are added in
/// order, each pair `[(a_even, b_even), (a_odd, b_odd)]` of bf16 bit patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Intel's `vdpbf16ps` pseudo-code: the odd product, then the even one, each fused into
    /// the sum with one rounding (nearest even), inputs (both factors and the sum) that are
    /// subnormal read as zero of their sign, a subnormal result flushed to zero of its sign.
    OddFirstDazFtz,
    /// As [`Model::OddFirstDazFtz`] with the even product first (the intrinsics guide's
    /// pseudo-code of `tdpbf16ps`, one sum per output).
    EvenFirstDazFtz,
    /// The odd product, then the even one, by IEEE `fma` (subnormals kept).
    OddFirstIeee,
    /// Two chains per output: the even products and the odd products each fused in pair order
    /// into a sum that starts at `+0.0`; then the two sums added, then their total added to the
    /// accumulator (one rounding each); DAZ inputs, FTZ results (the reading of Intel's
    /// `tdpbf16ps` pseudo-code).
    PairChainsDazFtz,
}

impl Model {
    /// Every model, in the order reports list them.
    pub const ALL: [Model; 4] = [
        Model::OddFirstDazFtz,
        Model::EvenFirstDazFtz,
        Model::OddFirstIeee,
        Model::PairChainsDazFtz,
    ];

    /// The model's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Model::OddFirstDazFtz => "odd-first-daz-ftz",
            Model::EvenFirstDazFtz => "even-first-daz-ftz",
            Model::OddFirstIeee => "odd-first-ieee",
            Model::PairChainsDazFtz => "pair-chains-daz-ftz",
        }
    }

    /// The sum `acc` after adding `pairs` in order, as this model defines it.
    pub fn apply(self, acc: f32, pairs: &[[(u16, u16); 2]]) -> f32 {
        let step = |t, pair| flush(fma(t, pair, true));
        match self {
            Model::OddFirstDazFtz => pairs
                .iter()
                .fold(acc, |t, &[even, odd]| step(step(t, odd), even)),
            Model::EvenFirstDazFtz => pairs
                .iter()
                .fold(acc, |t, &[even, odd]| step(step(t, even), odd)),
            Model::OddFirstIeee => pairs
                .iter()
                .fold(acc, |t, &[even, odd]| fma(fma(t, odd, false), even, false)),
            Model::PairChainsDazFtz => {
                let (even, odd) = chains(pairs.iter().copied(), true);
                flush(daz(acc) + flush(even + odd))
            }
        }
    }
}

/// The f32 value of bf16 bits (exact).
fn bf16(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// A subnormal read as zero of its sign.
fn daz(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// A subnormal result flushed to zero of its sign.
fn flush(x: f32) -> f32 {
    daz(x)
}

/// `t + a * b` with one rounding; with `daz`, subnormal inputs read as zero.
fn fma(t: f32, (a, b): (u16, u16), daz_inputs: bool) -> f32 {
    let (x, y) = (bf16(a), bf16(b));
    if daz_inputs {
        daz(x).mul_add(daz(y), daz(t))
    } else {
        x.mul_add(y, t)
    }
}

/// The even and the odd products of `pairs`, each fused in order into a sum that starts at
/// `+0.0`: by IEEE `fma`, or with `daz_ftz` as the instructions do (the two chains of `tdpbf16ps`
/// and of the `amx 32` order).
fn chains(pairs: impl Iterator<Item = [(u16, u16); 2]>, daz_ftz: bool) -> (f32, f32) {
    let step = |t, pair| {
        let r = fma(t, pair, daz_ftz);
        if daz_ftz {
            flush(r)
        } else {
            r
        }
    };
    pairs.fold((0.0, 0.0), |(e, o), [ep, op]| (step(e, ep), step(o, op)))
}

/// Whether the hardware's and a model's results agree: the same bits, or both NaN (NaN
/// payloads are not part of the question).
fn agree(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// One case on which the hardware and a model disagree.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The accumulator before the instruction.
    pub acc: f32,
    /// The pairs added (bf16 bits, `[(a_even, b_even), (a_odd, b_odd)]`).
    pub pairs: Vec<[(u16, u16); 2]>,
    /// What the instruction gave.
    pub hardware: f32,
    /// What the model gives.
    pub model: f32,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "acc {:08x}", self.acc.to_bits())?;
        for [(a0, b0), (a1, b1)] in &self.pairs {
            write!(f, " + {a0:04x}*{b0:04x} + {a1:04x}*{b1:04x}")?;
        }
        write!(
            f,
            ": hardware {:08x} ({:e}), model {:08x} ({:e})",
            self.hardware.to_bits(),
            self.hardware,
            self.model.to_bits(),
            self.model
        )
    }
}

/// How one model fared against the hardware.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFit {
    /// The model.
    pub model: Model,
    /// Results on which the model disagrees with the hardware.
    pub mismatches: u64,
    /// The first of them.
    pub first: Option<Mismatch>,
}

/// A probe's outcome: every model's agreement with one instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The instruction and its form (e.g. `vdpbf16ps zmm` or `tdpbf16ps K=16`).
    pub instruction: String,
    /// f32 results compared.
    pub results: u64,
    /// One entry per [`Model::ALL`].
    pub fits: Vec<ModelFit>,
}

impl Report {
    /// The models that agree with the hardware on every result (one, for a conclusive probe).
    pub fn matching(&self) -> Vec<Model> {
        self.fits
            .iter()
            .filter(|f| f.mismatches == 0)
            .map(|f| f.model)
            .collect()
    }

    /// Compares one hardware result with every model.
    fn record(&mut self, acc: f32, pairs: &[[(u16, u16); 2]], hardware: f32) {
        self.results += 1;
        for fit in &mut self.fits {
            let model = fit.model.apply(acc, pairs);
            if !agree(model, hardware) {
                fit.mismatches += 1;
                fit.first.get_or_insert_with(|| Mismatch {
                    acc,
                    pairs: pairs.to_vec(),
                    hardware,
                    model,
                });
            }
        }
    }

    fn new(instruction: String) -> Report {
        Report {
            instruction,
            results: 0,
            fits: Model::ALL
                .iter()
                .map(|&model| ModelFit {
                    model,
                    mismatches: 0,
                    first: None,
                })
                .collect(),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {} results", self.instruction, self.results)?;
        for fit in &self.fits {
            write!(f, "  {:<20} ", fit.model.name())?;
            match &fit.first {
                None => writeln!(f, "agrees on every result")?,
                Some(m) => {
                    let s = if fit.mismatches == 1 { "" } else { "es" };
                    writeln!(f, "{} mismatch{s}, first: {m}", fit.mismatches)?
                }
            }
        }
        match self.matching()[..] {
            [one] => write!(f, "  verdict: {}", one.name()),
            [] => write!(f, "  verdict: no model agrees"),
            _ => write!(
                f,
                "  verdict: inconclusive, several models agree (run more results)"
            ),
        }
    }
}

/// Why a probe or an AMX product did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// This machine lacks the instruction, or the kernel refuses it: a skip, not a failure.
    Unavailable(String),
    /// The arguments do not fit (a shape, a pair count): the caller's mistake.
    Invalid(String),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Unavailable(why) | ProbeError::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ProbeError {}

/// Runs `vdpbf16ps` (512-bit) on about `results` generated lanes (a multiple of 16) from
/// `seed` and compares every lane with every [`Model`].
///
/// # Errors
/// [`ProbeError::Unavailable`] when the CPU has no AVX512_BF16.
pub fn probe_vdpbf16ps(results: u64, seed: u64) -> Result<Report, ProbeError> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16")
    {
        let mut cases = Cases::new(seed);
        let mut report = Report::new("vdpbf16ps zmm (AVX512_BF16)".into());
        for _ in 0..results.div_ceil(16) {
            let scale = cases.scale();
            let a: [u16; 32] = std::array::from_fn(|_| cases.bf16(scale));
            let b: [u16; 32] = std::array::from_fn(|_| cases.bf16(scale));
            let acc: [f32; 16] = std::array::from_fn(|_| cases.f32(scale));
            // SAFETY: the CPU has AVX-512F and AVX512_BF16 (checked above).
            let out = unsafe { x86::vdpbf16ps(acc, &a, &b) };
            for j in 0..16 {
                let pair = [(a[2 * j], b[2 * j]), (a[2 * j + 1], b[2 * j + 1])];
                report.record(acc[j], &[pair], out[j]);
            }
        }
        return Ok(report);
    }
    let _ = (results, seed);
    Err(ProbeError::Unavailable(
        "the CPU has no AVX512_BF16 (vdpbf16ps)".into(),
    ))
}

/// Runs AMX `tdpbf16ps` on 16 x 16 output tiles of `k_pairs` (1 to 16) pair rows, about
/// `results` outputs in all (a multiple of 256), from `seed`, and compares every output with
/// every [`Model`].
///
/// # Errors
/// [`ProbeError::Invalid`] when `k_pairs` is not 1 to 16; [`ProbeError::Unavailable`] when the
/// CPU or the kernel does not offer AMX (Linux x86-64 only: the process asks for the tile state
/// with `arch_prctl`).
pub fn probe_tdpbf16ps(results: u64, k_pairs: u8, seed: u64) -> Result<Report, ProbeError> {
    if !(1..=16).contains(&k_pairs) {
        return Err(ProbeError::Invalid(format!(
            "tdpbf16ps takes 1 to 16 pair rows, not {k_pairs}"
        )));
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        super::amx_state()?;
        let k = usize::from(k_pairs);
        let mut cases = Cases::new(seed);
        let mut report = Report::new(format!("tdpbf16ps K={k_pairs} (AMX-BF16)"));
        for _ in 0..results.div_ceil(256) {
            let scale = cases.scale();
            let a: [[u16; 32]; 16] =
                std::array::from_fn(|_| std::array::from_fn(|_| cases.bf16(scale)));
            let b: [[u16; 32]; 16] =
                std::array::from_fn(|_| std::array::from_fn(|_| cases.bf16(scale)));
            let acc: [[f32; 16]; 16] =
                std::array::from_fn(|_| std::array::from_fn(|_| cases.f32(scale)));
            // SAFETY: `amx_state` succeeded: the CPU has AMX-TILE and AMX-BF16 and the kernel
            // gave this process the tile state.
            let out = unsafe { super::amx::tdpbf16ps(acc, &a, &b, k_pairs) };
            for m in 0..16 {
                for n in 0..16 {
                    let pairs: Vec<[(u16, u16); 2]> = (0..k)
                        .map(|kk| {
                            [
                                (a[m][2 * kk], b[kk][2 * n]),
                                (a[m][2 * kk + 1], b[kk][2 * n + 1]),
                            ]
                        })
                        .collect();
                    report.record(acc[m][n], &pairs, out[m][n]);
                }
            }
        }
        Ok(report)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (results, seed);
        Err(ProbeError::Unavailable(
            "AMX probes run on Linux x86-64 only".into(),
        ))
    }
}

/// `C = A B^T` (`C: [m, n]`) of bf16 `a: [m, k]` and `b: [n, k]` (bit patterns, row-major) in
/// the `amx 32` order (`docs/semantics.md`), by IEEE arithmetic: per output the elements in
/// chunks of 32; in each chunk the even and the odd elements fused into two sums that start at
/// `+0.0`; the chunk's `even + odd` added to a running sum that starts at `-0.0`. `k` must be a
/// multiple of 32.
pub fn amx32_reference(a: &[u16], b: &[u16], (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    let mut c = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (row, col) = (&a[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]);
            let sum = row
                .chunks(32)
                .zip(col.chunks(32))
                .fold(-0.0f32, |s, (x, y)| {
                    let pairs = x
                        .chunks_exact(2)
                        .zip(y.chunks_exact(2))
                        .map(|(x, y)| [(x[0], y[0]), (x[1], y[1])]);
                    let (even, odd) = chains(pairs, false);
                    s + (even + odd)
                });
            c.push(sum);
        }
    }
    c
}

/// A bf16 `B: [n, k]` in the layout AMX reads it from: panels of 16 columns, each `k / 2` pair
/// rows of 16 pairs `(B[j][2p], B[j][2p + 1])` (64 contiguous bytes), so that a tile of `B` is
/// 1 KiB in one piece.
pub struct Amx32Weight {
    /// Pair `(j, p)` (low half the even element) at `(j / 16) * 8 k + p * 16 + j % 16`.
    pairs: Vec<u32>,
    n: usize,
    k: usize,
}

impl Amx32Weight {
    /// Packs `b` (`[n, k]` bf16 bit patterns, row-major).
    ///
    /// # Errors
    /// [`ProbeError::Invalid`] when `n` or `k` is not a multiple of 32 or `b` is not `n * k`
    /// long.
    pub fn pack(b: &[u16], n: usize, k: usize) -> Result<Amx32Weight, ProbeError> {
        if !n.is_multiple_of(32) || !k.is_multiple_of(32) || b.len() != n * k {
            return Err(ProbeError::Invalid(format!(
                "Amx32Weight takes n and k multiples of 32 and b [n, k]; got n = {n}, k = {k}, \
                 {} elements",
                b.len()
            )));
        }
        let panel = k / 2 * 16;
        let mut pairs = vec![0u32; n * k / 2];
        if panel > 0 {
            // Panel by panel, written in order; its 16 rows of B are read side by side.
            for (rows, out) in b.chunks_exact(16 * k).zip(pairs.chunks_exact_mut(panel)) {
                for (p, dst) in out.chunks_exact_mut(16).enumerate() {
                    for (jj, d) in dst.iter_mut().enumerate() {
                        let at = jj * k + 2 * p;
                        *d = u32::from(rows[at]) | u32::from(rows[at + 1]) << 16;
                    }
                }
            }
        }
        Ok(Amx32Weight { pairs, n, k })
    }
}

/// [`amx32_reference`]'s product `A B^T` (`a: [m, k]` bf16 bits) by AMX `tdpbf16ps` on the
/// machine's threads: 32 x 32 blocks of `C`, one instruction per 16 x 16 tile and 32 elements
/// of `k`, no further cache blocking (a check, and a measure of what an AMX kernel could reach;
/// `benches/amx.rs`).
///
/// # Errors
/// [`ProbeError::Invalid`] when `m` is not a multiple of 32 or `a` is not `m * k` long;
/// [`ProbeError::Unavailable`] when AMX is not offered here (see [`probe_tdpbf16ps`]).
pub fn amx32_gemm(a: &[u16], m: usize, b: &Amx32Weight) -> Result<Vec<f32>, ProbeError> {
    let (n, k) = (b.n, b.k);
    if !m.is_multiple_of(32) || a.len() != m * k {
        return Err(ProbeError::Invalid(format!(
            "amx32_gemm takes m a multiple of 32 and a [m, {k}]; got m = {m}, {} elements",
            a.len()
        )));
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        super::amx_state()?;
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        // SAFETY: the tile state was granted; `a` holds `m * k` elements (checked above) and
        // `b.pairs` `n * k / 2` (`pack`).
        Ok(unsafe { super::amx::gemm(a, &b.pairs, (m, n, k), threads) })
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = n;
        Err(ProbeError::Unavailable(
            "AMX runs on Linux x86-64 only".into(),
        ))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `vdpbf16ps` of `acc` with the 32 bf16 pairs `a`, `b` (bit patterns).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn vdpbf16ps(acc: [f32; 16], a: &[u16; 32], b: &[u16; 32]) -> [f32; 16] {
        let mut out = [0.0f32; 16];
        // SAFETY: each pointer is to 64 bytes (16 f32 or 32 u16); the loads and the store are
        // unaligned forms. The bf16 vectors are the same 512 bits reinterpreted.
        unsafe {
            let va: __m512bh = std::mem::transmute(_mm512_loadu_si512(a.as_ptr().cast()));
            let vb: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.as_ptr().cast()));
            let r = _mm512_dpbf16_ps(_mm512_loadu_ps(acc.as_ptr()), va, vb);
            _mm512_storeu_ps(out.as_mut_ptr(), r);
        }
        out
    }
}
