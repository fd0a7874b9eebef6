//! The runtime's 8-bit Adam / AdamW and quantized-AdamW steps on a CPU device (the staged
//! kernels launched over chunks of `STAGE_CHUNK` elements sharing one workspace,
//! `ops::launch_adam8`, `ops::launch_qadam`) against the plain kernels in one launch on the same
//! device, over several steps and across chunk boundaries: every buffer bit for bit. And the
//! launchers' checks of their raw buffers.

use qforge::ir::{Arg, DType, Scalar};
use qforge::kernels::ops::STAGE_CHUNK;
use qforge::kernels::ops::{launch_adam8, launch_qadam, Adam8Buffers, QAdamBuffers, QAdamRng};
use qforge::kernels::{AdamHyper, MomentScheme, OptimAlgo, OptimExtSpec, OptimSpec};
use qforge::kernels::{QAdamScalars, QAdamSpec, StateBits};
use qforge::runtime::{CpuDevice, Device, InterpreterDevice};

/// Parameter, gradient, codes and absmax of one 8-bit step, as bytes.
#[derive(Clone, PartialEq)]
struct Bufs {
    params: Vec<u8>,
    grads: Vec<u8>,
    state: [Vec<u8>; 4],
}

impl Bufs {
    fn new(n: usize, dtype: DType) -> Bufs {
        let nb = n.div_ceil(256);
        let val = |i: usize, s: usize| ((i * 2654435761 + s) % 2001) as f32 * 1e-3 - 1.0;
        let bytes = |v: Vec<f32>| -> Vec<u8> {
            let t = qforge::runtime::HostTensor::from_f32_as(dtype, vec![v.len()], &v);
            t.expect("tensor").data
        };
        Bufs {
            params: bytes((0..n).map(|i| val(i, 1) * 0.02).collect()),
            grads: bytes((0..n).map(grad).collect()),
            state: [vec![0; n], vec![0; 4 * nb], vec![0; n], vec![0; 4 * nb]],
        }
    }

    fn adam8(&mut self) -> Adam8Buffers<'_> {
        let [s1, a1, s2, a2] = &mut self.state;
        Adam8Buffers {
            params: &mut self.params,
            grads: &self.grads,
            state1: s1,
            absmax1: a1,
            state2: s2,
            absmax2: a2,
        }
    }
}

/// A gradient with NaN, inf and zero elements among ordinary ones.
fn grad(i: usize) -> f32 {
    match i % 997 {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => 0.0,
        _ => ((i * 40503 + 7) % 1999) as f32 * 2e-6 - 2e-3,
    }
}

/// The plain kernel (`gs`: its `_gs` variant) in one launch on `dev`.
fn plain(dev: &dyn Device, spec: OptimSpec, scalars: &[Scalar], extra: &[Scalar], b: &mut Bufs) {
    let kernel = if extra.is_empty() {
        spec.build()
    } else {
        OptimExtSpec::Adam(spec).build()
    }
    .expect("builds");
    let n = b.state[0].len();
    let mut args = vec![
        Arg::Scalar(Scalar::U32(n as u32)),
        Arg::Scalar(Scalar::U32(n.div_ceil(256) as u32)),
    ];
    args.extend(scalars.iter().chain(extra).map(|s| Arg::Scalar(*s)));
    let [s1, a1, s2, a2] = &mut b.state;
    args.extend([
        Arg::Write(&mut b.params),
        Arg::Read(&b.grads),
        Arg::Write(s1),
        Arg::Write(a1),
        Arg::Write(s2),
        Arg::Write(a2),
    ]);
    dev.launch(&kernel, &mut args).expect("plain kernel runs");
}

