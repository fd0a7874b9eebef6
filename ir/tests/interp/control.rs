//! Loops, branches, variables, scalar parameters, execution errors and splitting the grid.

use qforge_ir::{CmpOp, Error, ReduceOrder};

use super::*;

// ----- control flow and variables -----

/// `for i in (start..end).step_by(step) { count += 1; sum += i }`; returns `[count, sum]`.
fn count_loop(start: u32, end: u32, step: u32) -> [u32; 2] {
    let mut k = KernelBuilder::new("count_loop");
    let ps = k.scalar_param("start", ScalarType::U32);
    let pe = k.scalar_param("end", ScalarType::U32);
    let out = k.buffer_param("out", DType::U32, &[Dim::Const(2)], Access::Write);
    let count = k.var("count", ScalarType::U32);
    let total = k.var("total", ScalarType::U32);
    let (s, e) = (k.param(ps), k.param(pe));
    k.for_range(s, e, step, |k, i| {
        let c = k.read_var(count);
        let one = k.const_u32(1);
        let c1 = k.add(c, one);
        k.assign(count, c1);
        let t = k.read_var(total);
        let t1 = k.add(t, i);
        k.assign(total, t1);
    });
    let (c, t) = (k.read_var(count), k.read_var(total));
    let (i0, i1) = (k.const_u32(0), k.const_u32(1));
    k.store(out, i0, c);
    k.store(out, i1, t);
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(start)),
        OwnedArg::Scalar(Scalar::U32(end)),
        OwnedArg::Write(vec![0; 8]),
    ];
    let w = words(out_bytes(&run(&k.finish(), args)[2]));
    [w[0], w[1]]
}

#[test]
fn for_loops_step_and_stop() {
    const M: u32 = u32::MAX;
    assert_eq!(count_loop(3, 20, 5), [4, 3 + 8 + 13 + 18]);
    assert_eq!(count_loop(0, 10, 1), [10, 45]);
    assert_eq!(count_loop(10, 5, 1), [0, 0], "start > end: no iteration");
    assert_eq!(count_loop(7, 7, 3), [0, 0], "start == end: no iteration");
    assert_eq!(count_loop(0, 1, 1000), [1, 0]);
    // index + step overflowing u32 ends the loop (it must not wrap around to small indices).
    assert_eq!(count_loop(M - 1, M, 5), [1, M - 1]);
    assert_eq!(count_loop(M - 3, M, 2), [2, (M - 3).wrapping_add(M - 1)]);
    assert_eq!(count_loop(0, M, 0x8000_0000), [2, 0x8000_0000]);
    assert_eq!(count_loop(1, M, M - 1), [1, 1]);
}

#[test]
fn nested_loops_and_if_else() {
    // acc = sum over i in 0..4, j in i..5 step 2 of (i * 10 + j), counting only odd j into
    // the else branch as a negative contribution.
    let mut k = KernelBuilder::new("nested");
    let out = k.buffer_param("out", DType::I32, &[Dim::Const(1)], Access::Write);
    let acc = k.var("acc", ScalarType::I32);
    let (z, four, five) = (k.const_u32(0), k.const_u32(4), k.const_u32(5));
    k.for_range(z, four, 1, |k, i| {
        k.for_range(i, five, 2, |k, j| {
            let ten = k.const_u32(10);
            let t = k.mul(i, ten);
            let v = k.add(t, j);
            let v = k.bitcast(v, ScalarType::I32);
            let one = k.const_u32(1);
            let odd_bit = k.and(j, one);
            let zero = k.const_u32(0);
            let even = k.cmp(CmpOp::Eq, odd_bit, zero);
            k.if_else(
                even,
                |k| {
                    let a = k.read_var(acc);
                    let a1 = k.add(a, v);
                    k.assign(acc, a1);
                },
                |k| {
                    let a = k.read_var(acc);
                    let a1 = k.sub(a, v);
                    k.assign(acc, a1);
                },
            );
        });
    });
    let a = k.read_var(acc);
    let zero = k.const_u32(0);
    k.store(out, zero, a);
    let got = words(out_bytes(
        &run(&k.finish(), vec![OwnedArg::Write(vec![0; 4])])[0],
    ))[0] as i32;
    let mut want = 0i32;
    for i in 0..4 {
        for j in (i..5).step_by(2) {
            let v = i * 10 + j;
            want += if j % 2 == 0 { v } else { -v };
        }
    }
    assert_eq!(got, want);
}

