//! The text form: random valid kernels built with the public `KernelBuilder` verify, print, parse
//! back to the identical kernel, and print identically again; corrupted kernels round trip too;
//! the parser never panics and reports line, column and what it expected.

#[path = "text_roundtrip/kernel_gen.rs"]
mod kernel_gen;

use kernel_gen::{corrupt, kernels};
use proptest::prelude::*;
use qforge_ir::text::{parse, print};
use qforge_ir::{
    verify, Access, CmpOp, DType, Dim, Error, Kernel, KernelBuilder, Op, ReduceOrder, Scalar,
    ScalarType, ValueDef,
};

fn assert_round_trip(k: &Kernel) -> Result<(), TestCaseError> {
    let text = print(k);
    let back =
        parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n--- text ---\n{text}")))?;
    prop_assert_eq!(&back, k, "parse(print(k)) differs from k; text:\n{}", text);
    prop_assert_eq!(print(&back), text, "print is not a fixed point");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn valid_kernels_verify_and_round_trip(k in kernels()) {
        if let Err(e) = verify(&k) {
            return Err(TestCaseError::fail(format!("generator built an invalid kernel: {e}\n{}", print(&k))));
        }
        assert_round_trip(&k)?;
        let back = parse(&print(&k)).unwrap();
        prop_assert_eq!(k.content_hash(), back.content_hash());
        prop_assert_eq!(k.fingerprint(), back.fingerprint());
        prop_assert_eq!(k.fingerprint(), k.clone().fingerprint());
    }

    #[test]
    fn corrupted_kernels_round_trip(k in kernels(), c in proptest::collection::vec(any::<u32>(), 0..40)) {
        assert_round_trip(&corrupt(k, c))?;
    }

    #[test]
    fn parser_never_panics_on_random_text(s in "\\PC{0,200}") {
        let _ = parse(&s);
    }

    #[test]
    fn parser_never_panics_on_token_soup(words in proptest::collection::vec(prop::sample::select(vec![
        "kernel", "k", "(", ")", "x", ":", "f32", "u8", "[", "]", "n", ",", "read", "write", "u32",
        "grid", "table", "=", "0x3f800000", "var", "{", "}", "%0", "%1", "%4294967295", "#0", "#9",
        "work_item", "const", "-", "7", "load", "store", "assign", "if", "else", "for", "in", "..",
        "step", "reduce", "sum", "absmax", "strided", "len", "unused", "values", "let", "rne",
        "\"q\"", "// c\n", "\n", "cmp", "lt", "select", "bitcast", "float_to_int", "99999999999999999999",
    ]), 0..80)) {
        let _ = parse(&words.join(" "));
    }

    #[test]
    fn parser_never_panics_on_damaged_valid_text(k in kernels(), cut in any::<usize>(), at in any::<usize>(), ch in any::<char>()) {
        let text = print(&k);
        let chars: Vec<char> = text.chars().collect();
        let truncated: String = chars[..cut % (chars.len() + 1)].iter().collect();
        if let Err(Error::Parse { line, col, .. }) = parse(&truncated) {
            prop_assert!(line >= 1 && line <= truncated.lines().count() + 1 && col >= 1);
        }
        let mut edited = chars.clone();
        let i = at % chars.len();
        edited[i] = ch;
        let _ = parse(&edited.iter().collect::<String>());
        edited.remove(i);
        let _ = parse(&edited.iter().collect::<String>());
    }
}

// ----- the exact text of a known kernel, and hand-written texts -----

