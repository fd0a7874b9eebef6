//! The XLA SPMD engine (`docs/distributed.md`): sharded 4-bit linears run as one sharded
//! StableHLO program (Shardy `sdy.manual_computation`, explicit `stablehlo.all_gather`) that
//! XLA's CPU compiler partitions over 2 and 4 host devices, equal bit for bit to the unsharded
//! layer on the Cranelift CPU device; bad launches are named errors; the reference interpreter
//! refuses a program with collectives instead of aborting. Needs the Python of
//! `scripts/install-stablehlo.sh` (jax); skips with the reason elsewhere (`xla` in testkit).

#[cfg(not(feature = "stablehlo"))]
#[test]
fn xla_spmd_needs_the_stablehlo_feature() {
    qforge_testkit::unavailable("xla", "built without the `stablehlo` feature");
}

#[cfg(feature = "stablehlo")]
mod shard_support;

#[cfg(feature = "stablehlo")]
mod xla {
    use super::shard_support::{
        columns_of, layer, minilm_ffn, tensors_of, values, Shape, ROW_SHAPES, SHAPES,
    };

    use qforge::kernels::ops::{matmul_4bit, row_cols, Linear4bit, QuantType};
    use qforge::runtime::xla_spmd::{Combine, RankLaunch, RecordedArg, Replay, XlaSpmd};
    use qforge::runtime::{CpuDevice, Device, HostTensor};
    use qforge_ir::{DType, Scalar};

    /// The engine on `ranks` devices, or `None` (skipped with the reason) without jax.
    fn engine(ranks: usize) -> Option<XlaSpmd> {
        let py = std::env::var_os("QFORGE_STABLEHLO_PYTHON").map_or_else(
            || {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("target/stablehlo-venv/bin/python")
            },
            std::path::PathBuf::from,
        );
        if !py.exists() {
            qforge_testkit::unavailable(
                "xla",
                format!(
                    "no Python at {} (scripts/install-stablehlo.sh)",
                    py.display()
                ),
            );
            return None;
        }
        Some(XlaSpmd::new(ranks).unwrap())
    }

    #[test]
    fn column_parallel_forward_and_row_parallel_dx_on_xla_devices_equal_the_unsharded_layer() {
        let dev = CpuDevice::new().unwrap();
        for ranks in [2, 4] {
            let Some(xla) = engine(ranks) else { return };
            for dtype in [DType::F32, DType::BF16] {
                for shape in SHAPES {
                    if shape.1 == 40 && ranks == 4 {
                        continue; // 4 column shards of K = 40 would split a block (a named error)
                    }
                    let whole = layer(&dev, shape);
                    let shards: Vec<Linear4bit> = (0..ranks)
                        .map(|r| whole.column_shard(r, ranks).unwrap())
                        .collect();
                    let x =
                        HostTensor::from_f32_as(dtype, vec![3, shape.1], &values(3 * shape.1, 2.9))
                            .unwrap();
                    let y = Linear4bit::forward_column_parallel_xla(&shards, &xla, &x).unwrap();
                    assert!(
                        y == whole.forward(&dev, &x).unwrap(),
                        "{shape:?} {dtype}: column-parallel forward on {ranks} XLA devices"
                    );
                }
                for shape in ROW_SHAPES {
                    let whole = layer(&dev, shape);
                    let shards: Vec<Linear4bit> = (0..ranks)
                        .map(|r| whole.row_shard(&dev, r, ranks).unwrap())
                        .collect();
                    let dy =
                        HostTensor::from_f32_as(dtype, vec![3, shape.0], &values(3 * shape.0, 6.1))
                            .unwrap();
                    let dx =
                        Linear4bit::backward_input_row_parallel_xla(&shards, &xla, &dy).unwrap();
                    assert!(
                        dx == whole.backward_input(&dev, &dy).unwrap(),
                        "{shape:?} {dtype}: row-parallel dX on {ranks} XLA devices"
                    );
                }
            }
        }
    }

    #[test]
    fn relaxed_row_parallel_forward_sums_partials_in_rank_order() {
        let dev = CpuDevice::new().unwrap();
        for ranks in [2, 4] {
            let Some(xla) = engine(ranks) else { return };
            check_relaxed(&dev, &xla);
        }
    }

