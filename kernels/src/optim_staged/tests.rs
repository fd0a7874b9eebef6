//! The staged 8-bit Adam / AdamW kernels on the interpreter against the plain kernels (which
//! `optim_tests.rs` checks against a host model): equal parameters, codes and absmax bit for bit
//! over several steps, whatever the stages held before; the stages hold the moments that were
//! requantized.

use crate::adam::{AdamHyper, OptimAlgo, OptimSpec, StateBits};
use crate::optim_ext::OptimExtSpec;
use crate::optim_staged::host::{launch_adam8, Adam8Buffers};
use crate::optim_staged::OptimStagedSpec;
use crate::test_util::{bytes, floats, nearest, out, run};
use crate::{BlockwiseMap, KernelSpec};
use qforge_ir::OwnedArg;
use qforge_ir::{Arg, DType, Scalar};
use qforge_runtime::{Device, InterpreterDevice};

/// Two full blocks and a partial one, with NaN, inf, zero and subnormal values.
fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match (i * 7 + salt) % 53 {
            0 => f32::NAN,
            1 => f32::NEG_INFINITY,
            2 => 0.0,
            3 => 1e-41,
            _ => ((i * 37 + salt * 11) % 101) as f32 * 0.013 - 0.6,
        })
        .collect()
}

/// The index of the gradient buffer in an optimizer kernel's arguments (after the scalars and
/// the parameter).
fn grad_index(args: &[OwnedArg]) -> usize {
    args.iter()
        .position(|a| !matches!(a, OwnedArg::Scalar(_)))
        .expect("a buffer")
        + 1
}

#[test]
fn staged_kernels_equal_the_plain_kernels_over_steps() {
    let n = 2 * 256 + 77;
    for algo in [OptimAlgo::Adam, OptimAlgo::AdamW] {
        for dtype in [DType::F32, DType::BF16] {
            for grad_opts in [false, true] {
                let spec = OptimSpec {
                    algo,
                    state: StateBits::Bits8,
                    dtype,
                };
                let staged = OptimStagedSpec { spec, grad_opts };
                let plain = if grad_opts {
                    KernelSpec::OptimExt(OptimExtSpec::Adam(spec))
                } else {
                    KernelSpec::Optim(spec)
                };
                let (kp, ks) = (plain.build().unwrap(), staged.build().unwrap());
                qforge_ir::verify(&ks).unwrap();
                let v0 = values(n, 0);
                let mut a = plain.example_args(&v0).unwrap();
                let mut b = KernelSpec::OptimStaged(staged).example_args(&v0).unwrap();
                assert_eq!(b.len(), a.len() + 2, "{}", ks.name);
                let gi = grad_index(&a);
                for t in 0..5 {
                    let g = bytes(dtype, &values(n, t + 1));
                    a[gi] = OwnedArg::Read(g.clone());
                    b[gi] = OwnedArg::Read(g);
                    run(&kp, &mut a);
                    run(&ks, &mut b);
                    for i in gi - 1..a.len() {
                        assert_eq!(out(&a, i), out(&b, i), "{} step {t} buffer {i}", ks.name);
                    }
                    check_stages(&b, gi, dtype, &ks.name);
                }
            }
        }
    }
}

/// The stages hold the updated moments: `+0.0` where the gradient is not finite, and otherwise
/// the values whose nearest codes (at the new absmax) are the stored codes.
fn check_stages(args: &[OwnedArg], gi: usize, dtype: DType, name: &str) {
    let g = floats(dtype, out(args, gi));
    let maps = [
        BlockwiseMap::Dynamic.code(),
        BlockwiseMap::DynamicUnsigned.code(),
    ];
    let k = args.len();
    for (s, code) in maps.iter().enumerate() {
        let codes = out(args, gi + 1 + 2 * s);
        let absmax = floats(DType::F32, out(args, gi + 2 + 2 * s));
        let stage = floats(DType::F32, out(args, k - 2 + s));
        for (i, x) in stage.iter().enumerate() {
            if !g[i].is_finite() {
                assert_eq!(x.to_bits(), 0, "{name} stage {s} [{i}]");
                continue;
            }
            let inv = 1.0 / absmax[i / 256].max(1e-38);
            assert_eq!(nearest(code, x * inv), codes[i], "{name} stage {s} [{i}]");
        }
    }
}