/// The doc example kernel of `KernelBuilder`, plus a table, a variable and a loop.
fn sample() -> Kernel {
    let mut b = KernelBuilder::new("scale_f32");
    let n = b.scalar_param("n", ScalarType::U32);
    let x = b.buffer_param("x", DType::F32, &[Dim::Param(n)], Access::Read);
    let y = b.buffer_param(
        "y",
        DType::BF16,
        &[Dim::Param(n), Dim::Const(2)],
        Access::Write,
    );
    b.set_grid(Dim::Param(n));
    let t = b.table_f32(
        "codes",
        &[-1.0, -0.0, f32::from_bits(0x7fc0_0001), 0.5, 2.0],
    );
    let acc = b.var("acc", ScalarType::F32);
    let i = b.work_item();
    let v = b.load(x, i);
    let two = b.const_f32(2.0);
    let r = b.mul(v, two);
    b.store_auto(y, i, r);
    let lo = b.const_u32(0);
    let hi = b.const_i32(-3);
    let hi = b.bitcast(hi, ScalarType::U32);
    b.for_range(lo, hi, 2, |b, j| {
        let c = b.lookup(t, j);
        let m = b.cmp(CmpOp::Lt, c, v);
        b.if_else(
            m,
            |b| b.assign(acc, c),
            |b| {
                let s = b.reduce_sum(x, j, lo, ReduceOrder::Strided(8));
                b.assign(acc, s);
            },
        );
    });
    b.finish()
}

const SAMPLE_TEXT: &str = "\
kernel scale_f32(n: u32, x: f32[n] read, y: bf16[n, 2] write)
grid n
table codes: f32[5] = [
  0xbf800000, 0x80000000, 0x7fc00001, 0x3f000000,  // -1.0, -0.0, NaN, 0.5
  0x40000000  // 2.0
]
var acc: f32
{
  %0: u32 = work_item
  %1: f32 = load x[%0]
  %2: f32 = const 0x40000000  // 2.0
  %3: f32 = mul %1, %2
  store y[%0] = %3 rne
  %4: u32 = const 0
  %5: i32 = const -3
  %6: u32 = bitcast u32 %5
  for %7 in %4..%6 step 2 {
    %8: f32 = lookup codes[%7]
    %9: bool = cmp lt %8, %1
    if %9 {
      assign acc = %8
    } else {
      %10: f32 = reduce sum strided 8 x[%7, len %4]
      assign acc = %10
    }
  }
}
";

#[test]
fn sample_prints_exactly() {
    let k = sample();
    verify(&k).unwrap();
    assert_eq!(print(&k), SAMPLE_TEXT);
    assert_eq!(parse(SAMPLE_TEXT).unwrap(), k);
}

#[test]
fn hand_written_text_with_comments_and_layout_parses() {
    // Different whitespace, comments, hex u32 constant, explicit const type: same kernel as
    // one built by hand with the builder.
    let text = "kernel k( a : u8 [ 16 ] readwrite , m:i32 ) // header\n grid 4\n{ %0 : u32 = work_item\n\
                %1: u32 = load a[%0] %2: u32 = const u32 0x10 store a[%0] = %2\n %3: i32 = param m }";
    let mut b = KernelBuilder::new("k");
    let a = b.buffer_param("a", DType::U8, &[Dim::Const(16)], Access::ReadWrite);
    let m = b.scalar_param("m", ScalarType::I32);
    b.set_grid(Dim::Const(4));
    let i = b.work_item();
    b.load(a, i);
    let c = b.const_u32(16);
    b.store(a, i, c);
    b.param(m);
    assert_eq!(parse(text).unwrap(), b.finish());
}

#[test]
fn dead_values_and_odd_names_use_the_unused_section_and_quotes() {
    let mut b = KernelBuilder::new("k");
    let p = b.scalar_param("dup", ScalarType::U32);
    b.scalar_param("dup", ScalarType::F32);
    b.scalar_param("a b\"c", ScalarType::I32);
    b.set_grid(Dim::Param(p));
    b.work_item();
    let mut k = b.finish();
    k.values.append(ValueDef {
        op: Op::Const(Scalar::U32(5)),
        ty: ScalarType::F32,
    });
    let text = print(&k);
    assert_eq!(
        text,
        "kernel k(dup: u32, dup: f32, \"a b\\\"c\": i32)\ngrid #0\n{\n  %0: u32 = work_item\n}\n\
         unused {\n  %1: f32 = const u32 5\n}\n"
    );
    assert_eq!(parse(&text).unwrap(), k);
}

