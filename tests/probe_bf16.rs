//! The bf16 dot-product probe (`qforge probe bf16-dot`, `src/probe/bf16_dot.rs`): its models on
//! hand-made cases where their definitions differ, and this CPU's `vdpbf16ps` and AMX
//! `tdpbf16ps` against the models `docs/semantics.md` documents for Intel's CPUs.

use qforge::probe::bf16_dot::{probe_tdpbf16ps, probe_vdpbf16ps, Model, ProbeError, Report};

/// The bf16 bits of `x` (exact for the powers of two and small integers used here).
fn bf(x: f32) -> u16 {
    let bits = x.to_bits();
    assert_eq!(bits & 0xffff, 0, "{x} is not a bf16 value");
    (bits >> 16) as u16
}

/// Every model's result on `acc` plus `pairs`, in [`Model::ALL`] order, as bits.
fn all(acc: f32, pairs: &[[(u16, u16); 2]]) -> Vec<u32> {
    Model::ALL
        .iter()
        .map(|m| m.apply(acc, pairs).to_bits())
        .collect()
}

#[test]
fn models_differ_where_their_definitions_do() {
    use Model::*;
    assert_eq!(
        Model::ALL,
        [
            OddFirstDazFtz,
            EvenFirstDazFtz,
            OddFirstIeee,
            PairChainsDazFtz
        ]
    );
    let (tiny, neg_tiny) = (bf(2f32.powi(-12)), bf(-(2f32.powi(-12))));
    // 1 + 2^-24 is a tie that rounds to 1; 1 - 2^-24 is exact. Odd first: 1 - 2^-24, then 1.
    // Even first: 1, then 1 - 2^-24. Two chains: 2^-24 + -2^-24 = 0, then 1.
    let pair = [(tiny, tiny), (neg_tiny, tiny)];
    assert_eq!(
        all(1.0, &[pair]),
        [0x3f80_0000, 0x3f7f_ffff, 0x3f80_0000, 0x3f80_0000]
    );
    // Both products 2^-24: one at a time each ties back to 1; the chains' sum 2^-23 does not.
    let pair = [(tiny, tiny), (tiny, tiny)];
    assert_eq!(
        all(1.0, &[pair]),
        [0x3f80_0000, 0x3f80_0000, 0x3f80_0000, 0x3f80_0001]
    );
    // A subnormal bf16 factor (2^-133) times 2^100: read as zero with DAZ, 2^-33 by IEEE.
    let pair = [(0x0001, bf(2f32.powi(100))), (0, 0)];
    assert_eq!(all(0.0, &[pair]), [0, 0, 0x2f00_0000, 0]);
    // A subnormal product 2^-140: flushed with FTZ, kept by IEEE.
    let t = bf(2f32.powi(-70));
    assert_eq!(all(0.0, &[[(t, t), (0, 0)]]), [0, 0, 0x0000_0200, 0]);
    // Products -0 into -0: the chains start at +0 and end at +0, the others keep -0.
    let pair = [(0, bf(-1.0)), (0, bf(-1.0))];
    assert_eq!(
        all(-0.0, &[pair]),
        [0x8000_0000, 0x8000_0000, 0x8000_0000, 0]
    );
    // The chains sum even and odd products apart over all pairs: 1 + (2^-24 + 2^-24) per chain
    // happens once, at the end, after the chains reached 2^-23 each: 1 + 2^-22.
    let pair = [(tiny, tiny), (tiny, tiny)];
    assert_eq!(
        PairChainsDazFtz.apply(1.0, &[pair, pair]).to_bits(),
        0x3f80_0002
    );
    assert_eq!(
        OddFirstDazFtz.apply(1.0, &[pair, pair]).to_bits(),
        0x3f80_0000
    );
}

