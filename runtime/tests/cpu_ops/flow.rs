//! Control flow and variables, bounds checks, threading, the kernel cache, the emitted text.

use super::*;

#[test]
fn loops_ifs_and_variables() {
    let mut b = KernelBuilder::new("control_flow");
    let n = b.scalar_param("n", ScalarType::U32);
    let y = b.buffer_param("y", DType::U32, &[Dim::Param(n)], Access::Write);
    let z = b.buffer_param("z", DType::U32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let acc = b.var("acc", ScalarType::U32);
    let seen = b.var("seen", ScalarType::U32);
    let count = b.var("count", ScalarType::U32);
    let i = b.work_item();
    // Variables start at zero in every work item.
    let before = b.read_var(seen);
    b.store(z, i, before);
    let one = b.const_u32(1);
    let i1 = b.add(i, one);
    b.assign(seen, i1);
    let ten = b.const_u32(10);
    let end = b.add(i, ten);
    b.for_range(i, end, 3, |b, j| {
        let two = b.const_u32(2);
        let r = b.rem(j, two);
        let zero = b.const_u32(0);
        let even = b.cmp(CmpOp::Eq, r, zero);
        b.if_else(
            even,
            |b| {
                let a = b.read_var(acc);
                let s = b.add(a, j);
                b.assign(acc, s);
            },
            |b| {
                let a = b.read_var(acc);
                let seven = b.const_u32(7);
                let m = b.mul(j, seven);
                let x = b.binary(BinaryOp::Xor, a, m);
                b.assign(acc, x);
            },
        );
    });
    // A loop whose next index would overflow u32 stops: (MAX-5..MAX).step_by(4) runs twice.
    let lo = b.const_u32(u32::MAX - 5);
    let hi = b.const_u32(u32::MAX);
    b.for_range(lo, hi, 4, |b, _| {
        let c = b.read_var(count);
        let one = b.const_u32(1);
        let c1 = b.add(c, one);
        b.assign(count, c1);
    });
    // An empty loop and an if without else.
    b.for_range(hi, lo, 1, |b, _| {
        let big = b.const_u32(1 << 30);
        b.assign(count, big);
    });
    let five = b.const_u32(5);
    let small = b.cmp(CmpOp::Lt, i, five);
    b.if_then(small, |b| {
        let c = b.read_var(count);
        let hundred = b.const_u32(100);
        let c2 = b.add(c, hundred);
        b.assign(count, c2);
    });
    let a = b.read_var(acc);
    let c = b.read_var(count);
    let thousand = b.const_u32(1000);
    let c = b.mul(c, thousand);
    let out = b.add(a, c);
    b.store(y, i, out);
    let k = b.finish();

    let n = 37u32;
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Write(vec![0xff; 4 * n as usize]),
        OwnedArg::Write(vec![0xff; 4 * n as usize]),
    ];
    let out = run(&k, args);
    let (OwnedArg::Write(y), OwnedArg::Write(z)) = (&out[1], &out[2]) else {
        panic!("outputs")
    };
    for i in 0..n {
        let mut acc = 0u32;
        let mut j = i;
        while j < i + 10 {
            acc = if j % 2 == 0 { acc + j } else { acc ^ (j * 7) };
            j += 3;
        }
        let count = 2 + if i < 5 { 100 } else { 0 };
        assert_eq!(u32s(y)[i as usize], acc + count * 1000, "work item {i}");
        assert_eq!(
            u32s(z)[i as usize],
            0,
            "variable not reset in work item {i}"
        );
    }
}

// ----- bounds checks, threading, cache, emitted text -----

/// `y[i] = access(x, i)` with x and y of n f32 elements.
fn shifted(name: &str, f: impl FnOnce(&mut KernelBuilder, ParamId, ParamId, Value)) -> Kernel {
    let mut b = KernelBuilder::new(name);
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    let i = b.work_item();
    f(&mut b, x, y, i);
    b.finish()
}