fn parse_err(text: &str) -> (usize, usize, String) {
    match parse(text) {
        Err(Error::Parse { line, col, message }) => (line, col, message),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn errors_name_line_column_and_expectation() {
    let head = "kernel k(x: f32[4] read, n: u32)\ngrid 1\n{\n";
    let cases: &[(&str, usize, usize, &str)] = &[
        (
            "",
            1,
            1,
            "expected 'kernel' at the start of a kernel, found end of input",
        ),
        ("kernel k(x: f33[4] read)", 1, 13, "expected a buffer dtype"),
        (
            "kernel k(x: f32[4] rw)",
            1,
            20,
            "expected a buffer access (read, write or readwrite), found 'rw'",
        ),
        (
            "kernel k(x: f32[m] read)\ngrid 1\n{}",
            1,
            17,
            "unknown parameter 'm'",
        ),
        (
            "kernel k()\ngrid 1\ntable t: f32[2] = [0x0]\n{}",
            3,
            14,
            "table 't' declares 2 elements but lists 1",
        ),
        (
            "kernel k()\ngrid 1\ntable t: f32[1] = [1.5]\n{}",
            3,
            20,
            "an f32 bit pattern in hex",
        ),
        ("kernel \"a\\q\"()", 1, 8, "unknown escape '\\q'"),
        (
            "kernel k()\ngrid 1\ntable t: f32[1] = [15]\n{}",
            3,
            20,
            "an f32 bit pattern in hex",
        ),
        ("  %0: u32 = work_itm\n}", 4, 13, "unknown op 'work_itm'"),
        (
            "  %0: f32 = add %1 %2\n}",
            4,
            20,
            "expected ',' between the operands of add, found '%2'",
        ),
        (
            "  %0: u32 = work_item\n  %0: f32 = work_item\n}",
            5,
            3,
            "conflicting definitions of %0",
        ),
        (
            "  %1: u32 = load x[%0]\n}",
            4,
            20,
            "value %0 is never defined",
        ),
        (
            "  %0: u32 = const 4294967296\n}",
            4,
            19,
            "does not fit in u32",
        ),
        (
            "  %0: i32 = const -2147483649\n}",
            4,
            19,
            "does not fit in i32",
        ),
        (
            "  store x[%0] = %0 rne\n  %0: u32 = work_item\n  store nope[%0] = %0\n}",
            6,
            9,
            "unknown parameter 'nope'",
        ),
        (
            "  for %1 in %0..%0 step 1 {\n}",
            5,
            2,
            "expected a statement",
        ),
        (
            "  %0: u32 = work_item\n}\ntrailing",
            6,
            1,
            "expected end of input after the kernel body, found 'trailing'",
        ),
        (
            "  %0: u32 = work_item $\n}",
            4,
            23,
            "unexpected character '$'",
        ),
        (
            "  %0: f32 = reduce sum strided x[%0, len %0]\n}",
            4,
            32,
            "the number of strided ways",
        ),
    ];
    for (body, line, col, msg) in cases {
        let text = if body.starts_with("kernel") || body.is_empty() {
            body.to_string()
        } else {
            format!("{head}{body}")
        };
        let (l, c, m) = parse_err(&text);
        assert!(
            m.contains(msg),
            "{text:?}: message {m:?} does not contain {msg:?}"
        );
        assert_eq!((l, c), (*line, *col), "{text:?}: wrong position for {m:?}");
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let mut text = String::from("kernel k()\ngrid 1\n{\n%0: bool = const true\n");
    for _ in 0..10_000 {
        text.push_str("if %0 {");
    }
    let (_, _, m) = parse_err(&text);
    assert!(m.contains("nested more than"), "{m}");
}

/// `parse_with_lines` gives each statement's 1-based line under the verifier's path.
#[test]
fn statement_lines_follow_the_verifier_paths() {
    let text = "kernel k(n: u32, x: f32[n] write)\ngrid n\n{\n  %0: u32 = work_item\n  \
                %1: f32 = const 0x80000000  // -0.0\n  store x[%0] = %1\n}\n";
    let (kernel, lines) = qforge_ir::text::parse_with_lines(text).expect("parses");
    assert_eq!(kernel, qforge_ir::text::parse(text).expect("parses"));
    assert_eq!(lines.get("body[0]"), Some(&4));
    assert_eq!(lines.get("body[2]"), Some(&6));
    assert_eq!(lines.len(), 3);
}