/// The CPU vendor from `/proc/cpuinfo` (empty when the system does not say).
fn vendor() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("vendor_id"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// Checks that the generated cases tell the models apart (every model but one disagrees with
/// the hardware somewhere), then that the one left is `want` on Intel's CPUs; other vendors'
/// are printed.
fn check(report: &Report, want: Model) {
    println!("{report}");
    let matching = report.matching();
    assert!(
        matching.len() <= 1,
        "the cases do not tell the models apart: {report}"
    );
    if vendor() == "GenuineIntel" {
        assert_eq!(matching, [want], "{report}");
    } else {
        println!(
            "skipped: the documented models are Intel's; this CPU is '{}'",
            vendor()
        );
    }
}

/// The report, or `None` after printing why this machine skips it (`name` unavailable);
/// an invalid request fails the test.
fn ran<T>(name: &str, result: Result<T, ProbeError>) -> Option<T> {
    match result {
        Ok(t) => Some(t),
        Err(ProbeError::Unavailable(why)) => {
            qforge_testkit::unavailable(name, why);
            None
        }
        Err(e @ ProbeError::Invalid(_)) => panic!("{e}"),
    }
}

#[test]
fn vdpbf16ps_is_intels_documented_odd_first_fma() {
    if let Some(report) = ran("avx512_bf16", probe_vdpbf16ps(100_000, 7)) {
        assert_eq!(report.results, 100_000);
        check(&report, Model::OddFirstDazFtz);
    }
}

#[test]
fn tdpbf16ps_sums_even_and_odd_products_in_two_chains() {
    for k_pairs in [1, 5, 16] {
        match ran("amx_bf16", probe_tdpbf16ps(50_000, k_pairs, 11)) {
            Some(report) => check(&report, Model::PairChainsDazFtz),
            None => return,
        }
    }
}

#[test]
fn tdpbf16ps_refuses_a_pair_count_outside_1_to_16() {
    for k_pairs in [0, 17] {
        match probe_tdpbf16ps(256, k_pairs, 1) {
            Err(ProbeError::Invalid(why)) => assert!(why.contains(&format!("not {k_pairs}"))),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_cli_reports_every_instruction_or_why_it_skipped_it() {
    let exe = env!("CARGO_BIN_EXE_qforge");
    let (code, out, err) = qforge_testkit::run(exe, &["probe", "bf16-dot", "--results", "2000"]);
    let inconclusive = out.contains("verdict: inconclusive") || out.contains("verdict: no model");
    assert_eq!(code, i32::from(inconclusive), "{out}{err}");
    assert_eq!(
        out.matches("  verdict: ").count() + out.matches("skipped: ").count(),
        3,
        "{out}"
    );
    let forms = ["vdpbf16ps zmm", "tdpbf16ps K=1 ", "tdpbf16ps K=16 "];
    let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("  ")).collect();
    let reported = lines
        .iter()
        .filter(|l| forms.iter().any(|f| l.starts_with(f)) || l.starts_with("skipped: "))
        .count();
    assert_eq!(reported, 3, "{out}");
    for model in Model::ALL {
        let rows = out
            .lines()
            .filter(|l| l.trim_start().starts_with(model.name()));
        assert_eq!(rows.count(), 3 - out.matches("skipped: ").count(), "{out}");
    }
    let (code, _, err) = qforge_testkit::run(exe, &["probe", "fp8-dot"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("fp8-dot") && err.contains("bf16-dot"), "{err}");
    for bad in ["0", "1000000001", "-5", "x"] {
        let arg = format!("--results={bad}");
        let (code, _, err) = qforge_testkit::run(exe, &["probe", "bf16-dot", &arg]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--results"), "{err}");
    }
    // On Intel's vdpbf16ps, 16 results cannot tell the odd-first models apart: inconclusive,
    // exit code 1 (another vendor's instruction may agree with other models).
    let (code, out, _) = qforge_testkit::run(exe, &["probe", "bf16-dot", "--results", "1"]);
    if out.contains("vdpbf16ps zmm") && vendor() == "GenuineIntel" {
        assert!(out.contains("verdict: inconclusive"), "{out}");
        assert_eq!(code, 1, "{out}");
    }
}

/// bf16 bits drawn with unbiased exponents in `lo..=hi`, a fifth of them zeros of either sign.
fn bf16s(len: usize, (lo, hi): (i32, i32), seed: u64) -> Vec<u16> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let sign = ((s >> 60) & 1) as u16;
            if s.is_multiple_of(5) {
                return sign << 15;
            }
            let e = (lo + ((s >> 8) % (hi - lo + 1) as u64) as i32 + 127) as u16;
            (sign << 15) | (e << 7) | ((s >> 24) as u16 & 0x7f)
        })
        .collect()
}

/// A whole AMX GEMM (several 32-element chunks accumulated in the tile) is the `amx 32` order
/// by IEEE arithmetic bit for bit when no product can be subnormal (`docs/semantics.md`: factor
/// exponents summing to at least -112), and is not where DAZ and FTZ act.
#[test]
fn an_amx_gemm_is_the_amx_32_order_when_no_subnormal_can_arise() {
    use qforge::probe::bf16_dot::{amx32_gemm, amx32_reference, Amx32Weight};
    let (m, n, k) = (64, 96, 320);
    let (mut a, b) = (bf16s(m * k, (-40, 40), 3), bf16s(n * k, (-40, 40), 4));
    // Row 0 of A is -0.0: every chunk's sums start at +0.0, so its outputs are +0.0.
    a[..k].fill(0x8000);
    let packed = Amx32Weight::pack(&b, n, k).expect("fits");
    let Some(hw) = ran("amx_bf16", amx32_gemm(&a, m, &packed)) else {
        return;
    };
    let want = amx32_reference(&a, &b, (m, n, k));
    let differ = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .filter(|(p, q)| p.to_bits() != q.to_bits())
            .count()
    };
    assert_eq!(differ(&hw, &want), 0);
    assert!(
        want[..n].iter().all(|x| x.to_bits() == 0),
        "{:?}",
        &want[..n]
    );
    // Factors near 2^-60: products near 2^-120 and below, where the hardware flushes.
    let (a, b) = (bf16s(m * k, (-66, -56), 5), bf16s(n * k, (-66, -56), 6));
    let packed = Amx32Weight::pack(&b, n, k).expect("fits");
    let hw = amx32_gemm(&a, m, &packed).expect("available above");
    assert!(differ(&hw, &amx32_reference(&a, &b, (m, n, k))) > 0);
    let invalid = |r: Result<(), ProbeError>| assert!(matches!(r, Err(ProbeError::Invalid(_))));
    invalid(Amx32Weight::pack(&b[..40 * k], 40, k).map(drop));
    invalid(Amx32Weight::pack(&b, n, k - 1).map(drop));
    invalid(amx32_gemm(&a[..k * 16], 16, &packed).map(drop));
    invalid(amx32_gemm(&a[..k], m, &packed).map(drop));
}
