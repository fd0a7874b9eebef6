//! The verifier rejects malformed kernels with every problem listed, each naming where it is.
//! Kernels are built with the public builder (which records ill-typed input as given) or built
//! valid and then corrupted through the public fields.

use qforge_ir::{
    verify, Access, Arena, DType, Dim, Error, Handle, Kernel, KernelBuilder, NanMode, Op,
    ReduceOrder, Rounding, ScalarType, Stmt, ValueDef, VerifyError,
};

/// All problems `verify` reports for `k` (fails the test when it accepts `k`).
fn errors(k: &Kernel) -> Vec<VerifyError> {
    match verify(k) {
        Err(Error::Verify { kernel, errors }) => {
            assert_eq!(kernel, k.name, "the error names the kernel");
            errors
        }
        Err(other) => panic!("expected Error::Verify, got {other}"),
        Ok(()) => panic!("verify accepted a malformed kernel: {k:#?}"),
    }
}

/// Asserts exactly one problem, at `location`, whose message contains `message`.
fn single(k: &Kernel, location: &str, message: &str) {
    let errs = errors(k);
    assert_eq!(errs.len(), 1, "expected one problem, got {errs:#?}");
    assert_eq!(errs[0].location, location, "{errs:#?}");
    assert!(
        errs[0].message.contains(message),
        "message {:?} should contain {message:?}",
        errs[0].message
    );
}

/// A valid base: `x: f32[n] read, y: f32[n] write, b8: u8[n] write, h: bf16[n] write, n: u32`.
struct Base {
    b: KernelBuilder,
    x: qforge_ir::ParamId,
    y: qforge_ir::ParamId,
    b8: qforge_ir::ParamId,
    h: qforge_ir::ParamId,
}

fn base() -> Base {
    let mut b = KernelBuilder::new("k");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param("y", DType::F32, &[Dim::Param(n)], Access::Write);
    let b8 = b.buffer_param("b8", DType::U8, &[Dim::Param(n)], Access::Write);
    let h = b.buffer_param("h", DType::BF16, &[Dim::Param(n)], Access::Write);
    b.set_grid(Dim::Param(n));
    Base { b, x, y, b8, h }
}

#[test]
fn a_valid_kernel_passes() {
    let Base { mut b, x, y, b8, h } = base();
    let i = b.work_item(); // body[0]
    let v = b.load(x, i);
    b.store(y, i, v);
    b.store_rounded(h, i, v, Rounding::NearestEven);
    let q = b.float_to_int(v, ScalarType::U32, Rounding::NearestEven);
    b.store(b8, i, q);
    verify(&b.finish()).unwrap();
}

#[test]
fn binary_operands_of_different_types() {
    let Base { mut b, x, .. } = base();
    let i = b.work_item(); // body[0] %0
    let v = b.load(x, i); // body[1] %1
    b.add(v, i); // body[2] %2: f32 + u32
    single(
        &b.finish(),
        "body[2] (%2)",
        "add operands differ in type: f32 and u32",
    );
}

#[test]
fn store_of_f32_into_u8_buffer() {
    let Base { mut b, x, b8, .. } = base();
    let i = b.work_item();
    let v = b.load(x, i);
    b.store(b8, i, v); // body[2]
    single(
        &b.finish(),
        "body[2]",
        "store of f32 into u8 buffer 'b8' (needs u32)",
    );
}

#[test]
fn store_to_read_only_buffer() {
    let Base { mut b, x, .. } = base();
    let i = b.work_item();
    let v = b.load(x, i);
    b.store(x, i, v); // body[2]
    single(&b.finish(), "body[2]", "store to read-only buffer 'x'");
}

#[test]
fn load_from_write_only_buffer() {
    let Base { mut b, y, .. } = base();
    let i = b.work_item();
    b.load(y, i); // body[1] %1
    single(
        &b.finish(),
        "body[1] (%1)",
        "load from write-only buffer 'y'",
    );
}