    fn check_relaxed(dev: &dyn Device, xla: &XlaSpmd) {
        let ranks = xla.ranks();
        let shape = ROW_SHAPES[0];
        let whole = layer(dev, shape);
        let x = HostTensor::from_f32(vec![3, shape.1], &values(3 * shape.1, 2.9)).unwrap();
        let cols = row_cols(&whole.state, ranks).unwrap();
        let shards: Vec<Linear4bit> = (0..ranks)
            .map(|r| whole.row_shard(dev, r, ranks).unwrap())
            .collect();
        let x_r: Vec<HostTensor> = cols.iter().map(|c| columns_of(&x, c.clone())).collect();
        let y = Linear4bit::forward_row_parallel_relaxed_xla(&shards, xla, &x_r).unwrap();
        // The definition: each rank's partial on the CPU device, summed in rank order, then the bias.
        let parts: Vec<Vec<f32>> = shards
            .iter()
            .zip(&x_r)
            .map(|(s, x)| {
                let p = matmul_4bit(dev, x, &s.packed, &s.state, None, None).unwrap();
                p.to_f32().unwrap()
            })
            .collect();
        let bias = whole.bias.as_ref().unwrap().to_f32().unwrap();
        let expected: Vec<f32> = (0..parts[0].len())
            .map(|i| parts[1..].iter().fold(parts[0][i], |s, p| s + p[i]) + bias[i % shape.0])
            .collect();
        let got = y.to_f32().unwrap();
        assert_eq!(y.shape, vec![3, shape.0]);
        assert!(
            got.iter()
                .zip(&expected)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "relaxed row-parallel forward on {ranks} XLA devices: {got:?} against {expected:?}"
        );
    }

    /// `(ranks, shape, dtype)` of the exact chained sums: 2 and 4 ranks, f32 and bf16, nested and
    /// plain absmax (a column-parallel dX needs shards of a multiple of 8 rows).
    #[test]
    fn exact_row_parallel_forward_and_column_parallel_dx_continue_the_chains_across_xla_devices() {
        let dev = CpuDevice::new().unwrap();
        let dx_shapes: [Shape; 3] = [
            (16, 4096, QuantType::Nf4, 64, true),
            (32, 256, QuantType::Fp4, 64, false),
            (32, 4096, QuantType::Nf4, 64, true),
        ];
        let cases = [
            (2, ROW_SHAPES[0], dx_shapes[0], DType::F32),
            (2, ROW_SHAPES[2], dx_shapes[1], DType::BF16),
            (4, ROW_SHAPES[1], dx_shapes[1], DType::F32),
            (4, ROW_SHAPES[0], dx_shapes[2], DType::BF16),
        ];
        for (ranks, row_shape, dx_shape, dtype) in cases {
            let Some(xla) = engine(ranks) else { return };
            let whole = layer(&dev, row_shape);
            let x =
                HostTensor::from_f32_as(dtype, vec![3, row_shape.1], &values(3 * row_shape.1, 2.9))
                    .unwrap();
            let cols = row_cols(&whole.state, ranks).unwrap();
            let shards: Vec<Linear4bit> = (0..ranks)
                .map(|r| whole.row_shard(&dev, r, ranks).unwrap())
                .collect();
            let x_r: Vec<HostTensor> = cols.iter().map(|c| columns_of(&x, c.clone())).collect();
            let y = Linear4bit::forward_row_parallel_xla(&shards, &xla, &x_r).unwrap();
            assert!(
                y == whole.forward(&dev, &x).unwrap(),
                "{row_shape:?} {dtype}: exact row-parallel forward on {ranks} XLA devices"
            );
            let whole = layer(&dev, dx_shape);
            let n = dx_shape.0;
            let dy = HostTensor::from_f32_as(dtype, vec![3, n], &values(3 * n, 6.1)).unwrap();
            let shards: Vec<Linear4bit> = (0..ranks)
                .map(|r| whole.column_shard(r, ranks).unwrap())
                .collect();
            let rows = n / ranks;
            let dy_r: Vec<HostTensor> = (0..ranks)
                .map(|r| columns_of(&dy, r * rows..(r + 1) * rows))
                .collect();
            let dx =
                Linear4bit::backward_input_column_parallel_xla(&dev, &shards, &xla, &dy_r).unwrap();
            assert!(
                dx == whole.backward_input(&dev, &dy).unwrap(),
                "{dx_shape:?} {dtype}: exact column-parallel dX on {ranks} XLA devices"
            );
        }
    }

