//! Vector loads and stores of the loop vectorizer (see `vectorize.rs`): whole-vector accesses
//! when every lane is in range (and, for loads at `(base + lane) >> c`, one scalar or 2-byte
//! load spread over the lanes), the scalar access lane by lane otherwise.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I16X8, I32, I32X4, I64, I64X2, I8X16};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Type, Value};
use qforge_ir::{DType, Op, Rounding, ScalarType};

use super::lower::{internal, Lowerer};
use super::vectorize::{vec_cast, vec_type, Body, VVal, LANES};
use crate::error::Result;

impl Lowerer<'_> {
    /// The `i8` condition "elements `s ..= s + span` of `buf` exist and `s + span` does not
    /// wrap around `u32`" (without bounds checks only the second part).
    fn span_ok(&mut self, count: Option<Value>, s: Value, span: u32) -> Value {
        let s64 = self.b.ins().uextend(I64, s);
        let last = self.b.ins().iadd_imm_u(s64, span as i64);
        let wrap = self.c64(1 << 32);
        let limit = match count {
            Some(c) => self.b.ins().umin(c, wrap),
            None => wrap,
        };
        self.b.ins().icmp(IntCC::UnsignedLessThan, last, limit)
    }

    /// `if fast_ok { fast } else { slow }`, both yielding a value of type `ty` (or none); `slow`
    /// is laid out as the cold path.
    pub(super) fn two_paths(
        &mut self,
        fast_ok: Value,
        ty: Option<Type>,
        fast: impl FnOnce(&mut Self) -> Result<Option<Value>>,
        slow: impl FnOnce(&mut Self) -> Result<Option<Value>>,
    ) -> Result<Option<Value>> {
        let (fb, sb, join) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        let result = ty.map(|t| self.b.append_block_param(join, t));
        self.b.set_cold_block(sb);
        self.b.ins().brif(fast_ok, fb, &[], sb, &[]);
        self.b.seal_block(fb);
        self.b.seal_block(sb);
        self.b.switch_to_block(fb);
        let v = fast(self)?;
        let args: Vec<_> = v.into_iter().map(Into::into).collect();
        self.b.ins().jump(join, &args);
        self.b.switch_to_block(sb);
        let v = slow(self)?;
        let args: Vec<_> = v.into_iter().map(Into::into).collect();
        self.b.ins().jump(join, &args);
        self.b.seal_block(join);
        self.b.switch_to_block(join);
        Ok(result)
    }

    /// A load at a varying index: one vector load (stride 1) or two and a shuffle (stride 2,
    /// bounds-checked buffers only) of a 32-bit dtype, or one 8-byte (`bf16`) or 4-byte (`u8`,
    /// `i8`) load widened (stride 1), when every lane is in range, otherwise (and for other
    /// dtypes and strides) the scalar load lane by lane.
    pub(super) fn vector_load(
        &mut self,
        buf: qforge_ir::ParamId,
        idx: VVal,
        op: &Op,
        ty: ScalarType,
        local: &Body,
    ) -> Result<VVal> {
        let (base, count, dtype, access) = self.buffer(buf)?;
        let wide = matches!(dtype, DType::F32 | DType::U32 | DType::I32);
        let (s, stride) = match idx {
            VVal::Affine { base, stride } => (base, stride),
            VVal::Vector(_) => {
                let shifted = match op {
                    Op::Load { index, .. } => local.shifted.get(&index.index()).copied(),
                    _ => None,
                };
                match shifted {
                    Some((base, shift)) if shift >= 2 || (shift == 1 && dtype == DType::U8) => {
                        return self.shifted_load(buf, base, shift, op, ty, local)
                    }
                    _ => {}
                }
                return Ok(VVal::Vector(self.lanewise(op, ty, local)?));
            }
            VVal::Uniform(_) => return Ok(VVal::Vector(self.lanewise(op, ty, local)?)),
        };
        let bf16 = dtype == DType::BF16;
        let bytes = matches!(dtype, DType::U8 | DType::I8);
        let span = match stride {
            1 if wide || bf16 || bytes => 3,
            2 if wide && count.is_some() => 7,
            _ => return Ok(VVal::Vector(self.lanewise(op, ty, local)?)),
        };
        let vt = vec_type(ty);
        let flags = self.buffer_mem(access);
        let fast = |l: &mut Self| {
            let s64 = l.b.ins().uextend(I64, s);
            let addr = l.offset(base, s64, dtype);
            if bytes {
                // Four bytes in one 4-byte load, each widened as the scalar load does (`u8`
                // zero-, `i8` sign-extended).
                let word = l.b.ins().load(I32, flags, addr, 0);
                let v = l.b.ins().scalar_to_vector(I32X4, word);
                let b = l.b.ins().bitcast(I8X16, vec_cast(), v);
                return Ok(Some(if dtype == DType::U8 {
                    let h = l.b.ins().uwiden_low(b);
                    l.b.ins().uwiden_low(h)
                } else {
                    let h = l.b.ins().swiden_low(b);
                    l.b.ins().swiden_low(h)
                }));
            }
            if bf16 {
                // Four bf16 in 8 bytes, each widened exactly: its bits in the high half.
                let word = l.b.ins().load(I64, flags, addr, 0);
                let v = l.b.ins().scalar_to_vector(I64X2, word);
                let halves = l.b.ins().bitcast(I16X8, vec_cast(), v);
                let words = l.b.ins().uwiden_low(halves);
                let bits = l.b.ins().ishl_imm_u(words, 16);
                return Ok(Some(l.b.ins().bitcast(vt, vec_cast(), bits)));
            }
            let v0 = l.b.ins().load(vt, flags, addr, 0);
            if stride == 1 {
                return Ok(Some(v0));
            }
            let v1 = l.b.ins().load(vt, flags, addr, 16);
            let a = l.b.ins().bitcast(I8X16, vec_cast(), v0);
            let b = l.b.ins().bitcast(I8X16, vec_cast(), v1);
            let mask: Vec<u8> = [0u8, 2, 4, 6]
                .iter()
                .flat_map(|lane| (0..4).map(move |k| lane * 4 + k))
                .collect();
            let mask = l.b.func.dfg.immediates.push(ConstantData::from(mask));
            let even = l.b.ins().shuffle(a, b, mask);
            Ok(Some(l.b.ins().bitcast(vt, vec_cast(), even)))
        };
        let v = if self.unchecked {
            // Proven in range (and not wrapping) for every iteration.
            fast(self)?
        } else {
            let ok = self.span_ok(count, s, span);
            self.two_paths(ok, Some(vt), fast, |l| Ok(Some(l.lanewise(op, ty, local)?)))?
        };
        Ok(VVal::Vector(
            v.ok_or_else(|| internal("vector load without a value"))?,
        ))
    }

    /// A load at index `(base + lane) >> shift` (see [`Body::shifted`]). When all 4 lanes name
    /// the same element (`base >> shift == (base + 3) >> shift`, which also rules out a wrap of
    /// `base + 3`), one scalar load (with its bounds check) splatted; for a `u8` buffer with
    /// `shift == 1` and an even `base` (lanes `p, p, p + 1, p + 1`, the packed nibbles of 4
    /// consecutive elements) one 2-byte load spread over the lanes when both bytes are in range;
    /// otherwise the scalar load lane by lane. Every lane gets exactly the scalar load's value.
    /// A load proven in range ([`Lowerer::unchecked`]; for the 2-byte load also proven even and
    /// not wrapping) skips the checks.
    fn shifted_load(
        &mut self,
        buf: qforge_ir::ParamId,
        base: Value,
        shift: u32,
        op: &Op,
        ty: ScalarType,
        local: &Body,
    ) -> Result<VVal> {
        let (buf_base, count, dtype, access) = self.buffer(buf)?;
        let vt = vec_type(ty);
        let first = self.b.ins().ushr_imm_u(base, shift as i64);
        let v = if dtype == DType::U8 && shift == 1 {
            let flags = self.buffer_mem(access);
            let fast = |l: &mut Self| {
                let at = l.b.ins().uextend(I64, first);
                let addr = l.offset(buf_base, at, dtype);
                let pair = l.b.ins().uload16(I32, flags, addr, 0);
                // [b0 | b1 << 8, 0, 0, 0] -> bytes -> [b0, b1, 0, 0] -> [b0, b0, b1, b1].
                let v = l.b.ins().scalar_to_vector(I32X4, pair);
                let bytes = l.b.ins().bitcast(I8X16, vec_cast(), v);
                let halves = l.b.ins().uwiden_low(bytes);
                let words = l.b.ins().uwiden_low(halves);
                let w = l.b.ins().bitcast(I8X16, vec_cast(), words);
                let mask: Vec<u8> = [0u8, 0, 1, 1]
                    .iter()
                    .flat_map(|lane| (0..4).map(move |k| lane * 4 + k))
                    .collect();
                let mask = l.b.func.dfg.immediates.push(ConstantData::from(mask));
                let spread = l.b.ins().shuffle(w, w, mask);
                Ok(Some(l.b.ins().bitcast(I32X4, vec_cast(), spread)))
            };
            if self.unchecked {
                // Proven even, in range and not wrapping for every iteration.
                fast(self)?
            } else {
                // base even and base + 3 not wrapping: lanes p, p, p + 1, p + 1.
                let low = self.b.ins().band_imm_u(base, 1);
                let even = self.b.ins().icmp_imm_u(IntCC::Equal, low, 0);
                let no_wrap =
                    self.b
                        .ins()
                        .icmp_imm_u(IntCC::UnsignedLessThan, base, 0xffff_fffd_i64);
                let in_range = self.span_ok(count, first, 1);
                let ok = self.b.ins().band(even, no_wrap);
                let ok = self.b.ins().band(ok, in_range);
                self.two_paths(ok, Some(vt), fast, |l| Ok(Some(l.lanewise(op, ty, local)?)))?
            }
        } else {
            let last = self.b.ins().iadd_imm_u(base, 3);
            let last = self.b.ins().ushr_imm_u(last, shift as i64);
            let same = self.b.ins().icmp(IntCC::Equal, first, last);
            self.two_paths(
                same,
                Some(vt),
                |l| {
                    let s = l.load(buf, first)?;
                    Ok(Some(l.as_vec(VVal::Uniform(s), ty)))
                },
                |l| Ok(Some(l.lanewise(op, ty, local)?)),
            )?
        };
        Ok(VVal::Vector(
            v.ok_or_else(|| internal("shifted load without a value"))?,
        ))
    }

    /// A store of a varying value or at a varying index: one vector store (stride 1, 32-bit
    /// dtype) or one 4-byte store of the low bytes (stride 1, `u8`/`i8`) when every lane is in
    /// range, otherwise the scalar store lane by lane, in lane order.
    pub(super) fn vector_store(
        &mut self,
        buf: qforge_ir::ParamId,
        idx: VVal,
        val: VVal,
        vty: ScalarType,
        rounding: Option<Rounding>,
    ) -> Result<()> {
        let (base, count, dtype, access) = self.buffer(buf)?;
        let lanewise = |l: &mut Self| -> Result<Option<Value>> {
            for j in 0..LANES {
                let i = l.lane(idx, ScalarType::U32, j);
                let v = l.lane(val, vty, j);
                l.store(buf, i, v, rounding)?;
            }
            Ok(None)
        };
        let s = match idx {
            VVal::Affine { base, stride: 1 } => base,
            VVal::Affine { .. } | VVal::Uniform(_) | VVal::Vector(_) => {
                lanewise(self)?;
                return Ok(());
            }
        };
        let width = match dtype {
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 => {
                lanewise(self)?;
                return Ok(());
            }
        };
        let flags = self.buffer_mem(access);
        let ok = self.span_ok(count, s, 3);
        self.two_paths(
            ok,
            None,
            |l| {
                let v = l.as_vec(val, vty);
                let s64 = l.b.ins().uextend(I64, s);
                let addr = l.offset(base, s64, dtype);
                if width == 4 {
                    l.b.ins().store(flags, v, addr, 0);
                } else {
                    // Keep the low bytes, then two saturating narrowings that saturate nothing
                    // (0..=255 fits i16 and u8): the 4 bytes end up in lane 0.
                    let low = l.const_i32x4([0xff; 4]);
                    let v = l.b.ins().band(v, low);
                    let halves = l.b.ins().snarrow(v, v);
                    let bytes = l.b.ins().unarrow(halves, halves);
                    let packed = l.b.ins().bitcast(I32X4, vec_cast(), bytes);
                    let word = l.b.ins().extractlane(packed, 0);
                    l.b.ins().store(flags, word, addr, 0);
                }
                Ok(None)
            },
            lanewise,
        )?;
        Ok(())
    }
}
