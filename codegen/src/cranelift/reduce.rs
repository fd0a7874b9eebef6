//! Reductions over a buffer range, in exactly the order the IR names.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F32X4, I32, I64};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Value};
use qforge_ir::{DType, NanMode, ParamId, ReduceKind, ReduceOrder};

use super::lower::{internal, Lowerer};
use crate::error::Result;

impl Lowerer<'_> {
    /// `kind` over `buf[start .. start + len]` (`start`, `len`: `i32`) in `order`.
    pub(super) fn reduce(
        &mut self,
        kind: ReduceKind,
        buf: ParamId,
        start: Value,
        len: Value,
        order: ReduceOrder,
    ) -> Result<Value> {
        let (base, count, dtype, access) = self.buffer(buf)?;
        if !dtype.is_float() {
            return Err(internal("reduce over a non-float buffer"));
        }
        let start = self.b.ins().uextend(I64, start);
        let mut len = self.b.ins().uextend(I64, len);
        if let Some(count) = count {
            // A non-empty range must lie in the buffer; otherwise nothing is read. An empty
            // range reads nothing and is never out of range.
            let end = self.b.ins().iadd(start, len);
            let past = self.b.ins().icmp(IntCC::UnsignedGreaterThan, end, count);
            let zero = self.c64(0);
            let some = self.b.ins().icmp(IntCC::NotEqual, len, zero);
            let oob = self.b.ins().band(past, some);
            let checked = self.guarded(oob, Some(I64), |_| Some(len))?;
            len = checked.ok_or_else(|| internal("guarded length without a value"))?;
        }
        let first = self.offset(base, start, dtype);
        let flags = self.buffer_mem(access);
        match (kind, order) {
            (ReduceKind::Sum, ReduceOrder::Sequential) => {
                Ok(self.sum_sequential(first, len, dtype, flags))
            }
            (ReduceKind::Sum, ReduceOrder::Strided(ways)) => {
                self.sum_strided(first, len, dtype, flags, ways)
            }
            // max |x| does not depend on the order.
            (ReduceKind::AbsMax(nan), ReduceOrder::Sequential | ReduceOrder::Strided(_)) => {
                self.abs_max(first, len, dtype, flags, nan)
            }
        }
    }

    /// Element `i` (`i64`) of the range starting at `first`, widened to `f32`.
    fn element_at(&mut self, first: Value, i: Value, dtype: DType, flags: MemFlagsData) -> Value {
        let addr = self.offset(first, i, dtype);
        self.load_element(dtype, addr, flags)
    }

    /// `acc = -0.0; for i in 0..len { acc = acc + x[i] }`.
    fn sum_sequential(
        &mut self,
        first: Value,
        len: Value,
        dtype: DType,
        flags: MemFlagsData,
    ) -> Value {
        let acc = self.b.declare_var(F32);
        let init = self.b.ins().f32const(-0.0);
        self.b.def_var(acc, init);
        let zero = self.c64(0);
        let _ = self.counted_loop(zero, len, 1, |l, i| {
            let x = l.element_at(first, i, dtype, flags);
            let a = l.b.use_var(acc);
            let s = l.b.ins().fadd(a, x);
            l.b.def_var(acc, s);
            Ok(())
        });
        self.b.use_var(acc)
    }

    /// `ways` accumulators, element `i` into `acc[i % ways]`, then the fixed halving tree.
    ///
    /// Whole rounds of `ways` elements run with the accumulators in registers (as `f32x4`
    /// vectors, lane `j` of vector `k` holding `acc[4k + j]`, when the buffer is `f32` and
    /// `ways` is a multiple of 4); the accumulators then go to a stack slot, the last partial
    /// round adds `x[i]` into slot `i % ways`, and the tree runs on the slot's values.
    fn sum_strided(
        &mut self,
        first: Value,
        len: Value,
        dtype: DType,
        flags: MemFlagsData,
        ways: u32,
    ) -> Result<Value> {
        if !(2..=64).contains(&ways) || !ways.is_power_of_two() {
            return Err(internal(format!("strided reduce with {ways} ways")));
        }
        let lanes: u32 = if self.opts.simd && dtype == DType::F32 && ways.is_multiple_of(4) {
            4
        } else {
            1
        };
        let vec_ty = if lanes == 4 { F32X4 } else { F32 };
        let n_acc = (ways / lanes) as usize;
        let neg_zero = self.b.ins().f32const(-0.0);
        let init = if lanes == 4 {
            self.b.ins().splat(F32X4, neg_zero)
        } else {
            neg_zero
        };
        let accs: Vec<_> = (0..n_acc)
            .map(|_| {
                let v = self.b.declare_var(vec_ty);
                self.b.def_var(v, init);
                v
            })
            .collect();
        // Whole rounds.
        let shift = ways.trailing_zeros() as i64;
        let rounds = self.b.ins().ushr_imm_u(len, shift);
        let zero = self.c64(0);
        self.counted_loop(zero, rounds, 1, |l, r| {
            let i0 = l.b.ins().ishl_imm_u(r, shift);
            let round_first = l.offset(first, i0, dtype);
            for (k, acc) in accs.iter().enumerate() {
                let x = if lanes == 4 {
                    l.b.ins().load(F32X4, flags, round_first, (16 * k) as i32)
                } else {
                    let idx = l.c64(k as u64);
                    l.element_at(round_first, idx, dtype, flags)
                };
                let a = l.b.use_var(*acc);
                let s = l.b.ins().fadd(a, x);
                l.b.def_var(*acc, s);
            }
            Ok(())
        })?;
        // Spill the accumulators; acc[j] lives at byte 4 * j.
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            4 * ways,
            4,
        ));
        let slot_addr = self.b.ins().stack_addr(I64, slot, 0);
        for (k, acc) in accs.iter().enumerate() {
            let a = self.b.use_var(*acc);
            let offset = (4 * lanes as usize * k) as i32;
            self.b
                .ins()
                .store(MemFlagsData::trusted(), a, slot_addr, offset);
        }
        // The last partial round: x[i] for i in rounds * ways .. len goes to acc[i - rounds * ways].
        let done = self.b.ins().ishl_imm_u(rounds, shift);
        self.counted_loop(done, len, 1, |l, i| {
            let x = l.element_at(first, i, dtype, flags);
            let j = l.b.ins().isub(i, done);
            let at = l.offset(slot_addr, j, DType::F32);
            let a = l.b.ins().load(F32, MemFlagsData::trusted(), at, 0);
            let s = l.b.ins().fadd(a, x);
            l.b.ins().store(MemFlagsData::trusted(), s, at, 0);
            Ok(())
        })?;
        // The tree: w = ways; while w > 1 { w /= 2; acc[j] = acc[j] + acc[j + w] for j < w }.
        let mut acc: Vec<Value> = (0..ways)
            .map(|j| {
                self.b
                    .ins()
                    .load(F32, MemFlagsData::trusted(), slot_addr, (4 * j) as i32)
            })
            .collect();
        let mut w = ways as usize;
        while w > 1 {
            w /= 2;
            for j in 0..w {
                acc[j] = self.b.ins().fadd(acc[j], acc[j + w]);
            }
        }
        Ok(acc[0])
    }

    /// `max |x|` from `+0.0`. On the bits of `|x|` (sign cleared) the unsigned integer order is
    /// the float order, and every NaN lies above `+inf`: `Propagate` is a plain unsigned max
    /// (any NaN wins), `Ignore` first replaces NaN bits by 0 (which never wins over `+0.0`).
    fn abs_max(
        &mut self,
        first: Value,
        len: Value,
        dtype: DType,
        flags: MemFlagsData,
        nan: NanMode,
    ) -> Result<Value> {
        let acc = self.b.declare_var(I32);
        let init = self.c32(0);
        self.b.def_var(acc, init);
        let zero = self.c64(0);
        self.counted_loop(zero, len, 1, |l, i| {
            let x = l.element_at(first, i, dtype, flags);
            let bits = l.b.ins().bitcast(I32, MemFlagsData::new(), x);
            let mask = l.c32(0x7fff_ffff);
            let mut mag = l.b.ins().band(bits, mask);
            match nan {
                NanMode::Propagate => {}
                NanMode::Ignore => {
                    let inf = l.c32(0x7f80_0000);
                    let is_nan = l.b.ins().icmp(IntCC::UnsignedGreaterThan, mag, inf);
                    let z = l.c32(0);
                    mag = l.b.ins().select(is_nan, z, mag);
                }
            }
            let a = l.b.use_var(acc);
            let m = l.b.ins().umax(a, mag);
            l.b.def_var(acc, m);
            Ok(())
        })?;
        let bits = self.b.use_var(acc);
        Ok(self.b.ins().bitcast(F32, MemFlagsData::new(), bits))
    }
}