    /// `y = a * b + c` with two roundings (a multiply, then an add): XLA's CPU compiler would
    /// contract them into one FMA where the CPU has one; the engine prevents it.
    const MUL_ADD: &str =
        "kernel mul_add(a: f32[n] read, b: f32[n] read, c: f32[n] read, y: f32[n] write, n: u32)
grid n
{
  %0: u32 = work_item
  %1: f32 = load a[%0]
  %2: f32 = load b[%0]
  %3: f32 = load c[%0]
  %4: f32 = mul %1, %2
  %5: f32 = add %4, %3
  store y[%0] = %5
}";

    #[test]
    fn a_multiply_and_an_add_are_not_contracted() {
        let Some(xla) = engine(2) else { return };
        let kernel = qforge_ir::text::parse(MUL_ADD).unwrap();
        // (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 exactly: 0 with two roundings, 2^-24 with an FMA.
        let a = (1.0f32 + 2f32.powi(-12)).to_bits();
        let c = (-(1.0f32 + 2f32.powi(-11))).to_bits();
        let buf =
            |v: u32| RecordedArg::Buffer([v, v].iter().flat_map(|x| x.to_le_bytes()).collect());
        let launch = |a: u32, c: u32| RankLaunch {
            kernel: kernel.clone(),
            args: vec![
                buf(a),
                buf(a),
                buf(c),
                buf(7),
                RecordedArg::Scalar(Scalar::U32(2)),
            ],
        };
        // Rank 1 computes 2 * 2 + 1 = 5: the local results come back in rank order.
        let (two, one) = (2.0f32.to_bits(), 1.0f32.to_bits());
        let out = xla
            .run(&[launch(a, c), launch(two, one)], &[Combine::Local])
            .unwrap()
            .remove(0);
        let five: Vec<u8> = [5.0f32, 5.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(&out[8..], &five[..], "rank 1's results follow rank 0's");
        assert_eq!(&out[..8], &[0u8; 8], "a * b + c was contracted into an FMA");
    }

    #[test]
    fn one_rank_runs_the_kernel_alone() {
        let dev = CpuDevice::new().unwrap();
        let Some(xla) = engine(1) else { return };
        let whole = layer(&dev, ROW_SHAPES[1]);
        let x = HostTensor::from_f32(vec![3, 256], &values(3 * 256, 2.9)).unwrap();
        let y = Linear4bit::forward_column_parallel_xla(std::slice::from_ref(&whole), &xla, &x)
            .unwrap();
        assert!(
            y == whole.forward(&dev, &x).unwrap(),
            "column-parallel forward on 1 XLA device"
        );
        let shard = whole.row_shard(&dev, 0, 1).unwrap();
        let y = Linear4bit::forward_row_parallel_xla(
            std::slice::from_ref(&shard),
            &xla,
            std::slice::from_ref(&x),
        )
        .unwrap();
        assert!(
            y == whole.forward(&dev, &x).unwrap(),
            "exact row-parallel forward on 1 XLA device"
        );
    }

    #[test]
    fn launches_that_are_not_one_program_are_named_errors() {
        let dev = CpuDevice::new().unwrap();
        let Some(xla) = engine(2) else { return };
        let whole = layer(&dev, SHAPES[2]);
        let shard = whole.column_shard(0, 2).unwrap();
        let x = HostTensor::from_f32(vec![3, 96], &values(3 * 96, 2.9)).unwrap();
        // Shards of another count than the engine's ranks.
        let err = Linear4bit::forward_column_parallel_xla(std::slice::from_ref(&shard), &xla, &x)
            .unwrap_err();
        assert!(err.to_string().contains("1 shards on 2 ranks"), "{err}");
        // Shards of different shapes: one program cannot run both.
        let other = whole.column_shard(0, 4).unwrap();
        let err = Linear4bit::forward_column_parallel_xla(&[shard, other], &xla, &x).unwrap_err();
        // (Shards of other shapes may get other tiles, so another kernel: either error names it.)
        let e = err.to_string();
        assert!(
            e.contains("SPMD needs equal shapes") || e.contains("must run one program"),
            "{e}"
        );
        // The double-quant offset of a nested absmax, changed on rank 1.
        let capture = qforge::runtime::xla_spmd::Capture::new();
        let nested = layer(&dev, SHAPES[0]);
        let a = HostTensor::from_f32(vec![1, 4096], &values(4096, 0.5)).unwrap();
        nested.forward(&capture, &a).unwrap();
        let launch = capture.take().remove(0);
        let mut changed = launch.clone();
        let offset = changed
            .args
            .iter_mut()
            .find_map(|a| match a {
                RecordedArg::Scalar(Scalar::F32(bits)) => Some(bits),
                _ => None,
            })
            .unwrap();
        *offset ^= 1;
        // Ranks of which some have rows and some none.
        let row_layer = layer(&dev, ROW_SHAPES[1]);
        let shards: Vec<Linear4bit> = (0..2)
            .map(|r| row_layer.row_shard(&dev, r, 2).unwrap())
            .collect();
        let rows = |m| HostTensor::from_f32(vec![m, 128], &values(m * 128, 0.1)).unwrap();
        let err = Linear4bit::forward_row_parallel_relaxed_xla(&shards, &xla, &[rows(3), rows(0)])
            .unwrap_err();
        assert!(err.to_string().contains("made [1, 0] launches"), "{err}");
        // The relaxed forward sums f32 partials only.
        let bf16 = |t: HostTensor| {
            HostTensor::from_f32_as(DType::BF16, t.shape.clone(), &t.to_f32().unwrap()).unwrap()
        };
        let err = Linear4bit::forward_row_parallel_relaxed_xla(
            &shards,
            &xla,
            &[bf16(rows(3)), bf16(rows(3))],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("sums f32 partial outputs"),
            "{err}"
        );
        // A scalar that differs between ranks reaches each rank with its own value.
        let mine: Vec<Vec<u8>> = [&launch, &changed]
            .iter()
            .map(|l| l.run_on(&dev).unwrap().remove(0))
            .collect();
        assert!(mine[0] != mine[1], "the changed offset changes the output");
        // A replay gives the launch its results, and refuses one with other arguments (host
        // code reading what an earlier launch wrote) or launches left unmade.
        let replay = |l: &RankLaunch| Replay::new(0, vec![l.clone()], vec![vec![mine[0].clone()]]);
        let r = replay(&launch);
        let y = nested.forward(&r, &a).unwrap();
        assert!(y.data == mine[0], "the replayed result");
        r.finish().unwrap();
        let other = HostTensor::from_f32(vec![1, 4096], &values(4096, 0.75)).unwrap();
        let err = nested.forward(&replay(&launch), &other).unwrap_err();
        assert!(err.to_string().contains("gets other arguments"), "{err}");
        let err = replay(&launch).finish().unwrap_err();
        assert!(err.to_string().contains("1 recorded launches"), "{err}");
        let got = xla.run(&[launch, changed], &[Combine::Local]).unwrap();
        assert!(got[0] == mine.concat(), "a scalar with a value per rank");
    }

    #[test]
    fn the_reference_interpreter_refuses_collectives_with_an_error() {
        let Some(_) = engine(1) else { return };
        let dev = qforge::runtime::StableHloDevice::new().unwrap();
        let module = "module @m {\n  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n    \
                  %g = \"stablehlo.all_gather\"(%a) <{all_gather_dim = 0 : i64, replica_groups = dense<[[0]]> : tensor<1x1xi64>}> : (tensor<2xf32>) -> tensor<2xf32>\n    \
                  return %g : tensor<2xf32>\n  }\n}\n";
        let err = dev.run_module("all_gather", module).unwrap_err();
        assert!(err.to_string().contains("cannot run collectives"), "{err}");
    }

    /// MiniLM's layer-0 feed-forward block (NF4) tensor-parallel on 2 XLA devices:
    /// `intermediate.dense` column-parallel (its output gathered on XLA equals the unsharded one),
    /// GELU on each rank's columns (CPU device), `output.dense` row-parallel through the exact
    /// chained forward, and back through the exact column-parallel dX: the unsharded block's
    /// output and input gradient, bit for bit.
    #[test]
    fn minilm_ffn_tensor_parallel_on_xla_devices_is_the_unsharded_block() {
        use qforge::kernels::activation::Act;
        use qforge::kernels::ops::{act_beta, act_beta_backward};
        let dev = CpuDevice::new().unwrap();
        let Some((up, down, x)) = minilm_ffn(&dev) else {
            qforge_testkit::unavailable("models", "../shared/models/all-MiniLM-L6-v2 is missing");
            return;
        };
        let ranks = 2;
        let Some(xla) = engine(ranks) else { return };
        // The unsharded block, forward and backward, on the CPU device.
        let pre = up.forward(&dev, &x).unwrap();
        let h = act_beta(&dev, Act::Gelu, &pre, 1.0).unwrap();
        let y = down.forward(&dev, &h).unwrap();
        let n = down.out_features();
        let dy = HostTensor::from_f32(vec![8, n], &values(8 * n, 8.8)).unwrap();
        let dh = down.backward_input(&dev, &dy).unwrap();
        let dx = up
            .backward_input(
                &dev,
                &act_beta_backward(&dev, Act::Gelu, &pre, &dh, 1.0).unwrap(),
            )
            .unwrap();
        // Tensor-parallel.
        let ups: Vec<Linear4bit> = (0..ranks)
            .map(|r| up.column_shard(r, ranks).unwrap())
            .collect();
        let downs: Vec<Linear4bit> = (0..ranks)
            .map(|r| down.row_shard(&dev, r, ranks).unwrap())
            .collect();
        assert!(
            Linear4bit::forward_column_parallel_xla(&ups, &xla, &x).unwrap() == pre,
            "MiniLM FFN up projection, column-parallel on XLA"
        );
        let cols = row_cols(&down.state, ranks).unwrap();
        let pre_r: Vec<HostTensor> = cols.iter().map(|c| columns_of(&pre, c.clone())).collect();
        let h_r: Vec<HostTensor> = pre_r
            .iter()
            .map(|p| act_beta(&dev, Act::Gelu, p, 1.0).unwrap())
            .collect();
        let y_tp = Linear4bit::forward_row_parallel_xla(&downs, &xla, &h_r).unwrap();
        assert!(y_tp == y, "MiniLM FFN output, tensor-parallel on XLA");
        let dpre_r: Vec<HostTensor> = pre_r
            .iter()
            .zip(&cols)
            .map(|(p, c)| {
                let dh_r = columns_of(&dh, c.clone());
                act_beta_backward(&dev, Act::Gelu, p, &dh_r, 1.0).unwrap()
            })
            .collect();
        let dx_tp =
            Linear4bit::backward_input_column_parallel_xla(&dev, &ups, &xla, &dpre_r).unwrap();
        assert!(dx_tp == dx, "MiniLM FFN dX, tensor-parallel on XLA");
    }

    /// The adapter merge into column-parallel shards on 2 and 4 XLA devices: every rank's
    /// merged rows equal `merge_sharded` over the same shards, bit for bit.
    #[test]
    fn adapter_merge_into_column_parallel_shards_on_xla_devices() {
        use qforge::kernels::adapter::BottleneckAdapter;
        let dev = CpuDevice::new().unwrap();
        for ranks in [2, 4] {
            let Some(xla) = engine(ranks) else { return };
            let (rows, k) = (5, 24);
            let d = rows * ranks;
            let mut a = BottleneckAdapter::new(d, 4, 7).unwrap();
            a.up_weight = HostTensor::from_f32(vec![d, 4], &values(d * 4, 0.9)).unwrap();
            a.up_bias = HostTensor::from_f32(vec![d], &values(d, 1.1)).unwrap();
            let (w, b) = (values(d * k, 3.3), values(d, 4.4));
            let shards: Vec<(HostTensor, HostTensor)> = (0..ranks)
                .map(|r| {
                    let span = r * rows..(r + 1) * rows;
                    (
                        HostTensor::from_f32(vec![rows, k], &w[span.start * k..span.end * k])
                            .unwrap(),
                        HostTensor::from_f32(vec![rows], &b[span]).unwrap(),
                    )
                })
                .collect();
            // The exact merge: the unsharded merge's rows, bit for bit.
            let whole = a
                .merge_into(
                    &dev,
                    &HostTensor::from_f32(vec![d, k], &w).unwrap(),
                    &HostTensor::from_f32(vec![d], &b).unwrap(),
                )
                .unwrap();
            let exact = a.merge_column_parallel_xla(&dev, &xla, &shards).unwrap();
            for (r, (mw, mb)) in exact.iter().enumerate() {
                let span = r * rows..(r + 1) * rows;
                assert!(
                    mw.data == whole.0.data[span.start * k * 4..span.end * k * 4]
                        && mb.data == whole.1.data[span.start * 4..span.end * 4],
                    "exact adapter merge on {ranks} XLA devices, rank {r}"
                );
            }
            // Each device computes K / D columns of D W: 5 ranks do not divide K = 24.
            let a5 = BottleneckAdapter::new(5, 4, 7).unwrap();
            let one_row: Vec<(HostTensor, HostTensor)> = (0..5)
                .map(|r| {
                    (
                        HostTensor::from_f32(vec![1, k], &w[r * k..(r + 1) * k]).unwrap(),
                        HostTensor::from_f32(vec![1], &b[r..r + 1]).unwrap(),
                    )
                })
                .collect();
            let err = a5
                .merge_column_parallel_xla(&dev, &XlaSpmd::new(5).unwrap(), &one_row)
                .unwrap_err();
            assert!(err.to_string().contains("do not divide K = 24"), "{err}");
            let got = a
                .merge_column_parallel_relaxed_xla(&dev, &xla, &shards)
                .unwrap();
            // Shards of unequal rows cannot be one program.
            let mut uneven = shards.clone();
            uneven[0] = (
                HostTensor::from_f32(vec![rows - 1, k], &w[..(rows - 1) * k]).unwrap(),
                HostTensor::from_f32(vec![rows - 1], &b[..rows - 1]).unwrap(),
            );
            let err = a
                .merge_column_parallel_relaxed_xla(&dev, &xla, &uneven)
                .unwrap_err();
            assert!(err.to_string().contains("same rows and K"), "{err}");
            assert!(
                got == a.merge_sharded(&dev, &shards).unwrap(),
                "adapter merge on {ranks} XLA devices"
            );
        }
    }

    /// Optimizer parameters: 6144 elements (24 blocks; 8-bit state although a shard of 2 or 4
    /// ranks is under `min_8bit_size` = 4096) and 4992 (19 whole blocks, 9 and 10 on 2 ranks,
    /// 4, 5, 5, 5 on 4: zero blocks pad the short ranks; then a partial block of 128 elements,
    /// so 4-bit moments too).
    const OPTIM_SHAPES: [&[usize]; 2] = [&[96, 64], &[4992]];

    fn optim_tensors(seed: f32) -> Vec<HostTensor> {
        tensors_of(&OPTIM_SHAPES, seed)
    }

    /// 8-bit AdamW and 4-bit AdamW (ZIP-SR: NF4 m1, stochastically rounded Dyn4 m2, each
    /// element's rounding keyed by its index in the whole parameter, a scalar per rank here)
    /// stepped on XLA devices in both layouts: the unsharded steps' parameters and state file,
    /// bit for bit.
    #[test]
    fn optimizer_steps_on_xla_devices_equal_the_unsharded_steps() {
        use qforge::kernels::optim::{
            Optimizer, OptimizerKind, ParamGroup, QAdamWConfig, StateBits, StateLayout,
            XlaStepLayout,
        };
        use qforge::kernels::AdamHyper;
        let dev = CpuDevice::new().unwrap();
        let hyper = AdamHyper {
            lr: 1e-2,
            weight_decay: 0.01,
            ..AdamHyper::default()
        };
        let optimizer = |kind: OptimizerKind| {
            let names = vec!["p0".to_string(), "p1".to_string()];
            Optimizer::new(vec![ParamGroup::new(names, kind, StateBits::Bits8)]).unwrap()
        };
        let zip_sr = OptimizerKind::QAdamW(QAdamWConfig::zip_sr(hyper));
        let adamw8 = OptimizerKind::AdamW(hyper);
        let cases = [
            ("adamw8bit", adamw8, XlaStepLayout::Fsdp, 4, 2),
            ("adamw4bit-zip-sr", zip_sr, XlaStepLayout::Fsdp, 2, 2),
            ("adamw4bit-zip-sr", zip_sr, XlaStepLayout::Fsdp, 4, 1),
            ("adamw8bit", adamw8, XlaStepLayout::DataParallel, 2, 1),
            (
                "adamw4bit-zip-sr",
                zip_sr,
                XlaStepLayout::DataParallel,
                2,
                1,
            ),
        ];
        for (name, kind, layout, ranks, steps) in cases {
            let Some(xla) = engine(ranks) else { return };
            let (mut whole, mut sharded) = (optimizer(kind), optimizer(kind));
            let (mut p1, mut p2) = (optim_tensors(0.5), optim_tensors(0.5));
            for k in 0..steps {
                let mut g = optim_tensors(10.0 + k as f32);
                if layout == XlaStepLayout::DataParallel {
                    // Each rank's gradient, all-reduced on XLA in rank order.
                    let per_rank: Vec<Vec<HostTensor>> = (0..ranks)
                        .map(|r| optim_tensors(10.0 + k as f32 + 0.25 * r as f32))
                        .collect();
                    for (i, gi) in g.iter_mut().enumerate() {
                        let parts: Vec<HostTensor> =
                            per_rank.iter().map(|p| p[i].clone()).collect();
                        let sum = xla.sum_f32_in_rank_order(&parts).unwrap();
                        let mut expected = parts[0].to_f32().unwrap();
                        for part in &parts[1..] {
                            for (e, v) in expected.iter_mut().zip(part.to_f32().unwrap()) {
                                *e += v;
                            }
                        }
                        let expected = HostTensor::from_f32(sum.shape.clone(), &expected).unwrap();
                        assert!(sum == expected, "{name}: gradient {i}");
                        *gi = sum;
                    }
                }
                whole.step(&dev, &mut p1, &g).unwrap();
                sharded.step_xla(&xla, layout, &mut p2, &g).unwrap();
                assert!(
                    p1 == p2,
                    "{name} {layout:?}: step {k} on {ranks} XLA devices"
                );
            }
            assert!(
                sharded.state_dict().unwrap() == whole.state_dict().unwrap(),
                "{name} {layout:?}: the state file after {steps} steps on {ranks} XLA devices"
            );
            for p in ["p0", "p1"] {
                assert!(
                    !matches!(sharded.state_layout(p), Some(StateLayout::Bits32) | None),
                    "{name}: {p} has quantized state"
                );
            }
            // Resumed from the unsharded run's state file.
            let mut resumed = optimizer(kind);
            resumed
                .load_state_dict(&whole.state_dict().unwrap())
                .unwrap();
            let g = optim_tensors(20.0);
            whole.step(&dev, &mut p1, &g).unwrap();
            resumed.step_xla(&xla, layout, &mut p2, &g).unwrap();
            assert!(
                p1 == p2,
                "{name} {layout:?}: a resumed step on {ranks} XLA devices"
            );
        }
        // A rule that needs the whole gradient's norm is refused before any program runs.
        let Some(xla) = engine(2) else { return };
        let g = optim_tensors(1.0);
        let err = xla.sum_f32_in_rank_order(&g[..1]).unwrap_err();
        assert!(err.to_string().contains("1 parts for 2 ranks"), "{err}");
        let err = xla.sum_f32_in_rank_order(&g).unwrap_err();
        assert!(
            err.to_string().contains("rank 1's part is f32 [4992]"),
            "{err}"
        );
        let clipped = ParamGroup::new(
            vec!["p0".to_string(), "p1".to_string()],
            OptimizerKind::AdamW(hyper),
            StateBits::Bits8,
        )
        .with_percentile_clipping(90);
        let mut opt = Optimizer::new(vec![clipped]).unwrap();
        let mut p = optim_tensors(0.5);
        let err = opt
            .step_xla(&xla, XlaStepLayout::Fsdp, &mut p, &optim_tensors(1.0))
            .unwrap_err();
        assert!(err.to_string().contains("not supported sharded"), "{err}");
        assert!(p == optim_tensors(0.5), "a refused step changes nothing");
    }
}
