//! Buffer loads and stores (little endian, with widening and narrowing), table lookups, and the
//! exact f16/bf16 <-> f32 conversions written with integer operations.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, I32, I64};
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Type, Value};
use qforge_ir::{Access, BinaryOp, DType, Op, ParamId, Rounding, ScalarType, TableId};

use super::lower::{clif_type, internal, Lowerer};
use super::BACKEND;
use crate::error::{Error, Result};

impl Lowerer<'_> {
    /// Flags of a buffer access: little endian, never trapping (the index is in range: checked,
    /// or the kernel's responsibility), possibly unaligned, and immutable for `Read` buffers.
    pub(super) fn buffer_mem(&self, access: Access) -> MemFlagsData {
        let flags = MemFlagsData::new()
            .with_notrap()
            .with_endianness(Endianness::Little);
        if access == Access::Read {
            flags.with_readonly()
        } else {
            flags
        }
    }

    /// `base + index * size_of(dtype)` on 64-bit addresses.
    pub(super) fn offset(&mut self, base: Value, index: Value, dtype: DType) -> Value {
        let bytes = match dtype.size_bytes() {
            1 => index,
            size => self.b.ins().imul_imm_u(index, size as i64),
        };
        self.b.ins().iadd(base, bytes)
    }

    /// Emits the access `emit(address)` to element `index` (`i32`) of buffer `buf`. With bounds
    /// checks, an index at or past the element count skips the access, reports the work item,
    /// and yields zero (see [`Lowerer::guarded`]).
    fn access(
        &mut self,
        buf: ParamId,
        index: Value,
        ty: Option<Type>,
        emit: impl FnOnce(&mut Self, Value) -> Option<Value>,
    ) -> Result<Option<Value>> {
        let (base, count, dtype, _) = self.buffer(buf)?;
        let index = self.b.ins().uextend(I64, index);
        let addr = self.offset(base, index, dtype);
        match count {
            Some(count) => {
                let oob = self
                    .b
                    .ins()
                    .icmp(IntCC::UnsignedGreaterThanOrEqual, index, count);
                self.guarded(oob, ty, |l| emit(l, addr))
            }
            None => Ok(emit(self, addr)),
        }
    }

    /// `buf[index]`, widened to the value type.
    pub(super) fn load(&mut self, buf: ParamId, index: Value) -> Result<Value> {
        let (_, _, dtype, access) = self.buffer(buf)?;
        let flags = self.buffer_mem(access);
        let ty = clif_type(dtype.value_type());
        self.access(buf, index, Some(ty), |l, addr| {
            Some(l.load_element(dtype, addr, flags))
        })?
        .ok_or_else(|| internal("load without a value"))
    }

    /// Loads one element of `dtype` at `addr` and widens it: floats exactly to `f32`, `u8` by
    /// zero extension, `i8` by sign extension.
    pub(super) fn load_element(&mut self, dtype: DType, addr: Value, flags: MemFlagsData) -> Value {
        match dtype {
            DType::F32 => self.b.ins().load(F32, flags, addr, 0),
            DType::I32 | DType::U32 => self.b.ins().load(I32, flags, addr, 0),
            DType::U8 => self.b.ins().uload8(I32, flags, addr, 0),
            DType::I8 => self.b.ins().sload8(I32, flags, addr, 0),
            DType::F16 => {
                let h = self.b.ins().uload16(I32, flags, addr, 0);
                self.f16_to_f32(h)
            }
            DType::BF16 => {
                let h = self.b.ins().uload16(I32, flags, addr, 0);
                let bits = self.b.ins().ishl_imm_u(h, 16);
                self.b.ins().bitcast(F32, MemFlagsData::new(), bits)
            }
        }
    }

    /// `buf[index] = value`, narrowed to the dtype (`u8`/`i8` keep the low 8 bits, f16/bf16
    /// round as named).
    pub(super) fn store(
        &mut self,
        buf: ParamId,
        index: Value,
        value: Value,
        rounding: Option<Rounding>,
    ) -> Result<()> {
        let (_, _, dtype, access) = self.buffer(buf)?;
        let flags = self.buffer_mem(access);
        let narrow = |op: &str, r: Rounding| Error::Unsupported {
            backend: BACKEND,
            op: format!("{op} store with rounding {}", r.name()),
        };
        // The bytes to write: all 4, the low byte, or the low 2 bytes of `bits`.
        let (bits, width) = match (dtype, rounding) {
            (DType::F32 | DType::I32 | DType::U32, None) => (value, 4),
            (DType::U8 | DType::I8, None) => (value, 1),
            (DType::F16, Some(Rounding::NearestEven)) => (self.f32_to_f16_rne(value), 2),
            (DType::BF16, Some(Rounding::NearestEven)) => (self.f32_to_bf16_rne(value), 2),
            (DType::F16, Some(r)) => return Err(narrow("f16", r)),
            (DType::BF16, Some(r)) => return Err(narrow("bf16", r)),
            (DType::F16 | DType::BF16, None) => {
                return Err(internal("narrow float store without rounding"))
            }
            (DType::F32 | DType::I32 | DType::U32 | DType::U8 | DType::I8, Some(_)) => {
                return Err(internal("rounding on a store that does not round"))
            }
        };
        self.access(buf, index, None, |l, addr| {
            match width {
                1 => l.b.ins().istore8(flags, bits, addr, 0),
                2 => l.b.ins().istore16(flags, bits, addr, 0),
                _ => l.b.ins().store(flags, bits, addr, 0),
            };
            None
        })?;
        Ok(())
    }

    /// `table[min(index, len - 1)]`; the clamp is left out when [`Lowerer::upper_bound`] proves
    /// the index in range (e.g. a nibble `byte >> 4` or `byte & 15` of a `u8` load, or a
    /// search position built from constants by adds and selects).
    pub(super) fn lookup(&mut self, table: TableId, index: qforge_ir::Value) -> Result<Value> {
        let t = self
            .k
            .tables
            .try_get(table)
            .ok_or_else(|| internal("missing table"))?;
        let last = u32::try_from(t.data.len().saturating_sub(1)).unwrap_or(u32::MAX);
        let ty = match t.ty {
            ScalarType::F32 => F32,
            ScalarType::U32 | ScalarType::I32 => I32,
            ScalarType::Bool => return Err(internal("bool table")),
        };
        let base = *self
            .tables
            .get(table.index())
            .ok_or_else(|| internal("missing table pointer"))?;
        let bound = self.upper_bound(index);
        let mut index = self.val(index)?;
        if bound > last {
            let last = self.c32(last);
            index = self.b.ins().umin(index, last);
        }
        let index = self.b.ins().uextend(I64, index);
        let addr = self.offset(base, index, DType::U32);
        Ok(self.b.ins().load(ty, Self::const_mem(), addr, 0))
    }

    /// The upper bound of the `u32` value `v` recorded when it was lowered (see
    /// [`Lowerer::bound_of`]); `u32::MAX` when nothing smaller is known.
    pub(super) fn upper_bound(&self, v: qforge_ir::Value) -> u32 {
        self.bounds.get(v.index()).copied().unwrap_or(u32::MAX)
    }

    /// An upper bound of the value defined by `def`, from the bounds of its operands (lowered
    /// before it): constants, `u8` loads, `and`, `min`, `add` (without overflow), `rem` and
    /// `shr` by constants, selects and `u32` table lookups; `u32::MAX` for anything else and
    /// for values that are not `u32`.
    pub(super) fn bound_of(&self, def: &qforge_ir::ValueDef) -> u32 {
        if def.ty != ScalarType::U32 {
            return u32::MAX;
        }
        let ub = |x: &qforge_ir::Value| self.upper_bound(*x);
        let constant = |x: &qforge_ir::Value| match self.k.values.try_get(*x).map(|d| &d.op) {
            Some(Op::Const(c)) => Some(c.bits()),
            _ => None,
        };
        match &def.op {
            Op::Const(c) => c.bits(),
            Op::Load { buf, .. } => match self.buffer(*buf) {
                Ok((_, _, DType::U8, _)) => u8::MAX as u32,
                _ => u32::MAX,
            },
            Op::Binary(BinaryOp::And | BinaryOp::Min, a, b) => ub(a).min(ub(b)),
            // A sum of bounds that fits in u32 bounds a sum that cannot wrap.
            Op::Binary(BinaryOp::Add, a, b) => ub(a).saturating_add(ub(b)),
            Op::Binary(BinaryOp::Shr, a, b) => match constant(b) {
                Some(s) => ub(a) >> (s & 31),
                None => ub(a),
            },
            // x % c < c for c > 0, and x % 0 = 0.
            Op::Binary(BinaryOp::Rem, a, b) => match constant(b) {
                Some(c) => ub(a).min(c.saturating_sub(1)),
                None => ub(a),
            },
            Op::Select {
                if_true, if_false, ..
            } => ub(if_true).max(ub(if_false)),
            Op::Lookup { table, .. } => match self.k.tables.try_get(*table) {
                Some(t) if t.ty == ScalarType::U32 => t.data.iter().copied().max().unwrap_or(0),
                _ => u32::MAX,
            },
            Op::SearchSorted { table, .. } => self
                .k
                .tables
                .try_get(*table)
                .map_or(u32::MAX, |t| t.data.len() as u32),
            Op::WorkItem
            | Op::LoopIndex
            | Op::Param(_)
            | Op::ReadVar(_)
            | Op::Unary(..)
            | Op::Binary(..)
            | Op::Fma(..)
            | Op::Cmp(..)
            | Op::FloatToInt { .. }
            | Op::IntToFloat { .. }
            | Op::Bitcast { .. }
            | Op::Reduce { .. } => u32::MAX,
        }
    }

    /// Exact f16 (bits in the low half of an `i32`) to `f32`: rebias the exponent; infinities
    /// and NaNs get the all-ones exponent (NaN payload kept, so NaN stays NaN); zeros and
    /// subnormals are renormalized by an exact float subtraction of 2^-14.
    pub(super) fn f16_to_f32(&mut self, h: Value) -> Value {
        let mag_mask = self.c32(0x7fff);
        let mag = self.b.ins().band(h, mag_mask);
        let shifted = self.b.ins().ishl_imm_u(mag, 13);
        let exp_mask = self.c32(0x0f80_0000);
        let exp = self.b.ins().band(shifted, exp_mask);
        let rebias = self.c32(112 << 23);
        let normal = self.b.ins().iadd(shifted, rebias);
        // Inf/NaN: exponent 31 -> 255.
        let special = self.b.ins().icmp(IntCC::Equal, exp, exp_mask);
        let infnan = self.b.ins().iadd(normal, rebias);
        // Zero/subnormal: m * 2^-24 = (2^-14 + m * 2^-24) - 2^-14, both exact.
        let zero = self.c32(0);
        let tiny = self.b.ins().icmp(IntCC::Equal, exp, zero);
        let one_exp = self.c32(1 << 23);
        let biased = self.b.ins().iadd(normal, one_exp);
        let biased = self.b.ins().bitcast(F32, MemFlagsData::new(), biased);
        let magic = self.b.ins().f32const(f32::from_bits(113 << 23));
        let sub = self.b.ins().fsub(biased, magic);
        let sub = self.b.ins().bitcast(I32, MemFlagsData::new(), sub);
        let r = self.b.ins().select(tiny, sub, normal);
        let r = self.b.ins().select(special, infnan, r);
        let sign_mask = self.c32(0x8000);
        let sign = self.b.ins().band(h, sign_mask);
        let sign = self.b.ins().ishl_imm_u(sign, 16);
        let r = self.b.ins().bor(r, sign);
        self.b.ins().bitcast(F32, MemFlagsData::new(), r)
    }

    /// `f32` to f16 bits (in an `i32`), round to nearest even: NaN gives a quiet NaN, values
    /// at or above 65520 in magnitude give infinity, results below 2^-14 are rounded by an
    /// exact-then-rounded float addition of 0.5 (whose ulp is the f16 subnormal step), normal
    /// results by adding `0xfff + lsb` before dropping 13 mantissa bits.
    pub(super) fn f32_to_f16_rne(&mut self, v: Value) -> Value {
        let x = self.b.ins().bitcast(I32, MemFlagsData::new(), v);
        let sign_mask = self.c32(0x8000_0000);
        let sign = self.b.ins().band(x, sign_mask);
        let a = self.b.ins().bxor(x, sign);
        // |v| >= 2^16 (or inf/NaN): all-ones exponent.
        let big_limit = self.c32(143 << 23);
        let big = self
            .b
            .ins()
            .icmp(IntCC::UnsignedGreaterThanOrEqual, a, big_limit);
        let inf_bits = self.c32(0x7f80_0000);
        let is_nan = self.b.ins().icmp(IntCC::UnsignedGreaterThan, a, inf_bits);
        let (qnan, inf) = (self.c32(0x7e00), self.c32(0x7c00));
        let big_r = self.b.ins().select(is_nan, qnan, inf);
        // |v| < 2^-14: subnormal or zero result.
        let tiny_limit = self.c32(113 << 23);
        let tiny = self.b.ins().icmp(IntCC::UnsignedLessThan, a, tiny_limit);
        let af = self.b.ins().bitcast(F32, MemFlagsData::new(), a);
        let half = self.b.ins().f32const(0.5);
        let sum = self.b.ins().fadd(af, half);
        let sum = self.b.ins().bitcast(I32, MemFlagsData::new(), sum);
        let half_bits = self.c32(0x3f00_0000);
        let tiny_r = self.b.ins().isub(sum, half_bits);
        // Normal result: rebias by -112 exponents and round on bit 13.
        let lsb = self.b.ins().ushr_imm_u(a, 13);
        let one = self.c32(1);
        let lsb = self.b.ins().band(lsb, one);
        let bias = self.c32(((15u32.wrapping_sub(127)) << 23).wrapping_add(0xfff));
        let n = self.b.ins().iadd(a, bias);
        let n = self.b.ins().iadd(n, lsb);
        let normal_r = self.b.ins().ushr_imm_u(n, 13);
        let r = self.b.ins().select(tiny, tiny_r, normal_r);
        let r = self.b.ins().select(big, big_r, r);
        let sign = self.b.ins().ushr_imm_u(sign, 16);
        self.b.ins().bor(r, sign)
    }

    /// `f32` to bf16 bits (in an `i32`), round to nearest even; NaN stays NaN (quiet bit set),
    /// overflow carries into the exponent and gives infinity.
    pub(super) fn f32_to_bf16_rne(&mut self, v: Value) -> Value {
        let x = self.b.ins().bitcast(I32, MemFlagsData::new(), v);
        let abs_mask = self.c32(0x7fff_ffff);
        let a = self.b.ins().band(x, abs_mask);
        let inf_bits = self.c32(0x7f80_0000);
        let is_nan = self.b.ins().icmp(IntCC::UnsignedGreaterThan, a, inf_bits);
        let hi = self.b.ins().ushr_imm_u(x, 16);
        let one = self.c32(1);
        let lsb = self.b.ins().band(hi, one);
        let round = self.c32(0x7fff);
        let r = self.b.ins().iadd(x, round);
        let r = self.b.ins().iadd(r, lsb);
        let r = self.b.ins().ushr_imm_u(r, 16);
        let quiet = self.c32(0x40);
        let nan_r = self.b.ins().bor(hi, quiet);
        self.b.ins().select(is_nan, nan_r, r)
    }
}