#[test]
fn bf16_store_needs_a_rounding_and_u8_store_takes_none() {
    let Base { mut b, x, h, .. } = base();
    let i = b.work_item();
    let v = b.load(x, i);
    b.store(h, i, v); // body[2]: no rounding
    single(
        &b.finish(),
        "body[2]",
        "store into bf16 buffer 'h' needs a rounding",
    );

    let Base { mut b, b8, .. } = base();
    let i = b.work_item();
    b.store_rounded(b8, i, i, Rounding::NearestEven); // body[1]
    single(
        &b.finish(),
        "body[1]",
        "store into u8 buffer 'b8' takes no rounding",
    );
}

#[test]
fn value_used_before_its_definition() {
    let Base { mut b, x, y, .. } = base();
    let i = b.work_item(); // body[0] %0
    let v = b.load(x, i); // body[1] %1
    b.store(y, i, v); // body[2]
    let mut k = b.finish();
    k.body.swap(0, 1); // the load now runs before %0 exists
    single(
        &k,
        "body[0] (%1)",
        "%0 is used before its definition or outside its block",
    );
}

#[test]
fn value_used_outside_its_block() {
    let Base { mut b, y, .. } = base();
    let i = b.work_item(); // body[0] %0
    let c = b.const_bool(true); // body[1] %1
    let mut inner = None;
    b.if_then(c, |b| inner = Some(b.const_f32(1.0))); // body[2], %2 inside
    let inner = inner.unwrap();
    b.store(y, i, inner); // body[3]: %2 is out of scope here
    let mut index = None;
    b.for_range(i, i, 1, |_, j| index = Some(j)); // body[4], index %3
    b.store(y, index.unwrap(), inner); // body[5]: both out of scope
    let errs = errors(&b.finish());
    let want = [
        (
            "body[3]",
            "%2 is used before its definition or outside its block",
        ),
        (
            "body[5]",
            "%3 is used before its definition or outside its block",
        ),
        (
            "body[5]",
            "%2 is used before its definition or outside its block",
        ),
    ];
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
    for (loc, msg) in want {
        assert!(
            errs.iter().any(|e| e.location == loc && e.message == msg),
            "missing {loc}: {msg} in {errs:#?}"
        );
    }
}

#[test]
fn nested_locations_are_paths() {
    let Base { mut b, x, y, .. } = base();
    let i = b.work_item(); // body[0]
    let c = b.const_bool(false); // body[1]
    b.if_else(
        c,
        |_| {},
        |b| {
            b.for_range(i, i, 1, |b, j| {
                b.load(y, j); // body[2].else[0].body[0] (%3): y is write-only
                b.store(x, j, j); // body[2].else[0].body[1]: read-only, and u32 into f32
            });
        },
    );
    let errs = errors(&b.finish());
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert_eq!(errs[0].location, "body[2].else[0].body[0] (%3)");
    assert!(errs[0].message.contains("write-only buffer 'y'"));
    for e in &errs[1..] {
        assert_eq!(e.location, "body[2].else[0].body[1]");
    }
    assert!(errs
        .iter()
        .any(|e| e.message == "store to read-only buffer 'x'"));
    assert!(errs
        .iter()
        .any(|e| e.message == "store of u32 into f32 buffer 'x' (needs f32)"));
}

#[test]
fn out_of_range_value_handles() {
    let Base { mut b, x, y, .. } = base();
    let i = b.work_item(); // %0
    let v = b.load(x, i); // %1
    let w = b.neg(v); // %2
    b.store(y, i, w); // body[3]
    let mut k = b.finish();
    // Drop %2 from the arena: its Let and the store's operand now dangle.
    let mut values = Arena::new();
    for (h, d) in k.values.iter() {
        if h.index() < 2 {
            values.append(d.clone());
        }
    }
    k.values = values;
    k.body.push(Stmt::Assign {
        var: Handle::from_index(0),
        value: Handle::from_index(7),
    }); // body[4]
    let errs = errors(&k);
    let want = [
        ("body[2]", "let of value %2 which does not exist"),
        ("body[3]", "value %2 does not exist"),
        ("body[4]", "value %7 does not exist"),
        ("body[4]", "assign to variable #0 which does not exist"),
    ];
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
    for (loc, msg) in want {
        assert!(
            errs.iter().any(|e| e.location == loc && e.message == msg),
            "missing {loc}: {msg} in {errs:#?}"
        );
    }
}