#[test]
fn out_of_range_accesses_fail_the_launch() {
    let load_next = shifted("load_next", |b, x, y, i| {
        let one = b.const_u32(1);
        let j = b.add(i, one);
        let v = b.load(x, j);
        b.store(y, i, v);
    });
    let store_twice = shifted("store_twice", |b, x, y, i| {
        let v = b.load(x, i);
        let two = b.const_u32(2);
        let j = b.mul(i, two);
        b.store(y, j, v);
    });
    let sum_three = shifted("sum_three", |b, x, y, i| {
        let three = b.const_u32(3);
        let s = b.reduce_sum(x, i, three, ReduceOrder::Sequential);
        b.store(y, i, s);
    });
    for (k, first_bad) in [(&load_next, 9), (&store_twice, 5), (&sum_three, 8)] {
        let x = le_f32(&[1.0; 10]);
        let mut y = vec![0u8; 40];
        let mut args = [
            qforge_ir::Arg::Scalar(Scalar::U32(10)),
            qforge_ir::Arg::Read(&x),
            qforge_ir::Arg::Write(&mut y),
        ];
        match cpu().launch(k, &mut args) {
            Err(qforge_runtime::Error::Ir(qforge_ir::Error::Execution { work_item, .. })) => {
                assert_eq!(work_item, first_bad, "{}", k.name)
            }
            other => panic!("{}: expected an execution error, got {other:?}", k.name),
        }
    }
}

#[test]
fn a_multi_threaded_launch_reports_the_first_failing_work_item() {
    // Items 500.. of `store_twice` fail, in many of the launch's chunks.
    let store_twice = shifted("store_twice_mt", |b, x, y, i| {
        let v = b.load(x, i);
        let two = b.const_u32(2);
        let j = b.mul(i, two);
        b.store(y, j, v);
    });
    let dev = CpuDevice::with_options(CpuOptions {
        threads: Some(4),
        parallel_min_bytes: 0,
        parallel_min_grid: 0,
        ..CpuOptions::default()
    })
    .expect("cpu");
    let n = 1000usize;
    for _ in 0..20 {
        let x = le_f32(&vec![1.0; n]);
        let mut y = vec![0u8; 4 * n];
        let mut args = [
            qforge_ir::Arg::Scalar(Scalar::U32(n as u32)),
            qforge_ir::Arg::Read(&x),
            qforge_ir::Arg::Write(&mut y),
        ];
        match dev.launch(&store_twice, &mut args) {
            Err(qforge_runtime::Error::Ir(qforge_ir::Error::Execution { work_item, .. })) => {
                assert_eq!(work_item, 500)
            }
            other => panic!("expected an execution error, got {other:?}"),
        }
    }
}

#[test]
fn multi_threaded_launch_equals_single_threaded() {
    let k = shifted("threads_mix", |b, x, y, i| {
        let v = b.load(x, i);
        let bits = b.bitcast(v, ScalarType::U32);
        let t = b.table_f32("t", &[0.5, -1.25, 3.0, 1e-3, -7.0, 0.1, 2.0, -0.0]);
        let acc = b.var("acc", ScalarType::F32);
        let zero = b.const_u32(0);
        let eight = b.const_u32(8);
        b.for_range(zero, eight, 1, |b, k| {
            let s = b.shr(bits, k);
            let seven = b.const_u32(7);
            let idx = b.and(s, seven);
            let c = b.lookup(t, idx);
            let a = b.read_var(acc);
            let p = b.mul(c, v);
            let n = b.add(a, p);
            b.assign(acc, n);
        });
        let r = b.read_var(acc);
        b.store(y, i, r);
    });
    let n = 300_001usize;
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 1000.0).collect();
    let args = |x: &[f32]| {
        vec![
            OwnedArg::Scalar(Scalar::U32(n as u32)),
            OwnedArg::Read(le_f32(x)),
            OwnedArg::Write(vec![0; 4 * n]),
        ]
    };
    let force = |threads| CpuOptions {
        threads: Some(threads),
        parallel_min_bytes: 0,
        parallel_min_grid: 0,
        ..CpuOptions::default()
    };
    let four = CpuDevice::with_options(force(4)).expect("cpu");
    let one = CpuDevice::with_options(force(1)).expect("cpu");
    let mut single = args(&x);
    one.launch(&k, &mut OwnedArg::borrow_all(&mut single))
        .expect("single-threaded launch");
    let multi = run_on(&four, &k, args(&x));
    assert!(single == multi, "4 threads and 1 thread differ");
    let OwnedArg::Write(y) = &single[2] else {
        panic!("output")
    };
    assert!(f32s(y).iter().any(|v| *v != 0.0));
}

