//! Lowerings that fuse or drop instructions: `not(cmp)` as one compare with the complemented
//! condition (as a select condition, an `if` condition and a stored bool), and table lookups
//! whose index bound is proven from adds and selects of constants (no clamp) or is not (clamp).

use super::*;

/// `not(x op y)` in plain Rust: the negation of the IEEE comparison (so true on unordered
/// floats for every op but `ne`).
fn not_holds<T: PartialOrd>(op: CmpOp, a: T, b: T) -> bool {
    !match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}

/// `y[i] = select(not(x0 op x1), 10, 20) + (if not(x0 op x1) { 100 } else { 0 })`.
fn negated_cmp_kernel(op: CmpOp, ty: ScalarType) -> Kernel {
    let dtype = match ty {
        ScalarType::F32 => DType::F32,
        _ => DType::U32,
    };
    elementwise("negated_cmp", &[dtype, dtype], DType::U32, |b, v| {
        let (x, y) = match ty {
            ScalarType::I32 => (
                b.bitcast(v[0], ScalarType::I32),
                b.bitcast(v[1], ScalarType::I32),
            ),
            _ => (v[0], v[1]),
        };
        let c = b.cmp(op, x, y);
        let n = b.not(c);
        let (ten, twenty) = (b.const_u32(10), b.const_u32(20));
        let sel = b.select(n, ten, twenty);
        let acc = b.var("acc", ScalarType::U32);
        b.assign(acc, sel);
        b.if_then(n, |b| {
            let hundred = b.const_u32(100);
            let s = b.add(sel, hundred);
            b.assign(acc, s);
        });
        b.read_var(acc)
    })
}

fn expected(holds: bool) -> u32 {
    if holds {
        110
    } else {
        20
    }
}

#[test]
fn negated_f32_compares_are_complements_nan_included() {
    let edges = f_edges();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &x in &edges {
        for &y in &edges {
            a.push(x);
            b.push(y);
        }
    }
    for op in CmpOp::ALL {
        let k = negated_cmp_kernel(op, ScalarType::F32);
        let got = u32s(&run_elementwise(&k, &[le_f32(&a), le_f32(&b)], DType::U32));
        for i in 0..a.len() {
            assert_eq!(
                got[i],
                expected(not_holds(op, a[i], b[i])),
                "not({:?} {op:?} {:?})",
                a[i],
                b[i]
            );
        }
    }
}

#[test]
fn negated_integer_compares_are_complements() {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for &x in &U_EDGES {
        for &y in &U_EDGES {
            a.push(x);
            b.push(y);
        }
    }
    for op in CmpOp::ALL {
        for ty in [ScalarType::U32, ScalarType::I32] {
            let k = negated_cmp_kernel(op, ty);
            let got = u32s(&run_elementwise(&k, &[le_u32(&a), le_u32(&b)], DType::U32));
            for i in 0..a.len() {
                let holds = if ty == ScalarType::I32 {
                    not_holds(op, a[i] as i32, b[i] as i32)
                } else {
                    not_holds(op, a[i], b[i])
                };
                assert_eq!(
                    got[i],
                    expected(holds),
                    "not({} {op:?} {}) as {ty}",
                    a[i],
                    b[i]
                );
            }
        }
    }
}

/// `y[i] = table[select(x0 & 1, 3, 1) + select(x0 & 2, extra, 0)]` for a 5-entry table: with
/// `extra = 1` every index is provably in range; with `extra = 2` the index can reach 5 and
/// must be clamped to the last entry.
#[test]
fn lookups_with_search_position_indices_stay_in_the_table() {
    let table = [11u32, 22, 33, 44, 55];
    for extra in [1u32, 2] {
        let k = elementwise("lookup_bound", &[DType::U32], DType::U32, |b, v| {
            let t = b.table_u32("t", &table);
            let (one, two, zero) = (b.const_u32(1), b.const_u32(2), b.const_u32(0));
            let (three, e) = (b.const_u32(3), b.const_u32(extra));
            let lo = b.and(v[0], one);
            let c1 = b.cmp(CmpOp::Ne, lo, zero);
            let p = b.select(c1, three, one);
            let hi = b.and(v[0], two);
            let c2 = b.cmp(CmpOp::Ne, hi, zero);
            let q = b.select(c2, e, zero);
            let idx = b.add(p, q);
            b.lookup(t, idx)
        });
        let xs: Vec<u32> = (0..8).collect();
        let got = u32s(&run_elementwise(&k, &[le_u32(&xs)], DType::U32));
        for (x, g) in xs.iter().zip(&got) {
            let idx = if x & 1 != 0 { 3 } else { 1 } + if x & 2 != 0 { extra } else { 0 };
            assert_eq!(*g, table[(idx as usize).min(4)], "x = {x}, extra = {extra}");
        }
    }
}