#[test]
fn variables_start_at_zero_in_every_work_item() {
    let n = 5u32;
    let mut k = KernelBuilder::new("vars");
    let fo = k.buffer_param("f", DType::F32, &[Dim::Const(n)], Access::Write);
    let uo = k.buffer_param("u", DType::U32, &[Dim::Const(n)], Access::Write);
    let bo = k.buffer_param("b", DType::U32, &[Dim::Const(n)], Access::Write);
    let vf = k.var("vf", ScalarType::F32);
    let vu = k.var("vu", ScalarType::U32);
    let vb = k.var("vb", ScalarType::Bool);
    k.set_grid(Dim::Const(n));
    let i = k.work_item();
    // Read first: the value left by the previous work item must not be visible.
    let (f0, u0, b0) = (k.read_var(vf), k.read_var(vu), k.read_var(vb));
    let (seven, three) = (k.const_u32(7), k.const_u32(3));
    let bsel = k.select(b0, seven, three);
    k.store(fo, i, f0);
    k.store(uo, i, u0);
    k.store(bo, i, bsel);
    let x = k.const_f32(1.5);
    let f1 = k.add(f0, x);
    k.assign(vf, f1);
    let u1 = k.add(u0, i);
    let one = k.const_u32(1);
    let u1 = k.add(u1, one);
    k.assign(vu, u1);
    let t = k.const_bool(true);
    k.assign(vb, t);
    let args = run(
        &k.finish(),
        vec![
            OwnedArg::Write(vec![0xFF; 20]),
            OwnedArg::Write(vec![0xFF; 20]),
            OwnedArg::Write(vec![0xFF; 20]),
        ],
    );
    assert_eq!(
        words(out_bytes(&args[0])),
        [0; 5],
        "f32 variables start at +0.0 (bits 0)"
    );
    assert_eq!(words(out_bytes(&args[1])), [0; 5]);
    assert_eq!(
        words(out_bytes(&args[2])),
        [3; 5],
        "bool variables start false"
    );
}

#[test]
fn scalar_params_and_work_item() {
    let mut k = KernelBuilder::new("axpb");
    let n = k.scalar_param("n", ScalarType::U32);
    let a = k.scalar_param("a", ScalarType::F32);
    let b = k.scalar_param("b", ScalarType::I32);
    let out = k.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::Write);
    k.set_grid(Dim::Param(n));
    let i = k.work_item();
    let (av, bv) = (k.param(a), k.param(b));
    let fi = k.int_to_float(i);
    let fb = k.int_to_float(bv);
    let m = k.mul(av, fi);
    let r = k.add(m, fb);
    k.store(out, i, r);
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(4)),
        OwnedArg::Scalar(Scalar::f32(0.5)),
        OwnedArg::Scalar(Scalar::I32(-3)),
        OwnedArg::Write(vec![0; 16]),
    ];
    let got = words(out_bytes(&run(&k.finish(), args)[3]));
    assert_eq!(got, f32s(&[-3.0, -2.5, -2.0, -1.5]));
}

// ----- errors -----

/// `out[i] = x[i * stride + offset]` over `grid` work items, `x` has `len` f32 elements.
fn gather(len: u32, grid: u32, stride: u32, offset: u32) -> (Kernel, Vec<OwnedArg>) {
    let mut k = KernelBuilder::new("gather");
    let x = k.buffer_param("x", DType::F32, &[Dim::Const(len)], Access::Read);
    let out = k.buffer_param("out", DType::F32, &[Dim::Const(grid)], Access::Write);
    k.set_grid(Dim::Const(grid));
    let i = k.work_item();
    let (s, o) = (k.const_u32(stride), k.const_u32(offset));
    let j = k.mul(i, s);
    let j = k.add(j, o);
    let v = k.load(x, j);
    k.store(out, i, v);
    let data: Vec<f32> = (0..len).map(|i| i as f32 + 0.5).collect();
    (
        k.finish(),
        vec![
            OwnedArg::Read(le32(&f32s(&data))),
            OwnedArg::Write(vec![0; grid as usize * 4]),
        ],
    )
}

