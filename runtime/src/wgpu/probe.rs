//! The conformance probe run when a [`super::WgpuDevice`] starts: a small kernel that checks the
//! parts of the numeric contract WGSL does not promise (contraction of `a * b + c`, fused `fma`,
//! correctly rounded division and `sqrt`, subnormal arithmetic) on this driver, against the
//! host's IEEE arithmetic.

use qforge_codegen::wgsl::WgslOptions;
use qforge_ir::{Access, Arg, DType, Dim, Kernel, KernelBuilder, Scalar, ScalarType};

use super::WgpuDevice;
use crate::error::Result;

/// What the probe found on a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conformance {
    /// `fma` rounds once (fused). When false, kernels use the exact software `qf_fma` (for
    /// `fma` and the fused steps of `accumulate`).
    pub fma_fused: bool,
    /// `/` is correctly rounded on the probed hard cases. When false, kernels use the exact
    /// software `qf_div` for f32 division.
    pub div_exact: bool,
    /// `sqrt` is correctly rounded on the probed hard cases. When false, kernels use the exact
    /// software `qf_sqrt`.
    pub sqrt_exact: bool,
    /// A loop runs all its iterations. Mesa's llvmpipe/lavapipe silently stops a loop after
    /// 65535 iterations (and then shortens the loops after it): a kernel whose work item loops
    /// longer than that (e.g. `absmax_mean` over more than about 60000 blocks) gives wrong
    /// results there. Recorded as a deviation; not emulated yet.
    pub loops_exact: bool,
    /// Every deviation found, one line each (empty on a conformant device).
    pub deviations: Vec<String>,
}

impl Conformance {
    /// The software routines a device with this conformance needs.
    pub fn soft_math(&self) -> WgslOptions {
        WgslOptions {
            soft_fma: !self.fma_fused,
            soft_div: !self.div_exact,
            soft_sqrt: !self.sqrt_exact,
        }
    }
}

/// Hard division cases `(a, b)`: quotients near ties, subnormal and huge results, specials.
fn div_cases() -> Vec<(f32, f32)> {
    let mut v = vec![
        (1.0, 3.0),
        (2.0, 3.0),
        (1.0, 10.0),
        (7.0, 49.0),
        (f32::from_bits(0x3f80_0001), f32::from_bits(0x3f7f_ffff)),
        (f32::from_bits(0x3fff_ffff), f32::from_bits(0x3f80_0001)),
        (f32::MIN_POSITIVE, 3.0),
        (f32::from_bits(5), 2.0),
        (f32::from_bits(3), 3.0),
        (1.0, f32::MAX),
        (f32::MAX, 0.5),
        (3.0e38, 1e-5),
        (f32::from_bits(1), 1e-30),
        (0.0, 0.0),
        (1.0, 0.0),
        (-1.0, -0.0),
        (f32::INFINITY, f32::INFINITY),
        (1.0, f32::INFINITY),
        (f32::NAN, 1.0),
    ];
    let mut s = 0x1234_5678u32;
    for _ in 0..45 {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let a = f32::from_bits(0x3f80_0000 | (s >> 9));
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let b = f32::from_bits(0x3f80_0000 | (s >> 9));
        v.push((a, b));
    }
    v
}

/// Hard `sqrt` cases: squares of neighbours of ties, subnormals, specials.
fn sqrt_cases() -> Vec<f32> {
    let mut v = vec![
        2.0,
        3.0,
        0.5,
        f32::from_bits(0x3f80_0001),
        f32::from_bits(0x3f7f_ffff),
        f32::from_bits(0x407f_ffff),
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::MIN_POSITIVE,
        f32::MAX,
        0.0,
        -0.0,
        -1.0,
        f32::INFINITY,
        f32::NAN,
    ];
    let mut s = 0x9abc_def0u32;
    for _ in 0..49 {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        v.push(f32::from_bits((s >> 2) & 0x7fff_ffff));
    }
    v
}