#[test]
fn the_chunked_staged_step_equals_the_plain_kernel() {
    let dev = match CpuDevice::new() {
        Ok(d) => d,
        Err(e) => {
            qforge_testkit::unavailable("cpu", e);
            return;
        }
    };
    // Two chunks and a partial last block.
    let n = STAGE_CHUNK + 2 * 256 + 77;
    for (algo, dtype, gs) in [
        (OptimAlgo::AdamW, DType::F32, false),
        (OptimAlgo::Adam, DType::BF16, true),
    ] {
        let spec = OptimSpec {
            algo,
            state: StateBits::Bits8,
            dtype,
        };
        let hyper = AdamHyper {
            weight_decay: if algo == OptimAlgo::AdamW { 0.01 } else { 0.0 },
            ..AdamHyper::default()
        };
        let extra = if gs {
            OptimExtSpec::Adam(spec).ext_args(0.75, false)
        } else {
            Vec::new()
        };
        let mut staged = Bufs::new(n, dtype);
        let mut reference = staged.clone();
        for t in 1..=3 {
            let scalars = hyper.scalars(&spec, t).expect("scalars").kernel_args(&spec);
            launch_adam8(&dev, spec, &scalars, &extra, staged.adam8()).expect("staged step");
            plain(&dev, spec, &scalars, &extra, &mut reference);
            assert!(
                staged == reference,
                "{algo:?} {dtype} gs={gs}: step {t} differs from the plain kernel"
            );
        }
        // The step changed the state (the comparison is not of two untouched buffers).
        assert!(staged.state[1].iter().any(|b| *b != 0));
    }
}

#[test]
fn launch_adam8_names_the_bad_buffer() {
    let spec = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype: DType::F32,
    };
    let scalars = AdamHyper::default()
        .scalars(&spec, 1)
        .expect("scalars")
        .kernel_args(&spec);
    let dev = InterpreterDevice;
    let mut b = Bufs::new(300, DType::F32);
    b.state[3].pop();
    let e = launch_adam8(&dev, spec, &scalars, &[], b.adam8()).unwrap_err();
    assert!(e.to_string().contains("absmax2 has 7 bytes"), "{e}");
    let mut b = Bufs::new(300, DType::F32);
    b.grads.truncate(4);
    let e = launch_adam8(&dev, spec, &scalars, &[], b.adam8()).unwrap_err();
    assert!(e.to_string().contains("grads has 4 bytes"), "{e}");
    let b32 = OptimSpec {
        state: StateBits::Bits32,
        ..spec
    };
    let mut b = Bufs::new(300, DType::F32);
    let e = launch_adam8(&dev, b32, &scalars, &[], b.adam8()).unwrap_err();
    assert!(e.to_string().contains("8-bit state"), "{e}");
    let mut b = Bufs::new(1, DType::F32);
    b.state = [vec![], vec![], vec![], vec![]];
    b.params.clear();
    b.grads.clear();
    let e = launch_adam8(&dev, spec, &scalars, &[], b.adam8()).unwrap_err();
    assert!(e.to_string().contains("0 codes"), "{e}");
}

impl Bufs {
    /// Quantized-AdamW buffers: the reference's initial state of each scheme.
    fn qadam(n: usize, spec: QAdamSpec) -> Bufs {
        let mut b = Bufs::new(n, spec.dtype);
        let mut state = Vec::new();
        for s in [spec.m1, spec.m2] {
            let (codes, absmax) = s.initial_state(n);
            state.push(codes);
            state.push(absmax.iter().flat_map(|a| a.to_le_bytes()).collect());
        }
        b.state = state.try_into().expect("four buffers");
        b
    }

    fn qadam_bufs(&mut self) -> QAdamBuffers<'_> {
        let [c1, a1, c2, a2] = &mut self.state;
        QAdamBuffers {
            params: &mut self.params,
            grads: &self.grads,
            m1_codes: c1,
            m1_absmax: a1,
            m2_codes: c2,
            m2_absmax: a2,
        }
    }
}

