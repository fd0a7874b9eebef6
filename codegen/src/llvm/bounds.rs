//! Upper bounds of `u32` values that their ops prove, in every lane and every work item. A
//! table lookup whose index cannot leave the table skips its clamp (`memory.rs`), e.g. the
//! level search's `level_k[r >> (m - k)]` (`crate::decompose`), and the packed 4-bit decode
//! needs its nibble shift to be at most 4 (`nibble.rs`).

use std::collections::HashMap;

use qforge_ir::{BinaryOp, DType, Kernel, Op, ParamKind, ScalarType, Value};

/// Deepest chain of ops followed; a deeper value is unbounded.
const MAX_DEPTH: u32 = 32;

/// An upper bound of the `u32` value `v` of `k` (`u32::MAX` when none is proven, and for
/// values of other types): constants; `add` and `mul` (saturating: a bound that could wrap is
/// no bound); `and` and `min` (the smaller bound); `or` and `xor` (all ones up to the larger
/// bound's top bit); `shl` by a constant without overflow; `shr` (by a constant: the bound
/// shifted); `select` (the larger arm); the load of a `u8` element (255). `seed` is the value a vector body replaces by
/// `seed + lane` (`Emitter::lanes_seed`): it has no bound there, whatever its ops.
pub(super) fn upper_bound(k: &Kernel, v: Value, seed: Option<Value>) -> u32 {
    bound(k, v, seed, MAX_DEPTH, &mut HashMap::new())
}

fn bound(
    k: &Kernel,
    v: Value,
    seed: Option<Value>,
    depth: u32,
    memo: &mut HashMap<Value, u32>,
) -> u32 {
    let Some(def) = k.values.try_get(v) else {
        return u32::MAX;
    };
    if depth == 0 || def.ty != ScalarType::U32 || seed == Some(v) {
        return u32::MAX;
    }
    if let Some(b) = memo.get(&v) {
        return *b;
    }
    let constant = |w: Value| match k.values.try_get(w).map(|d| &d.op) {
        Some(Op::Const(c)) => Some(c.bits() & 31),
        _ => None,
    };
    let mut of = |w: Value| bound(k, w, seed, depth - 1, memo);
    let b = match def.op {
        Op::Const(c) => c.bits(),
        Op::Select {
            if_true, if_false, ..
        } => of(if_true).max(of(if_false)),
        Op::Binary(op, a, b) => match op {
            BinaryOp::Add => of(a).saturating_add(of(b)),
            BinaryOp::Mul => of(a).saturating_mul(of(b)),
            BinaryOp::And | BinaryOp::Min => of(a).min(of(b)),
            BinaryOp::Or | BinaryOp::Xor => {
                let m = of(a) | of(b);
                u32::MAX.checked_shr(m.leading_zeros()).unwrap_or(0)
            }
            BinaryOp::Shl => match constant(b) {
                Some(c) => u32::try_from(u64::from(of(a)) << c).unwrap_or(u32::MAX),
                None => u32::MAX,
            },
            BinaryOp::Shr => of(a) >> constant(b).unwrap_or(0),
            _ => u32::MAX,
        },
        // A `u8` element, zero-extended.
        Op::Load { buf, .. } => match k.params.try_get(buf).map(|p| &p.kind) {
            Some(ParamKind::Buffer {
                dtype: DType::U8, ..
            }) => u32::from(u8::MAX),
            _ => u32::MAX,
        },
        _ => u32::MAX,
    };
    memo.insert(v, b);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_ir::{CmpOp, KernelBuilder};

    /// The level search's count `r = select(c, r + s, r)` is bounded by the sum of its steps,
    /// and its level index `r >> (m - k)` by `2^k - 1`; each rule's bound, and the unbounded
    /// cases (a parameter, an overflowing add, a subtract, a variable shift left).
    #[test]
    fn bounds_follow_the_ops() {
        let mut b = KernelBuilder::new("bounds_probe");
        let n = b.scalar_param("n", ScalarType::U32);
        let nv = b.param(n);
        let c = b.cmp(CmpOp::Lt, nv, nv);
        let m = 8;
        let mut r = b.const_u32(0);
        for k in 0..m {
            let shift = b.const_u32(m - k);
            let idx = b.shr(r, shift);
            assert_eq!(
                upper_bound(b.kernel(), idx, None),
                (1 << k) - 1,
                "level {k}"
            );
            let s = b.const_u32(1 << (m - 1 - k));
            let next = b.add(r, s);
            r = b.select(c, next, r);
        }
        let three = b.const_u32(3);
        // A vector body's seed (replaced by `seed + lane`) has no bound, whatever its ops;
        // masking it again bounds it.
        let seed = b.min(nv, three);
        let after = b.add(seed, three);
        let masked_again = b.and(after, three);
        {
            let k = b.kernel();
            assert_eq!(upper_bound(k, after, None), 6);
            assert_eq!(upper_bound(k, after, Some(seed)), u32::MAX);
            assert_eq!(upper_bound(k, masked_again, Some(seed)), 3);
        }
        let big = b.const_u32(u32::MAX - 1);
        let cases = [
            (b.and(nv, three), 3),
            (b.min(nv, three), 3),
            (b.or(three, three), 3),
            (b.binary(BinaryOp::Xor, r, three), 255),
            (b.shl(three, three), 24),
            (b.mul(three, three), 9),
            (b.shr(nv, three), u32::MAX >> 3),
            (b.shr(r, nv), 255),
            (b.shl(three, nv), u32::MAX),
            (b.add(big, three), u32::MAX),
            (b.sub(three, three), u32::MAX),
            (nv, u32::MAX),
            (r, 255),
        ];
        let k = b.finish();
        for (i, (v, want)) in cases.into_iter().enumerate() {
            assert_eq!(upper_bound(&k, v, None), want, "case {i}");
        }
    }
}