#[test]
fn staged_names_and_32bit_state() {
    let spec = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype: DType::BF16,
    };
    let gs = OptimStagedSpec {
        spec,
        grad_opts: true,
    };
    assert_eq!(gs.name(), "adamw8bit_staged_bf16_gs");
    let k = gs.build().unwrap();
    let names: Vec<&str> = k.params.iter().map(|(_, p)| p.name.as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["m_stage", "v_stage"]);
    let b32 = OptimStagedSpec {
        spec: OptimSpec {
            state: StateBits::Bits32,
            ..spec
        },
        grad_opts: false,
    };
    let err = b32.build().unwrap_err().to_string();
    assert!(
        err.contains("adamw32_staged_bf16") && err.contains("8-bit"),
        "{err}"
    );
}

/// The interpreter with a GPU's capabilities (its name and backend stay the interpreter's:
/// host ops choose by [`Device::caps`] only), so [`launch_adam8`] takes its plain, unstaged
/// path (one launch of `adam{,w}8bit_{dtype}[_gs]`).
struct GpuLike;

impl Device for GpuLike {
    fn name(&self) -> &str {
        "interpreter as a gpu"
    }
    fn backend(&self) -> &'static str {
        "interpreter"
    }
    fn caps(&self) -> qforge_runtime::Caps {
        qforge_runtime::Caps {
            kind: qforge_runtime::DeviceKind::Gpu,
            vector_lanes: 1,
            parallel_threads: qforge_runtime::Caps::GPU_THREADS,
        }
    }
    fn compile(&self, kernel: &qforge_ir::Kernel) -> qforge_runtime::Result<()> {
        InterpreterDevice.compile(kernel)
    }
    fn launch(
        &self,
        kernel: &qforge_ir::Kernel,
        args: &mut [Arg<'_>],
    ) -> qforge_runtime::Result<()> {
        InterpreterDevice.launch(kernel, args)
    }
}

/// Parameter, gradient, codes and absmax of one 8-bit step, as bytes.
#[derive(Clone, Debug, PartialEq)]
struct Bufs {
    params: Vec<u8>,
    grads: Vec<u8>,
    state: [Vec<u8>; 4],
}

impl Bufs {
    fn new(n: usize, dtype: DType) -> Bufs {
        let nb = n.div_ceil(256);
        let p: Vec<f32> = values(n, 1).iter().map(|v| v * 0.02).collect();
        Bufs {
            params: bytes(dtype, &p),
            grads: bytes(dtype, &values(n, 2)),
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

/// `launch_adam8`'s two typed paths, the staged one (CPU devices) and the plain one (GPU
/// devices), give the same bits over several steps; its scalar lists are checked by name.
#[test]
fn launch_adam8_plain_and_staged_paths_agree() {
    let n = 2 * 256 + 77;
    for (algo, dtype, gs) in [
        (OptimAlgo::AdamW, DType::F32, false),
        (OptimAlgo::Adam, DType::BF16, true),
        (OptimAlgo::AdamW, DType::F16, true),
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
        let mut plain = staged.clone();
        for t in 1..=3 {
            let scalars = hyper.scalars(&spec, t).unwrap().kernel_args(&spec);
            launch_adam8(&InterpreterDevice, spec, &scalars, &extra, staged.adam8()).unwrap();
            launch_adam8(&GpuLike, spec, &scalars, &extra, plain.adam8()).unwrap();
            assert!(
                staged == plain,
                "{algo:?} {dtype} gs={gs}: step {t} differs"
            );
        }
        assert!(staged.state[1].iter().any(|b| *b != 0));
        assert!(staged.state[3].iter().any(|b| *b != 0));
    }
    let spec = OptimSpec {
        algo: OptimAlgo::AdamW,
        state: StateBits::Bits8,
        dtype: DType::F32,
    };
    let mut scalars = AdamHyper::default()
        .scalars(&spec, 1)
        .unwrap()
        .kernel_args(&spec);
    let mut b = Bufs::new(n, DType::F32);
    let e = launch_adam8(&GpuLike, spec, &scalars[1..], &[], b.adam8()).unwrap_err();
    assert!(e.to_string().contains("takes the f32 scalars"), "{e}");
    scalars[5] = Scalar::U32(1);
    let e = launch_adam8(&GpuLike, spec, &scalars, &[], b.adam8()).unwrap_err();
    assert!(e.to_string().contains("step_size must be an f32"), "{e}");
}
