//! The WGSL backend's exact software `f32` division, `sqrt` and `fma` (`WgslOptions`), run in
//! WGSL on a wgpu device (Mesa lavapipe in CI) forced to use them, compared bit for bit (all NaNs
//! equal) with the host's IEEE `/`, `sqrt` and `mul_add`: every pair/triple of edge values,
//! millions of random bit patterns, and generators aimed at the hard cases (ties, subnormal
//! results, cancellation, overflow). Without an adapter the device tests print why and pass.
//!
//! `cargo test --features wgpu --test wgsl_soft_math -- --ignored --nocapture` prints the time
//! of the software routines against the builtins on the device.
#![cfg(feature = "wgpu")]

use std::time::Instant;

use qforge::codegen::wgsl::{WgslBackend, WgslOptions};
use qforge::codegen::Backend;
use qforge::ir::{Access, Arg, DType, Dim, Kernel, KernelBuilder, Scalar, ScalarType};
use qforge::runtime::{Device, WgpuDevice};

/// Per work item `i`: `out[3i..3i+3] = [x0 / x1, sqrt(x0), fma(x0, x1, x2)]` of `x[3i..3i+3]`.
fn ops_kernel() -> Kernel {
    let mut b = KernelBuilder::new("soft_ops");
    let n = b.scalar_param("n", ScalarType::U32);
    let shape = [Dim::Param(n), Dim::Const(3)];
    let x = b.buffer_param("x", DType::F32, &shape, Access::Read);
    let out = b.buffer_param("out", DType::F32, &shape, Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let (one, three) = (b.const_u32(1), b.const_u32(3));
    let i0 = b.mul(i, three);
    let i1 = b.add(i0, one);
    let i2 = b.add(i1, one);
    let (av, bv, cv) = (b.load(x, i0), b.load(x, i1), b.load(x, i2));
    let q = b.div(av, bv);
    let s = b.sqrt(av);
    let f = b.fma(av, bv, cv);
    b.store(out, i0, q);
    b.store(out, i1, s);
    b.store(out, i2, f);
    b.finish()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// `kernel` (one row of `width` f32 in, `width` out per work item) on `rows`.
fn run(dev: &dyn Device, kernel: &Kernel, width: usize, rows: &[f32]) -> Vec<f32> {
    let n = rows.len() / width;
    let input = f32_bytes(rows);
    let mut out = vec![0u8; input.len()];
    dev.launch(
        kernel,
        &mut [
            Arg::Scalar(Scalar::U32(n as u32)),
            Arg::Read(&input),
            Arg::Write(&mut out),
        ],
    )
    .unwrap_or_else(|e| panic!("{} runs: {e}", kernel.name));
    bytes_f32(&out)
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The device forced to the software routines, or `None` (with the reason printed).
fn soft_device() -> Option<WgpuDevice> {
    match WgpuDevice::with_soft_math(WgslOptions::SOFTWARE) {
        Ok(d) => {
            assert_eq!(d.soft_math(), WgslOptions::SOFTWARE);
            Some(d)
        }
        Err(e) => {
            qforge_testkit::unavailable("wgpu", e);
            None
        }
    }
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn u32(&mut self) -> u32 {
        (self.next() >> 32) as u32
    }
    fn below(&mut self, n: u32) -> u32 {
        (((self.next() >> 32) * n as u64) >> 32) as u32
    }
    /// Sign from a coin, biased exponent `e` (1..=254, or 0 for a subnormal), random mantissa.
    fn float(&mut self, e: u32) -> f32 {
        f32::from_bits((self.u32() & 0x8000_0000) | (e << 23) | (self.u32() & 0x7f_ffff))
    }
    /// [`Rng::float`] with a biased exponent in `lo..lo + span`.
    fn float_in(&mut self, lo: u32, span: u32) -> f32 {
        let e = lo + self.below(span);
        self.float(e)
    }
}

/// Edge values: zeros, subnormals, the normal boundary, neighbours of 1 and 2, the largest
/// finite, infinities and NaNs, both signs.
fn edges() -> Vec<f32> {
    let pos = [
        0u32,
        1,
        2,
        3,
        0x0040_0000,
        0x0040_0001,
        0x007f_ffff,
        0x0080_0000,
        0x0080_0001,
        0x00ff_ffff,
        0x0d80_0000,
        0x3380_0000,
        0x3f7f_ffff,
        0x3f80_0000,
        0x3f80_0001,
        0x3fc0_0000,
        0x3fff_ffff,
        0x4000_0000,
        0x4040_0000,
        0x4040_0001,
        0x5f80_0000,
        0x7f00_0000,
        0x7f7f_ffff,
        0x7f80_0000,
        0x7fc0_0000,
        0x7f80_0001,
    ];
    pos.iter()
        .flat_map(|&b| [f32::from_bits(b), f32::from_bits(b | 0x8000_0000)])
        .collect()
}

/// Significand pairs `(ma, mb)` (24 bits each) whose exact product is `2^47 + k`, `0 < k < 2^10`:
/// a leading one, 37 zeros, then low bits.
fn sparse_products() -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    let top = 1u64 << 47;
    let mut ma = 11_863_284u64; // ceil(sqrt(2^47))
    while v.len() < 64 && ma < 1 << 24 {
        let mb = top.div_ceil(ma);
        let k = ma * mb - top;
        if k > 0 && k < 1 << 10 && mb < 1 << 24 {
            v.push((ma as u32, mb as u32));
        }
        ma += 1;
    }
    v
}

/// An `fma` row where the product's leading bit is the addend's rounding bit (or a neighbour)
/// and only the product's lowest bits, which leave a 64-bit window aligned to the addend, break
/// the tie: the shifted-out bits must reach the rounding as a sticky bit.
fn sticky_row(r: &mut Rng, pairs: &[(u32, u32)]) -> [f32; 3] {
    let (ma, mb) = pairs[r.below(pairs.len() as u32) as usize];
    let ec = r.below(160) as i32 - 80;
    // The product is about 2^(ea + eb + 1); put it at the addend's half ulp 2^(ec - 24), +-1.
    let ea = r.below(60) as i32 - 30;
    let eb = ec - 25 - ea + r.below(3) as i32 - 1;
    let sign = |r: &mut Rng| if r.below(2) == 0 { 1.0f32 } else { -1.0 };
    let a = sign(r) * ma as f32 * 2f32.powi(ea - 23);
    let b = sign(r) * mb as f32 * 2f32.powi(eb - 23);
    let c = sign(r) * (1.0 + r.below(4) as f32 * f32::EPSILON) * 2f32.powi(ec);
    [a, b, c]
}

/// Rows `(a, b, c)` of one hard-case family chosen by `kind`.
fn hard_row(r: &mut Rng, kind: u32) -> [f32; 3] {
    match kind {
        // Uniform bit patterns.
        0 => [r.u32(), r.u32(), r.u32()].map(f32::from_bits),
        // Ordinary magnitudes; the addend cancels the product to a few ulps.
        1 => {
            let a = r.float_in(117, 20);
            let b = r.float_in(117, 20);
            let p = a * b;
            let k = r.below(9) as i32 - 4;
            let c = -f32::from_bits((p.to_bits() as i32 + k) as u32);
            [a, b, c]
        }
        // Addend within 40 binades of the product, either sign.
        2 => {
            let a = r.float_in(100, 56);
            let b = r.float_in(100, 56);
            let pe = ((a * b).to_bits() >> 23) & 0xff;
            let ce = (pe + r.below(81)).saturating_sub(40).clamp(1, 254);
            [a, b, r.float(ce)]
        }
        // Results near or in the subnormal range (quotients, products, roots of subnormals).
        3 => {
            let a = r.float_in(0, 40);
            let b = r.float_in(100, 54);
            let c = r.float_in(0, 3);
            [a, b, c]
        }
        4 => {
            let a = r.float_in(30, 40);
            let b = r.float_in(30, 40);
            [a, b, r.float_in(0, 2)]
        }
        // Ties: small odd integers times powers of two, so exact results need 25 bits.
        5 => {
            let e = r.below(300) as i32 - 150;
            let a = (r.below(1 << 13) | 1) as f32 * 2f32.powi(e / 2);
            let b = (r.below(1 << 12) | 1) as f32 * 2f32.powi(e - e / 2 - 30);
            let c = if r.below(2) == 0 {
                0.0
            } else {
                f32::from_bits(r.below(8))
            };
            [a, b, c]
        }
        // Division ties in the subnormal range and exact quotients.
        6 => {
            let a = f32::from_bits(r.below(1 << 10) | (r.u32() & 0x8000_0000));
            let b = [2.0f32, 4.0, 8.0, 0.5, 3.0, -2.0][r.below(6) as usize];
            [a, b, 0.0]
        }
        // Overflow: huge products and quotients.
        _ => {
            let a = r.float_in(200, 55);
            let lo = r.below(2) * 130 + 60;
            let b = r.float_in(lo, 60);
            [a, b, r.float_in(200, 55)]
        }
    }
}

fn check_rows(rows: &[f32], got: &[f32]) -> usize {
    let mut bad = 0;
    for (row, g) in rows.chunks_exact(3).zip(got.chunks_exact(3)) {
        let (a, b, c) = (row[0], row[1], row[2]);
        let want = [a / b, a.sqrt(), a.mul_add(b, c)];
        for (k, what) in ["div", "sqrt", "fma"].iter().enumerate() {
            if !same(g[k], want[k]) {
                bad += 1;
                if bad <= 10 {
                    println!(
                        "{what}({:08x}, {:08x}, {:08x}) = {:08x}, want {:08x}",
                        a.to_bits(),
                        b.to_bits(),
                        c.to_bits(),
                        g[k].to_bits(),
                        want[k].to_bits()
                    );
                }
            }
        }
    }
    bad
}

#[test]
fn software_routines_validate_and_replace_the_builtins() {
    let k = ops_kernel();
    let hw = WgslBackend.lower(&k).expect("hardware lowering").wgsl;
    assert!(hw.contains("fma(") && hw.contains("sqrt(") && !hw.contains("qf_div"));
    let sw = WgslBackend
        .lower_with(&k, WgslOptions::SOFTWARE)
        .expect("software lowering validates")
        .wgsl;
    for f in ["qf_div(", "qf_sqrt(", "qf_fma(", "qf_round("] {
        assert!(sw.contains(f), "{f} missing:\n{sw}");
    }
    let main = &sw[sw.find("fn main(").expect("entry point")..];
    assert!(!main.contains(" / ") && !main.contains(" sqrt(") && !main.contains(" fma("));
    // Only what a kernel uses is emitted.
    let only_div = WgslOptions {
        soft_div: true,
        ..WgslOptions::HARDWARE
    };
    let d = WgslBackend.lower_with(&k, only_div).unwrap().wgsl;
    assert!(d.contains("qf_div(") && !d.contains("qf_sqrt") && !d.contains("qf_fma"));
    assert!(d.contains("fma(") && d.contains("sqrt("));
}

#[test]
fn edge_values_match_the_host_bit_for_bit() {
    let Some(dev) = soft_device() else { return };
    let e = edges();
    let mut rows = Vec::new();
    for &a in &e {
        for &b in &e {
            for &c in &e {
                rows.extend([a, b, c]);
            }
        }
    }
    let got = run(&dev, &ops_kernel(), 3, &rows);
    assert_eq!(
        check_rows(&rows, &got),
        0,
        "{} edge triples",
        rows.len() / 3
    );
}

#[test]
fn millions_of_random_and_hard_cases_match_the_host() {
    let Some(dev) = soft_device() else { return };
    let k = ops_kernel();
    let mut r = Rng(0x5e_ed0f_50f7);
    let pairs = sparse_products();
    assert!(pairs.len() >= 16, "only {} sparse products", pairs.len());
    let chunk = 1 << 20;
    let mut bad = 0;
    let mut total = 0;
    for round in 0..8 {
        let mut rows = Vec::with_capacity(3 * chunk);
        for j in 0..chunk {
            // Half uniform bits, a quarter the hard-case families, a quarter sticky cases.
            let row = match j % 4 {
                0 | 2 => hard_row(&mut r, 0),
                1 => {
                    let kind = 1 + r.below(7);
                    hard_row(&mut r, kind)
                }
                _ => sticky_row(&mut r, &pairs),
            };
            rows.extend(row);
        }
        let t = Instant::now();
        let got = run(&dev, &k, 3, &rows);
        println!("round {round}: {chunk} rows in {:?}", t.elapsed());
        bad += check_rows(&rows, &got);
        total += chunk;
    }
    assert_eq!(bad, 0, "{bad} mismatches in {total} rows");
}

/// Per work item `i`: `out[i] = sqrt(x[i])`.
fn sqrt_kernel() -> Kernel {
    let mut b = KernelBuilder::new("soft_sqrt");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let out = b.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let v = b.load(x, i);
    let s = b.sqrt(v);
    b.store(out, i, s);
    b.finish()
}

/// `sqrt` depends on the significand and the exponent's parity only (the rest is an exact
/// power-of-two scale), so every significand with an even and an odd exponent, plus every
/// subnormal, is an exhaustive test of the finite positive inputs.
#[test]
fn sqrt_is_exhaustively_exact_on_significands_and_subnormals() {
    let Some(dev) = soft_device() else { return };
    let k = sqrt_kernel();
    for base in [0x3f80_0000u32, 0x4000_0000, 0] {
        let xs: Vec<f32> = (0..1u32 << 23).map(|m| f32::from_bits(base | m)).collect();
        let got = run(&dev, &k, 1, &xs);
        let bad = xs
            .iter()
            .zip(&got)
            .filter(|(x, g)| !same(**g, x.sqrt()))
            .count();
        assert_eq!(bad, 0, "sqrt mismatches for exponent bits {base:08x}");
    }
}

/// `a = x[2i]`, `y = x[2i + 1]`, then `reps` times `a = a / y` (`div`), `a = sqrt(a)` (`sqrt`),
/// `a = fma(a, y, a)` (`fma`) or `a = a * y + a` with two roundings (`muladd`, what an unfused
/// builtin `fma` costs); `out[2i] = a` (for timing).
fn timing_kernel(op: &str, reps: u32) -> Kernel {
    let mut b = KernelBuilder::new(&format!("time_{op}_{reps}"));
    let n = b.scalar_param("n", ScalarType::U32);
    let shape = [Dim::Param(n), Dim::Const(2)];
    let x = b.buffer_param("x", DType::F32, &shape, Access::Read);
    let out = b.buffer_param("out", DType::F32, &shape, Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let (one, two) = (b.const_u32(1), b.const_u32(2));
    let i0 = b.mul(i, two);
    let i1 = b.add(i0, one);
    let (mut a, y) = (b.load(x, i0), b.load(x, i1));
    for _ in 0..reps {
        a = match op {
            "div" => b.div(a, y),
            "sqrt" => b.sqrt(a),
            "fma" => b.fma(a, y, a),
            _ => {
                let p = b.mul(a, y);
                b.add(p, a)
            }
        };
    }
    b.store(out, i0, a);
    b.store(out, i1, y);
    b.finish()
}

#[test]
#[ignore = "timing report, run by hand with --nocapture"]
fn timing_of_software_routines_against_the_builtins() {
    let (Ok(hw), Some(sw)) = (WgpuDevice::new(), soft_device()) else {
        return;
    };
    println!("device: {} (probe: {:?})", hw.name(), hw.soft_math());
    let n = 1 << 20;
    let reps = 64;
    let mut r = Rng(7);
    let rows: Vec<f32> = (0..2 * n)
        .map(|_| f32::from_bits(0x3f80_0000 | (r.u32() & 0x7f_ffff)))
        .collect();
    let time = |dev: &WgpuDevice, k: &Kernel| {
        run(dev, k, 2, &rows);
        let t = Instant::now();
        for _ in 0..5 {
            run(dev, k, 2, &rows);
        }
        t.elapsed() / 5
    };
    let base = time(&hw, &timing_kernel("none", 0));
    println!("launch + copies of {n} work items: {base:?}");
    let cases = [
        ("div", "builtin", &hw),
        ("div", "software", &sw),
        ("sqrt", "builtin", &hw),
        ("sqrt", "software", &sw),
        ("muladd", "builtin mul + add", &hw),
        ("fma", "software", &sw),
    ];
    for (op, what, dev) in cases {
        let per = time(dev, &timing_kernel(op, reps));
        let ns = per.saturating_sub(base).as_nanos() as f64 / (n as f64 * reps as f64);
        println!("{op:>6} {what:>17}: {per:?} per launch of {n} x {reps}: {ns:.2} ns/op");
    }
}