#[test]
fn out_of_range_param_and_table_handles() {
    let mut b = KernelBuilder::new("k");
    let x = b.buffer_param("x", DType::F32, &[Dim::Const(4)], Access::Read);
    let n = b.scalar_param("n", ScalarType::U32);
    b.set_grid(Dim::Param(n));
    let i = b.work_item(); // body[0] %0
    b.load(x, i); // body[1] %1
    b.param(n); // body[2] %2
    b.op(Op::Lookup {
        table: Handle::from_index(3),
        index: i,
    }); // body[3] %3
    let mut k = b.finish();
    // Keep only `x`: the grid, `param n` and nothing else now name a missing parameter.
    let mut params = Arena::new();
    params.append(k.params.iter().next().unwrap().1.clone());
    k.params = params;
    k.body.push(Stmt::Store {
        buf: Handle::from_index(5),
        index: i,
        value: i,
        rounding: None,
    }); // body[4]
    let errs = errors(&k);
    let want = [
        ("grid", "dim names parameter #1 which does not exist"),
        ("body[2] (%2)", "parameter #1 does not exist"),
        ("body[3] (%3)", "table #3 does not exist"),
        ("body[4]", "store to parameter #5 which does not exist"),
    ];
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
    for (loc, msg) in want {
        assert!(
            errs.iter().any(|e| e.location == loc && e.message == msg),
            "missing {loc}: {msg} in {errs:#?}"
        );
    }
}

/// `search_sorted` needs a sorted, NaN-free `f32` table and an `f32` value.
#[test]
fn search_sorted_needs_a_sorted_f32_table() {
    let cases: [(&str, ScalarType, Vec<u32>, bool, &str); 5] = [
        (
            "ok",
            ScalarType::F32,
            vec![0.0f32.to_bits(), 1.0f32.to_bits()],
            true,
            "",
        ),
        (
            "unsorted",
            ScalarType::F32,
            vec![1.0f32.to_bits(), 0.0f32.to_bits()],
            true,
            "search_sorted table 't' is not sorted: entry 1 is below entry 0",
        ),
        (
            "nan",
            ScalarType::F32,
            vec![0.0f32.to_bits(), f32::NAN.to_bits()],
            true,
            "search_sorted table 't' has NaN at 1",
        ),
        (
            "u32",
            ScalarType::U32,
            vec![1, 2],
            true,
            "search_sorted table 't' is u32, not f32",
        ),
        (
            "value",
            ScalarType::F32,
            vec![0.0f32.to_bits()],
            false,
            "search_sorted value",
        ),
    ];
    for (name, ty, data, f32_value, message) in cases {
        let mut b = KernelBuilder::new(name);
        let y = b.buffer_param("y", DType::U32, &[Dim::Const(1)], Access::Write);
        let t = b.table("t", ty, data);
        let v = if f32_value {
            b.const_f32(0.5)
        } else {
            b.const_u32(1)
        };
        // The result is stored: an ill-typed search must not make its use an error too.
        let c = b.search_sorted(t, v);
        let zero = b.const_u32(0);
        b.store(y, zero, c);
        let k = b.finish();
        if message.is_empty() {
            verify(&k).unwrap();
        } else {
            let errs = errors(&k);
            assert_eq!(errs.len(), 1, "{name}: {errs:#?}");
            assert!(errs[0].message.contains(message), "{name}: {errs:#?}");
        }
    }
}

#[test]
fn symbolic_dim_must_name_a_u32_scalar() {
    let mut b = KernelBuilder::new("k");
    let s = b.scalar_param("s", ScalarType::F32);
    let x = b.buffer_param(
        "x",
        DType::F32,
        &[Dim::Const(2), Dim::Param(s)],
        Access::Read,
    );
    b.buffer_param("z", DType::F32, &[Dim::Param(x)], Access::Read);
    let errs = errors(&b.finish());
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!(
        errs[0],
        VerifyError {
            location: "param 'x'".into(),
            message: "a symbolic dim must name a u32 scalar parameter".into()
        }
    );
    assert_eq!(errs[1].location, "param 'z'");
}