#[test]
fn out_of_bounds_load_is_an_execution_error() {
    let (kernel, mut args) = gather(8, 1, 1, 10);
    let err = try_run(&kernel, &mut args).unwrap_err();
    let Error::Execution {
        kernel: name,
        work_item,
        message,
    } = &err
    else {
        panic!("wrong error {err:?}")
    };
    assert_eq!((name.as_str(), *work_item), ("gather", 0));
    assert!(
        message.contains("'x'") && message.contains("index 10") && message.contains("length 8"),
        "{message}"
    );
    // Item 3 is the first to leave the buffer (index 9 of 8); earlier items' stores stay.
    let (kernel, mut args) = gather(8, 5, 3, 0);
    let err = try_run(&kernel, &mut args).unwrap_err();
    assert!(
        matches!(err, Error::Execution { work_item: 3, .. }),
        "{err:?}"
    );
    assert_eq!(words(out_bytes(&args[1])), f32s(&[0.5, 3.5, 6.5, 0.0, 0.0]));
}

#[test]
fn out_of_bounds_store_is_an_execution_error() {
    let mut k = KernelBuilder::new("scatter");
    let out = k.buffer_param("out", DType::U8, &[Dim::Const(4)], Access::Write);
    k.set_grid(Dim::Const(2));
    let i = k.work_item();
    let four = k.const_u32(4);
    let j = k.mul(i, four);
    k.store(out, j, i);
    let mut args = vec![OwnedArg::Write(vec![9; 4])];
    let err = try_run(&k.finish(), &mut args).unwrap_err();
    let Error::Execution {
        work_item, message, ..
    } = &err
    else {
        panic!("wrong error {err:?}")
    };
    assert_eq!(*work_item, 1);
    assert!(
        message.contains("'out'") && message.contains("index 4") && message.contains("length 4"),
        "{message}"
    );
}

#[test]
fn invalid_kernels_and_arguments_are_rejected() {
    // A store of f32 into a u32 buffer fails verification; nothing runs.
    let mut k = KernelBuilder::new("bad");
    let out = k.buffer_param("out", DType::U32, &[Dim::Const(1)], Access::Write);
    let z = k.const_u32(0);
    let f = k.const_f32(1.0);
    k.store(out, z, f);
    let mut args = vec![OwnedArg::Write(vec![7; 4])];
    assert!(matches!(
        try_run(&k.finish(), &mut args),
        Err(Error::Verify { .. })
    ));
    assert_eq!(out_bytes(&args[0]), [7; 4]);
    // Wrong buffer size.
    let (kernel, _) = gather(8, 1, 1, 0);
    let mut args = vec![OwnedArg::Read(vec![0; 31]), OwnedArg::Write(vec![0; 4])];
    assert!(matches!(
        try_run(&kernel, &mut args),
        Err(Error::Argument { .. })
    ));
    // Wrong argument count.
    assert!(matches!(
        try_run(&kernel, &mut args[..1]),
        Err(Error::Argument { .. })
    ));
}

// ----- splitting the grid -----

/// `out[i] = strided(2) sum of x[4i .. 4i + 4] * 0.1 + i` over `n` work items.
fn split_kernel(n: u32) -> (Kernel, Vec<OwnedArg>, Vec<u32>) {
    let mut k = KernelBuilder::new("split");
    let pn = k.scalar_param("n", ScalarType::U32);
    let x = k.buffer_param(
        "x",
        DType::F32,
        &[Dim::Param(pn), Dim::Const(4)],
        Access::Read,
    );
    let out = k.buffer_param("out", DType::F32, &[Dim::Param(pn)], Access::Write);
    k.set_grid(Dim::Param(pn));
    let i = k.work_item();
    let four = k.const_u32(4);
    let start = k.mul(i, four);
    let s = k.reduce_sum(x, start, four, ReduceOrder::Strided(2));
    let tenth = k.const_f32(0.1);
    let s = k.mul(s, tenth);
    let fi = k.int_to_float(i);
    let r = k.add(s, fi);
    k.store(out, i, r);
    let data: Vec<f32> = (0..n * 4)
        .map(|j| (j as f32).sqrt() * if j % 3 == 0 { -1.0 } else { 1.0 })
        .collect();
    let want = (0..n as usize)
        .map(|i| {
            let c = &data[4 * i..4 * i + 4];
            let s = (-0.0 + c[0] + c[2]) + (-0.0 + c[1] + c[3]);
            (s * 0.1 + i as f32).to_bits()
        })
        .collect();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Read(le32(&f32s(&data))),
        OwnedArg::Write(vec![0; n as usize * 4]),
    ];
    (k.finish(), args, want)
}