/// Probe kernel: per work item `i`, `out[4i..4i+4] = [a*b + c, fma(a, b, c), a / b, sqrt(a)]`.
fn probe_kernel() -> Kernel {
    let mut b = KernelBuilder::new("qforge_probe");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param(
        "x",
        DType::F32,
        &[Dim::Param(n), Dim::Const(3)],
        Access::Read,
    );
    let out = b.buffer_param(
        "out",
        DType::F32,
        &[Dim::Param(n), Dim::Const(4)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    let (one, three, four) = (b.const_u32(1), b.const_u32(3), b.const_u32(4));
    let i0 = b.mul(i, three);
    let i1 = b.add(i0, one);
    let i2 = b.add(i1, one);
    let (av, bv, cv) = (b.load(x, i0), b.load(x, i1), b.load(x, i2));
    let p = b.mul(av, bv);
    let results = [b.add(p, cv), b.fma(av, bv, cv), b.div(av, bv), b.sqrt(av)];
    let o = b.mul(i, four);
    let mut at = o;
    for r in results {
        b.store(out, at, r);
        at = b.add(at, one);
    }
    b.finish()
}

/// The trip count of the loop probe: past 65535, where capping drivers stop.
const LOOP_PROBE_TRIPS: u32 = 70_000;

/// Loop probe: one work item counts the iterations of a loop over `0..n` into `out[0]`.
fn loop_probe_kernel() -> Kernel {
    let mut b = KernelBuilder::new("qforge_loop_probe");
    let n = b.scalar_param("n", ScalarType::U32);
    let out = b.buffer_param("out", DType::U32, &[Dim::Const(1)], Access::Write);
    let count = b.var("count", ScalarType::U32);
    let (zero, one, end) = (b.const_u32(0), b.const_u32(1), b.param(n));
    b.for_range(zero, end, 1, |b, _| {
        let c = b.read_var(count);
        let c = b.add(c, one);
        b.assign(count, c);
    });
    let c = b.read_var(count);
    b.store(out, zero, c);
    b.finish()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Runs the probe on `dev` (through its normal compile and launch path).
pub(super) fn run(dev: &WgpuDevice) -> Result<Conformance> {
    let kernel = probe_kernel();
    // Rows: (a, b, c). Row 0 separates fused from unfused: (1 + 2^-12)^2 - (1 + 2^-11) is
    // 2^-24 exactly, 0 after rounding the product. Row 1 and 2: subnormal add and multiply.
    let e = 1.0 + f32::EPSILON * 2048.0;
    let mut rows: Vec<[f32; 3]> = vec![
        [e, e, -(1.0 + f32::EPSILON * 4096.0)],
        [f32::from_bits(3), 1.0, f32::from_bits(1)],
        [f32::MIN_POSITIVE, 0.25, 0.0],
    ];
    let divs = div_cases();
    let sqrts = sqrt_cases();
    let base = rows.len();
    for k in 0..divs.len().max(sqrts.len()) {
        let (a, b) = divs.get(k).copied().unwrap_or((1.0, 1.0));
        rows.push([a, b, 0.0]);
        let s = sqrts.get(k).copied().unwrap_or(1.0);
        rows.push([s, 1.0, 0.0]);
    }
    let input: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut output = vec![0u8; rows.len() * 16];
    dev.launch_compiled(
        &kernel,
        &mut [
            Arg::Scalar(Scalar::U32(rows.len() as u32)),
            Arg::Read(&input),
            Arg::Write(&mut output),
        ],
    )?;
    let out: Vec<f32> = output
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let mut count = [0u8; 4];
    dev.launch_compiled(
        &loop_probe_kernel(),
        &mut [
            Arg::Scalar(Scalar::U32(LOOP_PROBE_TRIPS)),
            Arg::Write(&mut count),
        ],
    )?;
    let trips = u32::from_le_bytes(count);
    let mut c = Conformance {
        fma_fused: true,
        div_exact: true,
        sqrt_exact: true,
        loops_exact: trips == LOOP_PROBE_TRIPS,
        deviations: Vec::new(),
    };
    if !c.loops_exact {
        c.deviations.push(format!(
            "a loop of {LOOP_PROBE_TRIPS} iterations ran {trips}: the driver stops loops early, so \
             kernels whose work items loop longer than that are wrong on this device"
        ));
    }
    for (r, [a, b, cc]) in rows.iter().enumerate() {
        let got = &out[4 * r..4 * r + 4];
        let unfused = a * b + cc;
        if !same(got[0], unfused) {
            c.deviations.push(format!(
                "a * b + c contracted or misrounded: {a:e} * {b:e} + {cc:e} gave {:e}, want {unfused:e}",
                got[0]
            ));
        }
        let fused = a.mul_add(*b, *cc);
        if !same(got[1], fused) {
            c.fma_fused = false;
            c.deviations.push(format!(
                "fma not fused: fma({a:e}, {b:e}, {cc:e}) gave {:e}, want {fused:e}",
                got[1]
            ));
        }
        if r >= base && (r - base).is_multiple_of(2) && !same(got[2], a / b) {
            c.div_exact = false;
            c.deviations.push(format!(
                "division not correctly rounded: {a:e} / {b:e} gave {:e}, want {:e}",
                got[2],
                a / b
            ));
        }
        if r >= base && (r - base) % 2 == 1 && !same(got[3], a.sqrt()) {
            c.sqrt_exact = false;
            c.deviations.push(format!(
                "sqrt not correctly rounded: sqrt({a:e}) gave {:e}, want {:e}",
                got[3],
                a.sqrt()
            ));
        }
    }
    Ok(c)
}
