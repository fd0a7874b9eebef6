use super::*;
use qforge_runtime::InterpreterDevice;

/// `M=..,K=..,N=..` of a shape string, parsed.
fn parse_shape(shape: &str) -> (u64, u64, u64) {
    let mut mkn = [0u64; 3];
    for (i, (part, key)) in shape.split(',').zip(["M=", "K=", "N="]).enumerate() {
        let v = part.strip_prefix(key).unwrap_or_else(|| panic!("{shape}"));
        mkn[i] = v.parse().unwrap_or_else(|_| panic!("{shape}"));
    }
    (mkn[0], mkn[1], mkn[2])
}

#[test]
fn the_list_has_every_direction_rows_shape_and_dtype_with_a_baseline_and_2mnk_flops() {
    // The list, written out independently of `train_shapes`.
    let mut want = Vec::new();
    for dtype in ["bf16", "f32"] {
        for m in [2048, 512, 128, 16] {
            for (k, n) in [(11008, 4096), (4096, 11008), (4096, 4096)] {
                for kernel in ["matmul_4bit_dx_nf4_train", "matmul_4bit_nf4_train"] {
                    want.push((kernel.to_string(), format!("M={m},K={k},N={n}"), dtype));
                }
            }
        }
    }
    let cases = train_cases(CaseSize::Full);
    let mut got: Vec<(String, String, &str)> = cases
        .iter()
        .map(|c| {
            let dtype = match c.dtype {
                DType::F32 => "f32",
                DType::BF16 => "bf16",
                other => panic!("unexpected dtype {other}"),
            };
            (c.kernel.clone(), c.shape.clone(), dtype)
        })
        .collect();
    assert_eq!(got.len(), 48);
    got.sort();
    want.sort();
    assert_eq!(got, want);
    for c in &cases {
        let (m, k, n) = parse_shape(&c.shape);
        assert_eq!(c.flops, Some(2 * m * n * k), "{} {}", c.kernel, c.shape);
        let names: Vec<&str> = c.baselines.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["fp32_gemm"], "{} {}", c.kernel, c.shape);
    }
    // `--filter` tells the directions apart.
    let fwd = crate::bench::filter_cases(train_cases(CaseSize::Full), Some(FORWARD));
    assert_eq!(fwd.map(|c| c.len()).ok(), Some(24));
    let dx = crate::bench::filter_cases(train_cases(CaseSize::Full), Some("dx_nf4_train"));
    assert_eq!(dx.map(|c| c.len()).ok(), Some(24));
    // Scaled-down sizes keep the list's structure.
    let small = train_cases(CaseSize::Interpreter);
    assert_eq!(small.len(), 2 * 3 * 2 * 2);
    assert!(small[0].shape.ends_with("(interpreter: scaled down)"));
}

#[test]
fn bytes_by_hand() {
    // Forward M = 16, K = N = 4096, bf16: 8 MiB of codes, 256 Ki absmax (1 MiB), x and y
    // 16 x 4096 x 2 bytes each.
    let s = TrainShape {
        direction: TrainDirection::Forward,
        m: 16,
        k: 4096,
        n: 4096,
        dtype: DType::BF16,
    };
    assert_eq!(s.bytes(), (8 << 20) + (1 << 20) + 2 * 16 * 4096 * 2);
    // dX M = 2, K = 64, N = 128 f32: dY 2 x 128, dX 2 x 64.
    let dx = TrainShape {
        direction: TrainDirection::BackwardInput,
        m: 2,
        k: 64,
        n: 128,
        dtype: DType::F32,
    };
    assert_eq!(dx.bytes(), 4096 + 4 * 128 + 4 * 2 * (128 + 64));
    assert_eq!(dx.flops(), 2 * 2 * 64 * 128);
}

/// The first byte where `a` and `b` differ (or the length if only one is longer).
fn first_mismatch(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[test]
fn a_tiny_case_is_bit_identical_on_cpu_and_the_interpreter() {
    let cpu = crate::devices::device_by_name("cpu").expect("the cpu device");
    let shapes = train_shapes(CaseSize::Elements(64));
    assert_eq!(shapes.len(), 8);
    let mut checked = 0;
    for s in shapes {
        let inputs = TrainInputs::new(s).expect("inputs");
        let want = inputs.run(&InterpreterDevice).expect("interpreter");
        let got = inputs.run(cpu.as_ref()).expect("cpu");
        let (_, cout) = s.cols();
        assert_eq!(want.shape, [s.m, cout], "{s:?}");
        assert_eq!((got.dtype, &got.shape), (want.dtype, &want.shape), "{s:?}");
        assert_eq!(
            first_mismatch(&got.data, &want.data),
            None,
            "{s:?}: cpu differs from the interpreter"
        );
        // The check can fail: one flipped bit is found.
        let mut wrong = want.data.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        assert_eq!(first_mismatch(&got.data, &wrong), Some(last), "{s:?}");
        assert_eq!(first_mismatch(&got.data, &want.data[..last]), Some(last));
        // The case itself runs on both devices, warm-up and timed call.
        let mut case = train_case(s, CaseSize::Elements(64));
        for dev in [&InterpreterDevice as &dyn Device, cpu.as_ref()] {
            (case.run)(dev).expect("warm-up");
            (case.run)(dev).expect("run");
            (case.baselines[0].run)(dev).expect("baseline warm-up");
            (case.baselines[0].run)(dev).expect("baseline run");
        }
        checked += 1;
    }
    assert_eq!(checked, 8);
}

#[test]
fn the_baseline_computes_the_kernels_product() {
    // f32 only: the kernel and the dense GEMM both approximate the exact product of the same
    // operands (the NF4 weight is exact in f32), within the rounding of an f32 sum.
    for s in train_shapes(CaseSize::Elements(48)) {
        if s.dtype != DType::F32 {
            continue;
        }
        let (a, w, len) = dense_operands(s, &InterpreterDevice).expect("operands");
        let (inner, cout) = match s.direction {
            TrainDirection::Forward => (s.k, s.n),
            TrainDirection::BackwardInput => (s.n, s.k),
        };
        assert_eq!(
            (a.len(), w.len(), len),
            (s.m * inner, s.n * s.k, s.m * cout)
        );
        // Exact (f64) product and the bound `inner * eps * sum |a * w|`.
        let mut exact = vec![0.0f64; len];
        let mut bound = vec![0.0f64; len];
        for i in 0..s.m {
            for j in 0..cout {
                for l in 0..inner {
                    let wv = match s.direction {
                        TrainDirection::Forward => w[j * s.k + l],
                        TrainDirection::BackwardInput => w[l * s.k + j],
                    };
                    let p = f64::from(a[i * inner + l]) * f64::from(wv);
                    exact[i * cout + j] += p;
                    bound[i * cout + j] += p.abs() * inner as f64 * f64::from(f32::EPSILON);
                }
            }
        }
        let kernel = TrainInputs::new(s)
            .and_then(|i| i.run(&InterpreterDevice))
            .and_then(|t| Ok(t.to_f32()?))
            .expect("kernel");
        for threads in [0, 1, 2] {
            let mut dense = vec![f32::NAN; len];
            dense_product(s, &a, &w, &mut dense, threads).expect("gemm");
            for (name, out) in [("kernel", &kernel), ("gemm", &dense)] {
                for (idx, ((&g, &e), &b)) in out.iter().zip(&exact).zip(&bound).enumerate() {
                    assert!(
                        (f64::from(g) - e).abs() <= b,
                        "{s:?} {name} ({threads} threads) element {idx}: {g}, exact {e}, bound {b}"
                    );
                }
            }
        }
    }
}
