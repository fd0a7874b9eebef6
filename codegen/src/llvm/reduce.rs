//! `Op::Reduce`: reductions over a buffer range, in exactly the order the IR names.

use qforge_ir::{DType, NanMode, ParamId, ReduceKind, ReduceOrder, ScalarType};

use super::emit::{internal, Emitter};
use super::memory::elem_ty;
use crate::error::Result;

/// `-0.0` as an LLVM float literal.
pub(super) const NEG_ZERO: &str = "0x8000000000000000";

impl Emitter<'_> {
    /// `kind` over `buf[start .. start + len]` (`start`, `len`: `i32`) in `order`. With bounds
    /// checks a non-empty range reaching past the buffer is reported and reads nothing.
    pub(super) fn reduce(
        &mut self,
        kind: ReduceKind,
        buf: ParamId,
        start: &str,
        len: &str,
        order: ReduceOrder,
    ) -> Result<String> {
        let (base, count, dtype, _) = self.buffer(buf)?;
        if !dtype.is_float() {
            return Err(internal("reduce over a non-float buffer"));
        }
        let start = self.ins(format!("zext i32 {start} to i64"));
        let mut len = self.ins(format!("zext i32 {len} to i64"));
        if let Some(count) = count {
            let end = self.ins(format!("add i64 {start}, {len}"));
            let past = self.ins(format!("icmp ugt i64 {end}, {count}"));
            let some = self.ins(format!("icmp ne i64 {len}, 0"));
            let oob = self.ins(format!("and i1 {past}, {some}"));
            let l = len.clone();
            len = self
                .guarded(&oob, Some("i64"), "0", |_| Some(l))?
                .ok_or_else(|| internal("guarded length without a value"))?;
        }
        let bytes = if dtype.size_bytes() == 1 {
            start
        } else {
            self.ins(format!("mul i64 {start}, {}", dtype.size_bytes()))
        };
        let first = self.ins(format!("getelementptr i8, i8* {base}, i64 {bytes}"));
        match (kind, order) {
            (ReduceKind::Sum, ReduceOrder::Sequential) => self.sum_strided(&first, &len, dtype, 1),
            (ReduceKind::Sum, ReduceOrder::Strided(ways)) => {
                if !(2..=64).contains(&ways) || !ways.is_power_of_two() {
                    return Err(internal(format!("strided reduce with {ways} ways")));
                }
                self.sum_strided(&first, &len, dtype, ways)
            }
            // max |x| does not depend on the order.
            (ReduceKind::AbsMax(nan), ReduceOrder::Sequential | ReduceOrder::Strided(_)) => {
                self.abs_max(&first, &len, dtype, nan)
            }
        }
    }

    /// Element `i` (`i64`) of the range starting at `first` (`i8*`), widened to `f32`.
    fn element_at(&mut self, first: &str, i: &str, dtype: DType) -> String {
        let p = self.element_ptr(first, i, dtype, elem_ty(dtype));
        let raw = self.ins(format!("load {0}, {0}* {p}, align 1", elem_ty(dtype)));
        self.widen(dtype, &raw, 1)
    }

    /// `ways` partials (an array in the entry block) starting at `-0.0`, element `i` into
    /// `acc[i % ways]`, then the fixed halving tree (`ways == 1`: the sequential sum).
    fn sum_strided(&mut self, first: &str, len: &str, dtype: DType, ways: u32) -> Result<String> {
        let arr = self.alloca(&format!("[{ways} x float]"));
        for j in 0..ways {
            let p = self.ins(format!(
                "getelementptr [{ways} x float], [{ways} x float]* {arr}, i64 0, i64 {j}"
            ));
            self.line(format!("store float {NEG_ZERO}, float* {p}"));
        }
        self.counted_loop("i64", "0", len, 1, |e, i| {
            let x = e.element_at(first, i, dtype);
            let j = e.ins(format!("and i64 {i}, {}", ways - 1));
            let p = e.ins(format!(
                "getelementptr [{ways} x float], [{ways} x float]* {arr}, i64 0, i64 {j}"
            ));
            let a = e.ins(format!("load float, float* {p}"));
            let s = e.ins(format!("fadd float {a}, {x}"));
            e.line(format!("store float {s}, float* {p}"));
            Ok(())
        })?;
        Ok(self.tree_from_array(&arr, ways))
    }

    /// The halving tree over the `ways` floats of the array `arr`. With vector lanes on, the
    /// array is one vector and each level adds its upper half to its lower half lane-wise:
    /// lane `j` of a level is `p[j] + p[j + w]`, the scalar tree's add (a short dot product's
    /// outputs otherwise spent more instructions in the tree than in the products).
    pub(super) fn tree_from_array(&mut self, arr: &str, ways: u32) -> String {
        if self.opts.lanes != 0 && ways >= 2 {
            let vt = format!("<{ways} x float>");
            let p = self.ins(format!("bitcast [{ways} x float]* {arr} to {vt}*"));
            let mut v = self.ins(format!("load {vt}, {vt}* {p}, align 4"));
            let mut w = ways;
            while w > 1 {
                let half = w / 2;
                let mask = |from: u32| {
                    let ids: Vec<String> =
                        (from..from + half).map(|j| format!("i32 {j}")).collect();
                    format!("<{half} x i32> <{}>", ids.join(", "))
                };
                let (lo_m, hi_m) = (mask(0), mask(half));
                let wt = format!("<{w} x float>");
                let lo = self.ins(format!("shufflevector {wt} {v}, {wt} undef, {lo_m}"));
                let hi = self.ins(format!("shufflevector {wt} {v}, {wt} undef, {hi_m}"));
                v = self.ins(format!("fadd <{half} x float> {lo}, {hi}"));
                w = half;
            }
            return self.ins(format!("extractelement <1 x float> {v}, i32 0"));
        }
        let acc: Vec<String> = (0..ways)
            .map(|j| {
                let p = self.ins(format!(
                    "getelementptr [{ways} x float], [{ways} x float]* {arr}, i64 0, i64 {j}"
                ));
                self.ins(format!("load float, float* {p}"))
            })
            .collect();
        self.halving_tree("float", acc)
    }

    /// The halving tree of `acc` (a power-of-two count of values of LLVM type `ty`, `float`
    /// or a vector of them, combined lane by lane): `w = n; while w > 1 { w /= 2;
    /// acc[j] = acc[j] + acc[j + w] for j < w }`, then `acc[0]`.
    pub(super) fn halving_tree(&mut self, ty: &str, mut acc: Vec<String>) -> String {
        let mut w = acc.len();
        while w > 1 {
            w /= 2;
            for j in 0..w {
                acc[j] = self.ins(format!("fadd {ty} {}, {}", acc[j], acc[j + w]));
            }
        }
        acc.swap_remove(0)
    }

    /// `max |x|` from `+0.0`. On the bits of `|x|` (sign cleared) the unsigned integer order is
    /// the float order and every NaN lies above `+inf`: `Propagate` is a plain unsigned max
    /// (any NaN wins), `Ignore` first replaces NaN bits by 0 (which never wins over `+0.0`).
    fn abs_max(&mut self, first: &str, len: &str, dtype: DType, nan: NanMode) -> Result<String> {
        let acc = self.alloca("i32");
        self.line(format!("store i32 0, i32* {acc}"));
        self.counted_loop("i64", "0", len, 1, |e, i| {
            let x = e.element_at(first, i, dtype);
            let bits = e.ins(format!("bitcast float {x} to i32"));
            let mut mag = e.ins(format!("and i32 {bits}, 2147483647"));
            match nan {
                NanMode::Propagate => {}
                NanMode::Ignore => {
                    let is_nan = e.ins(format!("icmp ugt i32 {mag}, 2139095040"));
                    mag = e.select(&is_nan, ScalarType::U32, 1, "0", &mag);
                }
            }
            let a = e.ins(format!("load i32, i32* {acc}"));
            let c = e.ins(format!("icmp ugt i32 {mag}, {a}"));
            let m = e.select(&c, ScalarType::U32, 1, &mag, &a);
            e.line(format!("store i32 {m}, i32* {acc}"));
            Ok(())
        })?;
        let bits = self.ins(format!("load i32, i32* {acc}"));
        Ok(self.ins(format!("bitcast i32 {bits} to float")))
    }
}