#[test]
fn the_chunked_staged_qadam_step_equals_the_plain_kernel() {
    let dev = match CpuDevice::new() {
        Ok(d) => d,
        Err(e) => {
            qforge_testkit::unavailable("cpu", e);
            return;
        }
    };
    // Two chunks, the second odd and ending in a partial block (which `launch_qadam` allows;
    // `qadamw_step` never has one).
    let n = STAGE_CHUNK + 77;
    let hyper = AdamHyper {
        weight_decay: 0.01,
        ..AdamHyper::default()
    };
    for (m1, m2, dtype) in [
        (MomentScheme::Nf4, MomentScheme::Dyn4Sr, DType::F32),
        (MomentScheme::Nf4Sr, MomentScheme::Dyn4NzEden, DType::BF16),
        (MomentScheme::Linear8, MomentScheme::Fp32, DType::F32),
    ] {
        let spec = QAdamSpec::new(m1, m2, dtype);
        let kernel = spec.build().expect("builds");
        let rng = QAdamRng {
            seed: 0x1234_5678_9abc,
            param_id: 3,
            offset: 1 << 20,
        };
        let mut staged = Bufs::qadam(n, spec);
        let mut reference = staged.clone();
        for t in 1..=3 {
            let sc = QAdamScalars::new(&hyper, t).expect("scalars");
            launch_qadam(&dev, spec, &sc, rng, staged.qadam_bufs()).expect("staged step");
            let mut args: Vec<Arg> = spec
                .sizes(n as u32)
                .args()
                .into_iter()
                .map(Arg::Scalar)
                .collect();
            let s = sc.kernel_args(rng.seed, rng.param_id, rng.offset);
            args.extend(s.into_iter().map(Arg::Scalar));
            let [c1, a1, c2, a2] = &mut reference.state;
            args.extend([
                Arg::Write(&mut reference.params),
                Arg::Read(&reference.grads),
            ]);
            args.push(Arg::Write(c1));
            if m1 != MomentScheme::Fp32 {
                args.push(Arg::Write(a1));
            }
            args.push(Arg::Write(c2));
            if m2 != MomentScheme::Fp32 {
                args.push(Arg::Write(a2));
            }
            dev.launch(&kernel, &mut args).expect("plain kernel runs");
            assert!(
                staged == reference,
                "{}: step {t} differs from the plain kernel",
                spec.name()
            );
        }
        assert!(staged.state[0].iter().any(|b| *b != staged.state[0][0]));
    }
}

#[test]
fn launch_qadam_names_the_bad_buffer() {
    let spec = QAdamSpec::new(MomentScheme::Nf4, MomentScheme::Dyn4Sr, DType::F32);
    let sc = QAdamScalars::new(&AdamHyper::default(), 1).expect("scalars");
    let dev = InterpreterDevice;
    let rng = QAdamRng::default();
    let mut b = Bufs::qadam(256, spec);
    b.state[2].pop();
    let e = launch_qadam(&dev, spec, &sc, rng, b.qadam_bufs()).unwrap_err();
    assert!(e.to_string().contains("m2_codes has 127 bytes"), "{e}");
    let mut b = Bufs::qadam(256, spec);
    let odd = QAdamRng { offset: 3, ..rng };
    let e = launch_qadam(&dev, spec, &sc, odd, b.qadam_bufs()).unwrap_err();
    assert!(e.to_string().contains("offset 3"), "{e}");
    let late = QAdamRng {
        offset: u32::MAX - 1,
        ..rng
    };
    let e = launch_qadam(&dev, spec, &sc, late, b.qadam_bufs()).unwrap_err();
    assert!(e.to_string().contains("within u32"), "{e}");
    let e = launch_qadam(&dev, spec.staged(), &sc, rng, b.qadam_bufs()).unwrap_err();
    assert!(e.to_string().contains("plain Philox"), "{e}");
    let mut b = Bufs::qadam(384, spec);
    b.params.truncate(4 * 300);
    let e = launch_qadam(&dev, spec, &sc, rng, b.qadam_bufs()).unwrap_err();
    assert!(e.to_string().contains("params has 1200 bytes"), "{e}");
}
