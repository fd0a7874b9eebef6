//! `rmsprop_norm_f32` / `adagrad_norm_f32` on the reference interpreter against an
//! independent host model of bitsandbytes' one-state precondition (raw gradient, no weight
//! decay, state before the step) and of the pinned summation order.
#![allow(clippy::needless_range_loop)]

use crate::optim1::{Optim1Algo, Optim1Hyper};
use crate::optim_ext::OptimExtSpec;
use crate::optim_norm::tests::block_sum_sq;
use crate::optim_norm1::{partials_args, NORM1_ALGOS};
use crate::test_util::{bytes, floats, out, run};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

#[test]
fn norm1_partials_match_the_precondition_model() {
    // Plain and `_gs` (the model sees `g * gnorm_scale`, one f32 product).
    let cases = NORM1_ALGOS
        .iter()
        .flat_map(|a| [(*a, None), (*a, Some(0.375f32))]);
    for (algo, gsc) in cases {
        let spec = match gsc {
            None => OptimExtSpec::Norm1(algo),
            Some(_) => OptimExtSpec::Norm1Gs(algo),
        };
        let k = spec.build().unwrap();
        qforge_ir::verify(&k).unwrap();
        let h = Optim1Hyper {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.0,
            eps: 1e-3,
            weight_decay: 0.05, // not part of the norm
        };
        let s = h.scalars(algo, 4).unwrap();
        for n in [1usize, 300, 512] {
            let p: Vec<f32> = (0..n).map(|i| (i as f32 - 100.0) * 0.01).collect();
            let graw: Vec<f32> = (0..n)
                .map(|i| match i % 29 {
                    3 => f32::NAN,
                    7 => f32::NEG_INFINITY,
                    11 => -0.0,
                    _ => ((i * 13) % 41) as f32 * 0.05 - 1.0,
                })
                .collect();
            let st: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.125).collect();
            let nb = n.div_ceil(256);
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(n as u32)),
                OwnedArg::Scalar(Scalar::U32(nb as u32)),
            ];
            args.extend(partials_args(&s).into_iter().map(OwnedArg::Scalar));
            let extra = spec.ext_args(gsc.unwrap_or(1.0), false);
            assert_eq!(extra.len(), usize::from(gsc.is_some()));
            args.extend(extra.into_iter().map(OwnedArg::Scalar));
            args.extend([
                OwnedArg::Read(bytes(DType::F32, &p)),
                OwnedArg::Read(bytes(DType::F32, &graw)),
                OwnedArg::Read(bytes(DType::F32, &st)),
                OwnedArg::Write(vec![0; 4 * nb]),
                OwnedArg::Write(vec![0; 4 * nb]),
            ]);
            run(&k, &mut args);
            let up = floats(DType::F32, out(&args, args.len() - 2));
            let pp = floats(DType::F32, out(&args, args.len() - 1));
            let g: Vec<f32> = graw.iter().map(|x| gsc.map_or(*x, |c| x * c)).collect();
            let (b1, c1, eps) = (0.9f32, (1.0f64 - 0.9) as f32, 1e-3f32);
            let u: Vec<f32> = (0..n)
                .map(|i| {
                    if !g[i].is_finite() {
                        return 0.0;
                    }
                    let sn = match algo {
                        Optim1Algo::Rmsprop => st[i].mul_add(b1, c1 * g[i] * g[i]),
                        _ => g[i].mul_add(g[i], st[i]),
                    };
                    g[i] / (sn.sqrt() + eps)
                })
                .collect();
            for b in 0..nb {
                let r = b * 256..((b + 1) * 256).min(n);
                let what = format!("{} n {n} block {b}", k.name);
                assert_eq!(
                    up[b].to_bits(),
                    block_sum_sq(&u[r.clone()]).to_bits(),
                    "{what} u"
                );
                assert_eq!(pp[b].to_bits(), block_sum_sq(&p[r]).to_bits(), "{what} p");
            }
        }
    }
    // Lion and SGD have no such kernel here.
    for algo in [Optim1Algo::Lion, Optim1Algo::Sgd] {
        let e = OptimExtSpec::Norm1(algo).build().unwrap_err().to_string();
        assert!(e.contains(algo.name()), "{e}");
        let e = OptimExtSpec::Norm1Gs(algo).build().unwrap_err().to_string();
        assert!(e.contains(algo.name()), "{e}");
    }
}