#[test]
fn run_items_over_split_ranges_equals_run() {
    let (kernel, args, want) = split_kernel(37);
    let whole = run(&kernel, args.clone());
    assert_eq!(words(out_bytes(&whole[2])), want);

    let mut parts = args.clone();
    for range in [20..37, 0..5, 5..6, 6..20, 9..9] {
        interp::run_items(&kernel, &mut OwnedArg::borrow_all(&mut parts), range).unwrap();
    }
    assert_eq!(parts, whole);

    // Only the requested items are written.
    let mut some = args.clone();
    interp::run_items(&kernel, &mut OwnedArg::borrow_all(&mut some), 3..5).unwrap();
    let got = words(out_bytes(&some[2]));
    for (i, w) in got.iter().enumerate() {
        assert_eq!(
            *w,
            if (3..5).contains(&i) { want[i] } else { 0 },
            "item {i}"
        );
    }

    // A range past the grid is an argument error; an empty one (even reversed) runs nothing.
    let mut more = args.clone();
    let err = interp::run_items(&kernel, &mut OwnedArg::borrow_all(&mut more), 30..38);
    assert!(matches!(err, Err(Error::Argument { .. })), "{err:?}");
    #[allow(clippy::reversed_empty_ranges)]
    interp::run_items(&kernel, &mut OwnedArg::borrow_all(&mut more), 10..5).unwrap();
    interp::run_items(&kernel, &mut OwnedArg::borrow_all(&mut more), 40..40).unwrap();
    assert_eq!(more, args);
}

#[test]
fn a_million_elements_run_quickly() {
    // Dequantize-like: out[i] = code[packed[i/2] nibble] * absmax[i / 64], 2^20 outputs.
    let n: u32 = 1 << 20;
    let code: Vec<f32> = (0..16).map(|c| (c as f32 - 7.5) / 7.5).collect();
    let mut k = KernelBuilder::new("dequant_like");
    let pn = k.scalar_param("n", ScalarType::U32);
    let nb = k.scalar_param("nbytes", ScalarType::U32);
    let nblk = k.scalar_param("nblocks", ScalarType::U32);
    let packed = k.buffer_param("packed", DType::U8, &[Dim::Param(nb)], Access::Read);
    let absmax = k.buffer_param("absmax", DType::F32, &[Dim::Param(nblk)], Access::Read);
    let out = k.buffer_param("out", DType::BF16, &[Dim::Param(pn)], Access::Write);
    k.set_grid(Dim::Param(pn));
    let t = k.table_f32("code", &code);
    let i = k.work_item();
    let one = k.const_u32(1);
    let byte_i = k.shr(i, one);
    let byte = k.load(packed, byte_i);
    let odd = k.and(i, one);
    let zero = k.const_u32(0);
    let is_even = k.cmp(CmpOp::Eq, odd, zero);
    let (four, fifteen) = (k.const_u32(4), k.const_u32(15));
    let hi = k.shr(byte, four);
    let lo = k.and(byte, fifteen);
    let nib = k.select(is_even, hi, lo);
    let c = k.lookup(t, nib);
    let six = k.const_u32(6);
    let blk = k.shr(i, six);
    let s = k.load(absmax, blk);
    let v = k.mul(c, s);
    k.store_auto(out, i, v);
    let kernel = k.finish();
    let bytes: Vec<u8> = (0..n / 2)
        .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let scales: Vec<f32> = (0..n / 64).map(|b| 0.01 + b as f32 * 0.001).collect();
    let args = vec![
        OwnedArg::Scalar(Scalar::U32(n)),
        OwnedArg::Scalar(Scalar::U32(n / 2)),
        OwnedArg::Scalar(Scalar::U32(n / 64)),
        OwnedArg::Read(bytes.clone()),
        OwnedArg::Read(le32(&f32s(&scales))),
        OwnedArg::Write(vec![0; n as usize * 2]),
    ];
    let t0 = std::time::Instant::now();
    let args = run(&kernel, args);
    let elapsed = t0.elapsed();
    let got = halves(out_bytes(&args[5]));
    for i in 0..n as usize {
        let b = bytes[i / 2];
        let nib = if i % 2 == 0 { b >> 4 } else { b & 15 };
        let v = code[nib as usize] * scales[i / 64];
        assert_eq!(got[i], half::bf16::from_f32(v).to_bits(), "element {i}");
    }
    eprintln!("2^20-element dequantize in the interpreter: {elapsed:?}");
    assert!(elapsed.as_secs() < 20, "interpreter too slow: {elapsed:?}");
}