#[test]
fn declarations_duplicate_names_bool_params_and_bad_tables() {
    let mut b = KernelBuilder::new("k");
    b.scalar_param("n", ScalarType::U32);
    b.scalar_param("n", ScalarType::I32);
    b.scalar_param("flag", ScalarType::Bool);
    b.buffer_param("shapeless", DType::F32, &[], Access::Read);
    b.table("t", ScalarType::F32, vec![]);
    b.table("bits", ScalarType::Bool, vec![1]);
    b.var("v", ScalarType::F32);
    b.var("v", ScalarType::U32);
    let errs = errors(&b.finish());
    let want = [
        ("param 'n'", "duplicate parameter name"),
        ("param 'flag'", "scalar parameters cannot be bool"),
        ("param 'shapeless'", "a buffer needs at least one dim"),
        ("table 't'", "a table needs at least one element"),
        ("table 'bits'", "tables cannot be bool"),
        ("var 'v'", "variable name is not a unique identifier"),
    ];
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
    for (loc, msg) in want {
        assert!(
            errs.iter().any(|e| e.location == loc && e.message == msg),
            "missing {loc}: {msg} in {errs:#?}"
        );
    }
}

#[test]
fn names_must_be_identifiers() {
    let mut b = KernelBuilder::new("my kernel");
    b.scalar_param("2n", ScalarType::U32);
    let errs = errors(&b.finish());
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!(errs[0].location, "kernel");
    assert!(errs[0].message.contains("'my kernel' is not an identifier"));
    assert_eq!(errs[1].location, "param '2n'");
}

#[test]
fn strided_reduce_needs_a_power_of_two_ways() {
    for (ways, ok) in [(3, false), (1, false), (128, false), (2, true), (64, true)] {
        let Base { mut b, x, .. } = base();
        let i = b.work_item();
        b.reduce_sum(x, i, i, ReduceOrder::Strided(ways)); // body[1] %1
        let k = b.finish();
        if ok {
            verify(&k).unwrap();
        } else {
            single(
                &k,
                "body[1] (%1)",
                &format!("strided reduce needs a power of two in 2..=64 ways, got {ways}"),
            );
        }
    }
}

#[test]
fn reduce_needs_a_readable_float_buffer() {
    let mut b = KernelBuilder::new("k");
    let q = b.buffer_param("q", DType::U8, &[Dim::Const(8)], Access::Read);
    let w = b.buffer_param("w", DType::F16, &[Dim::Const(8)], Access::Write);
    let i = b.work_item();
    b.reduce_absmax(q, i, i, NanMode::Ignore); // body[1] %1
    b.reduce_sum(w, i, i, ReduceOrder::Sequential); // body[2] %2
    let errs = errors(&b.finish());
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!(
        errs[0],
        VerifyError {
            location: "body[1] (%1)".into(),
            message: "reduce needs a float buffer, 'q' is u8".into()
        }
    );
    assert_eq!(
        errs[1],
        VerifyError {
            location: "body[2] (%2)".into(),
            message: "reduce over write-only buffer 'w'".into()
        }
    );
}

#[test]
fn zero_loop_step_and_non_u32_bounds() {
    let Base { mut b, .. } = base();
    let i = b.work_item();
    let f = b.const_f32(1.0);
    b.for_range(i, i, 0, |_, _| {}); // body[2]
    b.for_range(f, i, 1, |_, _| {}); // body[3]
    let errs = errors(&b.finish());
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!(
        errs[0],
        VerifyError {
            location: "body[2]".into(),
            message: "loop step must be at least 1".into()
        }
    );
    assert_eq!(errs[1].location, "body[3]");
    assert!(errs[1].message.contains("loop start must be u32, got f32"));
}

#[test]
fn loop_index_only_from_for_and_values_defined_once() {
    let Base { mut b, .. } = base();
    let i = b.work_item(); // body[0] %0
    b.op(Op::LoopIndex); // body[1] %1
    let mut k = b.finish();
    k.body.push(Stmt::Let(i)); // body[2]: %0 again
    k.values.append(ValueDef {
        op: Op::WorkItem,
        ty: ScalarType::U32,
    }); // %2
    k.body.push(Stmt::For {
        index: Handle::from_index(2),
        start: i,
        end: i,
        step: 1,
        body: vec![],
    }); // body[3]
    let errs = errors(&k);
    let want = [
        (
            "body[1] (%1)",
            "a loop index can only be defined by a for statement",
        ),
        ("body[2] (%0)", "%0 is defined more than once"),
        ("body[3]", "loop index %2 must be a u32 loop_index value"),
    ];
    assert_eq!(errs.len(), want.len(), "{errs:#?}");
    for (loc, msg) in want {
        assert!(
            errs.iter().any(|e| e.location == loc && e.message == msg),
            "missing {loc}: {msg} in {errs:#?}"
        );
    }
}