#[test]
fn kernels_are_cached_by_content() {
    let dev = CpuDevice::new().expect("cpu");
    let a = elementwise("cache_a", &[DType::F32], DType::F32, |b, v| b.neg(v[0]));
    let b2 = elementwise("cache_b", &[DType::F32], DType::F32, |b, v| b.abs(v[0]));
    dev.compile(&a).expect("compiles");
    dev.compile(&a.clone()).expect("compiles");
    assert_eq!(dev.cached_kernels(), 1);
    dev.compile(&b2).expect("compiles");
    assert_eq!(dev.cached_kernels(), 2);
    // Same name and signature as `a`, another body: a kernel of its own, with its own code.
    let a_abs = elementwise("cache_a", &[DType::F32], DType::F32, |b, v| b.abs(v[0]));
    dev.compile(&a_abs).expect("compiles");
    assert_eq!(dev.cached_kernels(), 3);
    for (k, want) in [(&a, -3.0f32), (&a_abs, 3.0), (&a, -3.0)] {
        let out = run_on(
            &dev,
            k,
            vec![
                OwnedArg::Scalar(Scalar::U32(1)),
                OwnedArg::Read(le_f32(&[3.0])),
                OwnedArg::Write(vec![0; 4]),
            ],
        );
        let OwnedArg::Write(y) = &out[2] else {
            panic!("output")
        };
        assert_eq!(f32s(y), [want], "{} ran another kernel's code", k.name);
    }
    let mut broken = a.clone();
    broken.body.clear();
    broken.body.push(qforge_ir::Stmt::Store {
        buf: ParamId::from_index(0),
        index: Value::from_index(0),
        value: Value::from_index(0),
        rounding: None,
    });
    assert!(
        matches!(dev.compile(&broken), Err(qforge_runtime::Error::Codegen(_))),
        "an invalid kernel is rejected"
    );
}

#[test]
fn shared_kernels_hit_the_cache_of_equal_kernels() {
    let dev = CpuDevice::new().expect("cpu");
    let neg = elementwise("shared_neg", &[DType::F32], DType::F32, |b, v| b.neg(v[0]));
    let abs = elementwise("shared_neg", &[DType::F32], DType::F32, |b, v| b.abs(v[0]));
    let run = |k: &qforge_ir::SharedKernel| -> f32 {
        let mut args = vec![
            OwnedArg::Scalar(Scalar::U32(1)),
            OwnedArg::Read(le_f32(&[3.0])),
            OwnedArg::Write(vec![0; 4]),
        ];
        dev.launch_shared(k, &mut OwnedArg::borrow_all(&mut args))
            .expect("launch");
        let OwnedArg::Write(y) = &args[2] else {
            panic!("output")
        };
        f32s(y)[0]
    };
    // A kernel compiled from a plain launch is found for a shared copy of it (compared), and
    // the shared kernel's own entry again (the same Arc).
    dev.compile(&neg).expect("compiles");
    let shared = qforge_ir::SharedKernel::new(neg.clone());
    assert_eq!(shared.fingerprint(), neg.fingerprint());
    assert_eq!((run(&shared), run(&shared)), (-3.0, -3.0));
    assert_eq!(dev.cached_kernels(), 1);
    // Same name, another body: its own code, never the other kernel's.
    let shared_abs = qforge_ir::SharedKernel::new(abs);
    assert_eq!((run(&shared_abs), run(&shared)), (3.0, -3.0));
    assert_eq!(dev.cached_kernels(), 2);
    assert!(shared.clone().into_kernel() == neg);
    // Compiled as shared first, then found for the plain kernel (compared).
    let fresh = CpuDevice::new().expect("cpu");
    fresh.compile_shared(&shared_abs).expect("compiles");
    fresh.compile(shared_abs.kernel()).expect("compiles");
    assert_eq!(fresh.cached_kernels(), 1);
}