#[test]
fn recorded_type_must_match_the_op() {
    let Base { mut b, .. } = base();
    b.const_u32(1); // body[0] %0
    let mut k = b.finish();
    let mut values = Arena::new();
    values.append(ValueDef {
        op: Op::Const(qforge_ir::Scalar::U32(1)),
        ty: ScalarType::I32,
    });
    k.values = values;
    single(
        &k,
        "body[0] (%0)",
        "recorded type i32 but the op yields u32",
    );
}

#[test]
fn if_condition_must_be_bool() {
    let Base { mut b, .. } = base();
    let i = b.work_item();
    b.if_then(i, |_| {}); // body[1]
    single(
        &b.finish(),
        "body[1]",
        "if condition must be bool, got u32 (%0)",
    );
}

#[test]
fn all_problems_are_collected() {
    // Three independent faults in one kernel: three errors, in body order, each located.
    let Base { mut b, x, y, h, .. } = base();
    let i = b.work_item(); // body[0] %0
    let v = b.load(x, i); // body[1] %1
    b.mul(v, i); // body[2] %2: f32 * u32
    b.store(h, i, v); // body[3]: bf16 without rounding
    b.for_range(i, i, 0, |b, j| b.store(y, j, v)); // body[4]: step 0 (the body itself is fine)
    let k = b.finish();
    let errs = errors(&k);
    assert_eq!(
        errs,
        vec![
            VerifyError {
                location: "body[2] (%2)".into(),
                message: "mul operands differ in type: f32 and u32".into()
            },
            VerifyError {
                location: "body[3]".into(),
                message: "store into bf16 buffer 'h' needs a rounding".into()
            },
            VerifyError {
                location: "body[4]".into(),
                message: "loop step must be at least 1".into()
            },
        ]
    );
    let shown = verify(&k).unwrap_err().to_string();
    assert!(
        shown.starts_with(
            "kernel 'k' failed verification (3 problem(s)): body[2] (%2): mul operands"
        ),
        "{shown}"
    );
}

#[test]
fn accumulate_body_factors_variables_and_ways() {
    // A store in the body, a u32 accumulator variable, a u32 factor and 3 ways: four problems.
    let Base { mut b, x, y, .. } = base();
    let f = b.var("f", ScalarType::F32);
    let u = b.var("u", ScalarType::U32);
    let len = b.const_u32(4);
    b.accumulate(len, ReduceOrder::Strided(3), &[f, u], |b, i| {
        let v = b.load(x, i);
        b.store(y, i, v);
        let one = b.const_f32(1.0);
        vec![(v, one), (i, one)]
    });
    let k = b.finish();
    let errs = errors(&k);
    let text = format!("{errs:#?}");
    assert_eq!(errs.len(), 4, "{text}");
    assert!(
        text.contains("power of two in 2..=64 ways, got 3"),
        "{text}"
    );
    assert!(text.contains("only let statements"), "{text}");
    assert!(
        text.contains("accumulate factor must be f32, got u32"),
        "{text}"
    );
    assert!(
        text.contains("accumulate into u32 variable 'u' (needs f32)"),
        "{text}"
    );
}

#[test]
fn accumulate_body_values_are_not_visible_after_it() {
    let Base { mut b, x, y, .. } = base();
    let f = b.var("f", ScalarType::F32);
    let len = b.const_u32(4);
    let mut inner = None;
    b.accumulate(len, ReduceOrder::Sequential, &[f], |b, i| {
        let v = b.load(x, i);
        inner = Some(v);
        vec![(v, v)]
    });
    let zero = b.const_u32(0);
    b.store(y, zero, inner.unwrap());
    let k = b.finish();
    let errs = errors(&k);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].message.contains("outside its block"), "{errs:#?}");
}