#[test]
fn unchecked_device_gives_the_same_bits() {
    // SAFETY: the kernel indexes x and y with the work item, in range for n = grid.
    let dev = unsafe { CpuDevice::new_unchecked(CpuOptions::default()) }.expect("cpu");
    let k = elementwise("unchecked_sqrt", &[DType::F16], DType::BF16, |b, v| {
        b.sqrt(v[0])
    });
    let x: Vec<u8> = (0..=u16::MAX)
        .step_by(7)
        .flat_map(|h| h.to_le_bytes())
        .collect();
    let checked = run_elementwise(&k, std::slice::from_ref(&x), DType::BF16);
    let n = x.len() / 2;
    let out = run_on(
        &dev,
        &k,
        vec![
            OwnedArg::Scalar(Scalar::U32(n as u32)),
            OwnedArg::Read(x),
            OwnedArg::Write(vec![0; 2 * n]),
        ],
    );
    assert!(OwnedArg::Write(checked) == out[2]);
}

#[test]
fn clif_text_is_deterministic_and_uses_no_fused_or_native_min_max() {
    use qforge_codegen::cranelift::clif_text;
    let two = [DType::F32, DType::F32];
    let minmax = elementwise("minmax", &two, DType::F32, |b, v| {
        let m = b.min(v[0], v[1]);
        b.max(m, v[1])
    });
    let text = clif_text(&minmax).expect("lowers");
    assert_eq!(text, clif_text(&minmax).expect("lowers"));
    assert!(
        text.contains("select") && !text.contains("fmin") && !text.contains("fmax"),
        "{text}"
    );
    let separate = elementwise("sep", &[DType::F32; 3], DType::F32, |b, v| {
        let p = b.mul(v[0], v[1]);
        b.add(p, v[2])
    });
    let text = clif_text(&separate).expect("lowers");
    assert!(
        text.contains("fmul") && text.contains("fadd") && !text.contains("fma"),
        "{text}"
    );
    let nibble = elementwise("nibble", &[DType::U8], DType::F32, |b, v| {
        let t = b.table_f32("code", &[0.5; 16]);
        let fifteen = b.const_u32(15);
        let lo = b.and(v[0], fifteen);
        b.lookup(t, lo)
    });
    let text = clif_text(&nibble).expect("lowers");
    assert!(
        !text.contains("umin"),
        "a u8 & 15 index needs no clamp for 16 entries: {text}"
    );
    let raw = elementwise("raw_index", &[DType::U32], DType::F32, |b, v| {
        let t = b.table_f32("code", &[0.5; 16]);
        b.lookup(t, v[0])
    });
    assert!(clif_text(&raw).expect("lowers").contains("umin"));
}

/// `search_sorted` on the CPU device (its decomposition adds tables that the launch must pass)
/// against the interpreter: bitsandbytes' dynamic-map thresholds and a small table (bucket
/// search), and a 300-entry table (more than a bucket candidate byte holds: level search), on
/// every entry, its neighbours and the special values.
#[test]
fn search_sorted_matches_the_interpreter() {
    let dynamic =
        qforge_kernels::nearest::thresholds(&qforge_kernels::BlockwiseMap::Dynamic.code())
            .expect("bitsandbytes' map");
    let small = vec![-2.0, -0.0, 0.0, 0.25, 0.25, 1.0, f32::INFINITY];
    let large: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.01).collect();
    for (name, table) in [("dynamic", dynamic), ("small", small), ("large", large)] {
        let k = elementwise(name, &[DType::F32], DType::U32, |b, v| {
            let t = b.table_f32("t", &table);
            b.search_sorted(t, v[0])
        });
        let mut x = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(1),
            f32::MAX,
            f32::MIN,
        ];
        for t in table.iter().filter(|t| t.is_finite()) {
            x.extend([*t, t.next_up(), t.next_down(), -*t]);
        }
        let got = run_elementwise(&k, &[le_f32(&x)], DType::U32);
        // Spot-check against the definition on the host as well.
        for (i, v) in x.iter().enumerate() {
            let want = if v.is_nan() {
                0
            } else {
                table.iter().filter(|t| **t < *v).count() as u32
            };
            let c = u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!(c, want, "{name}: v = {v:e}");
        }
    }
}
