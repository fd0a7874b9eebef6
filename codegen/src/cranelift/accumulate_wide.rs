//! The 16-element iteration of the `Stmt::Accumulate` vector loop (see `accumulate.rs`), used in
//! the loop whose loads are proven in range whenever the number of partials divides 16: the
//! `f32x4` partials stay in variables across the loop (group `g` of an iteration always updates
//! the same ones), and when the body decodes packed 4-bit codes (the fused 4-bit matmuls) the
//! costly per-element part, a table lookup at a nibble, is done for 16 consecutive elements at
//! once with byte shuffles, and loads at a block index are done once per 16 elements.
//!
//! The body is recognised by two shapes of `let`s, both at an element index `e` that is
//! affine of stride 1 in the loop index:
//! - a nibble lookup `table[(packed[e >> 1] >> (((e & 1) ^ 1) << 2)) & 15]` (the high nibble
//!   of byte `e / 2` for an even `e`, the low one for an odd `e`: bitsandbytes' packing) of a
//!   table of at most 16 32-bit entries, whose packed-byte load the range proof covers
//!   (`accumulate_range.rs`: in range for every vector iteration, and `e - i` even);
//! - a load at `e >> s` with `s >= 4` (a block's absmax, quantized absmax or nested absmax;
//!   a chain of constant right shifts counts as one).
//!
//! An iteration covers elements `i0 .. i0 + 16` (`i0` a multiple of 16, so the first element
//! index `e0 = (e - i) + i0` is even and the 16 nibbles are the 8 bytes `packed[e0/2 ..
//! e0/2 + 8]`, high nibble first). The codes are found with one 8-byte load, a nibble split
//! and interleave, then one byte shuffle per byte of the table entries (`table[c]` has its
//! byte `b` at position `c` of shuffle source `b`) and two rounds of interleaving that put the
//! four bytes of each entry together: four vectors of 4 entries, exactly the values of the
//! scalar lookups (the index is below 16, so the lookup's clamp never applies; entries past
//! the table's end repeat its last entry, as the clamp would). When every block load names the
//! same block for all 16 elements (`e0 >> s == (e0 + 15) >> s`), its value is loaded once and
//! used as a uniform; otherwise (a block boundary inside the 16) the iteration lowers those
//! loads per group of 4 as usual. The rest of the body is lowered for each group of 4 as in
//! `accumulate.rs`, on demand from the accumulator factors, with the decoded values in place.
//!
//! Loads that no factor needs are lowered too unless proven in range, so that a failed bounds
//! check still reports. Every value is the same as the 4-element iteration computes, and every
//! group of 4 updates
//! the same partials (`(i0 + 4g) % ways`), so the bits equal those of the scalar loop.

use std::collections::HashSet;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32X4, I16X8, I64, I64X2, I8X16};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value};
use cranelift_frontend::Variable;
use qforge_ir::{BinaryOp, DType, Op, ParamId, ScalarType, Stmt, TableId, Value as IrValue};

use super::accumulate::may_fault;
use super::lower::{internal, Lowerer};
use super::vectorize::{vec_cast, vec_type, Body, VVal, LANES};
use crate::error::Result;

/// Elements of one wide iteration.
pub(super) const WIDE: u32 = 16;

/// A lookup of a packed 4-bit code (see the module docs).
struct NibbleLookup {
    /// The lookup's value.
    value: IrValue,
    table: TableId,
    packed: ParamId,
    /// The element index `e`.
    e: IrValue,
}

/// A load at `e >> shift`, `shift >= 4`.
struct BlockLoad {
    value: IrValue,
    buf: ParamId,
    e: IrValue,
    shift: u32,
    /// Proven in range for every vector iteration (loaded without a check).
    trusted: bool,
}

/// What the wide iteration decodes at once.
pub(super) struct WidePlan {
    nibbles: Vec<NibbleLookup>,
    blocks: Vec<BlockLoad>,
    /// The values defined by the body's `let`s.
    defined: HashSet<usize>,
}

/// The `f32x4` partials of the accumulators, kept in variables during the wide loop: vector
/// `q` of accumulator `t` is `vars[t * (ways / 4) + q]`.
pub(super) struct Partials {
    vars: Vec<Variable>,
    per_acc: usize,
}

/// Bytes of an interleave of the low (`high = false`) or high halves of two vectors in lanes
/// of `width` bytes (`punpckl*` / `punpckh*`).
fn interleave(width: u8, high: bool) -> [u8; 16] {
    let mut m = [0u8; 16];
    let start = if high { 8 } else { 0 };
    for (k, out) in m.chunks_mut(2 * width as usize).enumerate() {
        let lane = start + k as u8 * width;
        for b in 0..width {
            out[b as usize] = lane + b;
            out[(width + b) as usize] = 16 + lane + b;
        }
    }
    m
}

impl Lowerer<'_> {
    /// `Some(x)` when `v` is the `u32` op `x op c` or `c op x` (commutative ops only for the
    /// second form) with `c` the constant `k`.
    fn with_const(&self, v: IrValue, op: BinaryOp, k: u32) -> Option<IrValue> {
        let def = self.k.values.try_get(v)?;
        let Op::Binary(o, a, b) = def.op else {
            return None;
        };
        if o != op || def.ty != ScalarType::U32 {
            return None;
        }
        if self.const_of(b) == Some(k) {
            return Some(a);
        }
        let commutes = matches!(op, BinaryOp::And | BinaryOp::Xor);
        (commutes && self.const_of(a) == Some(k)).then_some(b)
    }

    /// The nibble lookup `v` stands for, if it has that shape (see the module docs).
    fn nibble_lookup(&self, v: IrValue, trusted: &HashSet<usize>) -> Option<NibbleLookup> {
        let Op::Lookup { table, index } = self.k.values.try_get(v)?.op else {
            return None;
        };
        let t = self.k.tables.try_get(table)?;
        if t.data.len() > 16 {
            return None;
        }
        let shifted = self.with_const(index, BinaryOp::And, 15)?;
        let Op::Binary(BinaryOp::Shr, byte, amount) = self.k.values.try_get(shifted)?.op else {
            return None;
        };
        let Op::Load { buf, index: at } = self.k.values.try_get(byte)?.op else {
            return None;
        };
        let e = self.with_const(at, BinaryOp::Shr, 1)?;
        let flip = self.with_const(amount, BinaryOp::Shl, 2)?;
        let parity = self.with_const(flip, BinaryOp::Xor, 1)?;
        let e2 = self.with_const(parity, BinaryOp::And, 1)?;
        let (_, _, dtype, _) = self.buffer(buf).ok()?;
        (e2 == e && dtype == DType::U8 && trusted.contains(&byte.index())).then_some(NibbleLookup {
            value: v,
            table,
            packed: buf,
            e,
        })
    }

    /// The block load `v` stands for, if it has that shape (see the module docs): a load at
    /// `e >> s1 >> s2 ...` (logical shifts by constants, `u32`), which is `e >> (s1 + s2 ...)`
    /// while the total stays below 32.
    fn block_load(&self, v: IrValue, trusted: &HashSet<usize>) -> Option<BlockLoad> {
        let Op::Load { buf, index } = self.k.values.try_get(v)?.op else {
            return None;
        };
        let (mut e, mut shift) = (index, 0u32);
        while let Some(inner) = self.k.values.try_get(e).and_then(|d| match d.op {
            Op::Binary(BinaryOp::Shr, x, s) if d.ty == ScalarType::U32 => {
                Some((x, self.const_of(s)?))
            }
            _ => None,
        }) {
            if shift + inner.1 >= 32 {
                return None;
            }
            (e, shift) = (inner.0, shift + inner.1);
        }
        (shift >= 4).then_some(BlockLoad {
            value: v,
            buf,
            e,
            shift,
            trusted: trusted.contains(&v.index()),
        })
    }

    /// The wide plan of `body` with the loads `trusted` proven in range: its nibble lookups and
    /// block loads (possibly none).
    pub(super) fn wide_plan(&self, body: &[Stmt], trusted: &HashSet<usize>) -> WidePlan {
        let lets: Vec<IrValue> = body
            .iter()
            .filter_map(|s| match s {
                Stmt::Let(v) => Some(*v),
                _ => None,
            })
            .collect();
        let nibbles: Vec<_> = lets
            .iter()
            .filter_map(|v| self.nibble_lookup(*v, trusted))
            .collect();
        let blocks = lets
            .iter()
            .filter_map(|v| self.block_load(*v, trusted))
            .collect();
        WidePlan {
            nibbles,
            blocks,
            defined: lets.iter().map(|v| v.index()).collect(),
        }
    }

    /// Lowers body value `v` and the body values it depends on into `locals[g]`, unless
    /// already there. A nibble lookup still `pending` is decoded instead, for all four groups
    /// at once (its values go into every `locals[j]`).
    fn demand(
        &mut self,
        v: IrValue,
        locals: &mut [Body],
        g: usize,
        defined: &HashSet<usize>,
        pending: &mut Vec<(&NibbleLookup, Value)>,
    ) -> Result<()> {
        if locals[g].has(v) || !defined.contains(&v.index()) {
            return Ok(());
        }
        if let Some(at) = pending.iter().position(|(n, _)| n.value == v) {
            let (n, e0) = pending.swap_remove(at);
            let codes = self.nibble_codes(n, e0)?;
            for (local, c) in locals.iter_mut().zip(codes) {
                local.insert(v, VVal::Vector(c));
            }
            return Ok(());
        }
        let operands = self
            .k
            .values
            .try_get(v)
            .ok_or_else(|| internal("demand of a missing value"))?
            .op
            .operands();
        for o in operands {
            self.demand(o, locals, g, defined, pending)?;
        }
        self.vector_stmt(&Stmt::Let(v), &mut locals[g])
    }

    /// Variables holding the `f32x4` partials of `n_acc` accumulators of `ways` partials each,
    /// loaded from the slot.
    pub(super) fn load_partials(&mut self, slot: Value, ways: u32, n_acc: usize) -> Partials {
        let per_acc = (ways / 4) as usize;
        let vars = (0..n_acc * per_acc)
            .map(|k| {
                let var = self.b.declare_var(F32X4);
                let p =
                    self.b
                        .ins()
                        .load(F32X4, super::accumulate::slot_mem(), slot, 16 * k as i32);
                self.b.def_var(var, p);
                var
            })
            .collect();
        Partials { vars, per_acc }
    }

    /// Stores the partials back into the slot.
    pub(super) fn store_partials(&mut self, slot: Value, partials: &Partials) {
        for (k, var) in partials.vars.iter().enumerate() {
            let p = self.b.use_var(*var);
            self.b
                .ins()
                .store(super::accumulate::slot_mem(), p, slot, 16 * k as i32);
        }
    }

    /// The loop over the wide iterations below `wide_end` (a multiple of 16), `ways` dividing
    /// 16. When the element index of every block load is a multiple of 16 at `i = 0` (then at
    /// every `i0`: no 16 elements straddle a block, whose sizes are powers of two of at least 16),
    /// a loop that loads every block value once per iteration without a check; otherwise a
    /// loop that checks per iteration.
    pub(super) fn wide_loop(
        &mut self,
        lp: &super::accumulate::Groups<'_>,
        plan: &WidePlan,
        wide_end: Value,
        trusted: &HashSet<usize>,
    ) -> Result<()> {
        let partials = self.load_partials(lp.slot, lp.ways, lp.accs.len());
        let zero = self.c32(0);
        let mut probe = [Body::at_index(lp.index, zero, trusted)];
        let mut aligned: Option<Value> = None;
        for bl in &plan.blocks {
            self.demand(bl.e, &mut probe, 0, &plan.defined, &mut Vec::new())?;
            if let Some(VVal::Affine { base, stride: 1 }) = probe[0].get(bl.e) {
                let low = self.b.ins().band_imm_u(base, (WIDE - 1) as i64);
                let ok = self.b.ins().icmp_imm_u(IntCC::Equal, low, 0);
                aligned = Some(match aligned {
                    Some(a) => self.b.ins().band(a, ok),
                    None => ok,
                });
            }
        }
        let run = |l: &mut Self, always: bool| {
            l.counted_loop(zero, wide_end, WIDE, |l, i0| {
                l.wide_iteration(lp, plan, &partials, i0, trusted, always)
            })
        };
        match aligned {
            None => run(self, false)?,
            Some(aligned) => {
                let (fast, slow, join) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                self.b.ins().brif(aligned, fast, &[], slow, &[]);
                self.b.seal_block(fast);
                self.b.seal_block(slow);
                self.b.switch_to_block(fast);
                run(self, true)?;
                self.b.ins().jump(join, &[]);
                self.b.switch_to_block(slow);
                run(self, false)?;
                self.b.ins().jump(join, &[]);
                self.b.seal_block(join);
                self.b.switch_to_block(join);
            }
        }
        self.store_partials(lp.slot, &partials);
        Ok(())
    }

    /// Elements `i0 .. i0 + 16` (see the module docs); `aligned`: the 16 elements are known to
    /// lie in one block of every block load.
    fn wide_iteration(
        &mut self,
        lp: &super::accumulate::Groups<'_>,
        plan: &WidePlan,
        partials: &Partials,
        i0: Value,
        trusted: &HashSet<usize>,
        aligned: bool,
    ) -> Result<()> {
        // Element indices at lane 0.
        let mut probe = [Body::at_index(lp.index, i0, trusted)];
        let mut codes = Vec::new();
        for n in &plan.nibbles {
            self.demand(n.e, &mut probe, 0, &plan.defined, &mut Vec::new())?;
            if let Some(VVal::Affine { base, stride: 1 }) = probe[0].get(n.e) {
                codes.push((n, base));
            }
        }
        let mut blocks = Vec::new();
        let mut same: Option<Value> = None;
        for bl in &plan.blocks {
            self.demand(bl.e, &mut probe, 0, &plan.defined, &mut Vec::new())?;
            if let Some(VVal::Affine { base, stride: 1 }) = probe[0].get(bl.e) {
                let first = self.b.ins().ushr_imm_u(base, bl.shift as i64);
                if !aligned {
                    let last = self.b.ins().iadd_imm_u(base, (WIDE - 1) as i64);
                    let last = self.b.ins().ushr_imm_u(last, bl.shift as i64);
                    let eq = self.b.ins().icmp(IntCC::Equal, first, last);
                    same = Some(match same {
                        Some(s) => self.b.ins().band(s, eq),
                        None => eq,
                    });
                }
                blocks.push((bl, first));
            }
        }
        if aligned {
            let seeds = self.block_values(&blocks)?;
            return self.wide_groups(lp, plan, partials, i0, trusted, &codes, &seeds);
        }
        let Some(same) = same else {
            return self.wide_groups(lp, plan, partials, i0, trusted, &codes, &[]);
        };
        let (uniform, split, join) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        self.b.set_cold_block(split);
        self.b.ins().brif(same, uniform, &[], split, &[]);
        self.b.seal_block(uniform);
        self.b.seal_block(split);
        self.b.switch_to_block(uniform);
        let seeds = self.block_values(&blocks)?;
        self.wide_groups(lp, plan, partials, i0, trusted, &codes, &seeds)?;
        self.b.ins().jump(join, &[]);
        self.b.switch_to_block(split);
        self.wide_groups(lp, plan, partials, i0, trusted, &codes, &[])?;
        self.b.ins().jump(join, &[]);
        self.b.seal_block(join);
        self.b.switch_to_block(join);
        Ok(())
    }

    /// The value of each block load at its block `first`: one scalar load, without a check
    /// when proven in range, else with the check (every lane would load the same element, so
    /// an out-of-range block reports and yields exactly what each lane would).
    fn block_values(&mut self, blocks: &[(&BlockLoad, Value)]) -> Result<Vec<(IrValue, Value)>> {
        let saved = self.unchecked;
        let mut out = Vec::with_capacity(blocks.len());
        for (bl, first) in blocks {
            self.unchecked = saved || bl.trusted;
            let x = self.load(bl.buf, *first);
            self.unchecked = saved;
            out.push((bl.value, x?));
        }
        Ok(out)
    }

    /// The four groups of 4 elements of a wide iteration, with the block loads `uniform` over
    /// all 16 elements in place and the nibble lookups `codes` (at first element index `e0`)
    /// decoded when first needed. Accumulator by accumulator, each over its four groups, so
    /// that a decoded row of codes is used right away; every partial still receives its
    /// elements in increasing order.
    #[allow(clippy::too_many_arguments)]
    fn wide_groups(
        &mut self,
        lp: &super::accumulate::Groups<'_>,
        plan: &WidePlan,
        partials: &Partials,
        i0: Value,
        trusted: &HashSet<usize>,
        codes: &[(&NibbleLookup, Value)],
        uniform: &[(IrValue, Value)],
    ) -> Result<()> {
        let groups = (WIDE / LANES as u32) as usize;
        let mut locals = Vec::with_capacity(groups);
        for g in 0..groups {
            let ig = self.b.ins().iadd_imm_u(i0, (LANES as usize * g) as i64);
            let mut local = Body::at_index(lp.index, ig, trusted);
            for (v, x) in uniform {
                // Scalar ops on uniform operands read the scalar lowering.
                self.set_value(*v, *x);
                local.insert(*v, VVal::Uniform(*x));
            }
            locals.push(local);
        }
        let mut pending = codes.to_vec();
        // A load that no factor needs still runs unless proven in range: its failed bounds
        // check reports the work item, as the interpreter's does.
        let mut needed: HashSet<usize> = lp
            .accs
            .iter()
            .flat_map(|a| [a.a.index(), a.b.index()])
            .collect();
        for stmt in lp.body.iter().rev() {
            if let Stmt::Let(v) = stmt {
                if needed.contains(&v.index()) {
                    let ops = self.k.values.try_get(*v).map(|d| d.op.operands());
                    needed.extend(ops.unwrap_or_default().iter().map(|o| o.index()));
                }
            }
        }
        for stmt in lp.body {
            let Stmt::Let(v) = stmt else { continue };
            let faults = self.k.values.try_get(*v).is_some_and(|d| may_fault(&d.op));
            if faults && !needed.contains(&v.index()) && !trusted.contains(&v.index()) {
                for g in 0..groups {
                    self.demand(*v, &mut locals, g, &plan.defined, &mut pending)?;
                }
            }
        }
        for (t, acc) in lp.accs.iter().enumerate() {
            for g in 0..groups {
                self.demand(acc.a, &mut locals, g, &plan.defined, &mut pending)?;
                self.demand(acc.b, &mut locals, g, &plan.defined, &mut pending)?;
                let (a, b) = self.factors(&locals[g], acc)?;
                // Group g updates partials (i0 + 4g) % ways = 4g % ways (ways divides 16).
                let q = (LANES as usize * g) % lp.ways as usize / 4;
                let var = partials.vars[t * partials.per_acc + q];
                let p = self.b.use_var(var);
                let p = self.b.ins().fma(a, b, p);
                self.b.def_var(var, p);
            }
        }
        Ok(())
    }

    /// The 16 values `table[nibble(e0 + j)]`, `j = 0..16`, as four vectors of 4 (`e0` even,
    /// the bytes proven in range; see the module docs).
    fn nibble_codes(&mut self, n: &NibbleLookup, e0: Value) -> Result<[Value; 4]> {
        let saved = self.unchecked;
        self.unchecked = true;
        let buffer = self.buffer(n.packed);
        self.unchecked = saved;
        let (base, _, dtype, access) = buffer?;
        let flags = self.buffer_mem(access);
        let at = self.b.ins().ushr_imm_u(e0, 1);
        let at = self.b.ins().uextend(I64, at);
        let addr = self.offset(base, at, dtype);
        let word = self.b.ins().load(I64, flags, addr, 0);
        let v = self.b.ins().scalar_to_vector(I64X2, word);
        let bytes = self.b.ins().bitcast(I8X16, vec_cast(), v);
        let low_mask = self.splat_bytes(0x0f);
        let lo = self.b.ins().band(bytes, low_mask);
        let halves = self.b.ins().bitcast(I16X8, vec_cast(), bytes);
        let hi = self.b.ins().ushr_imm_u(halves, 4);
        let hi = self.b.ins().bitcast(I8X16, vec_cast(), hi);
        let hi = self.b.ins().band(hi, low_mask);
        // [hi0, lo0, hi1, lo1, ...]: element 2k is the high nibble of byte k.
        let nibbles = self.shuffle(hi, lo, interleave(1, false));
        let t = self
            .k
            .tables
            .try_get(n.table)
            .ok_or_else(|| internal("missing table"))?;
        let (data, ty) = (t.data.clone(), t.ty);
        let last = data.len().saturating_sub(1);
        let mut planes = Vec::with_capacity(4);
        for b in 0..4 {
            let src: Vec<u8> = (0..16)
                .map(|c| (data[c.min(last)] >> (8 * b)) as u8)
                .collect();
            let c = self.b.func.dfg.constants.insert(ConstantData::from(src));
            let src = self.b.ins().vconst(I8X16, c);
            planes.push(if self.opts.x86_pshufb {
                self.b.ins().x86_pshufb(src, nibbles)
            } else {
                self.b.ins().swizzle(src, nibbles)
            });
        }
        let b01l = self.shuffle(planes[0], planes[1], interleave(1, false));
        let b01h = self.shuffle(planes[0], planes[1], interleave(1, true));
        let b23l = self.shuffle(planes[2], planes[3], interleave(1, false));
        let b23h = self.shuffle(planes[2], planes[3], interleave(1, true));
        let out = [
            self.shuffle(b01l, b23l, interleave(2, false)),
            self.shuffle(b01l, b23l, interleave(2, true)),
            self.shuffle(b01h, b23h, interleave(2, false)),
            self.shuffle(b01h, b23h, interleave(2, true)),
        ];
        Ok(out.map(|v| self.b.ins().bitcast(vec_type(ty), vec_cast(), v)))
    }

    /// The `i8x16` with every byte `x`.
    fn splat_bytes(&mut self, x: u8) -> Value {
        let c = self
            .b
            .func
            .dfg
            .constants
            .insert(ConstantData::from(vec![x; 16]));
        self.b.ins().vconst(I8X16, c)
    }

    /// The byte shuffle of `a` (indices 0..16) and `b` (16..32).
    fn shuffle(&mut self, a: Value, b: Value, mask: [u8; 16]) -> Value {
        let mask = self
            .b
            .func
            .dfg
            .immediates
            .push(ConstantData::from(mask.to_vec()));
        self.b.ins().shuffle(a, b, mask)
    }
}
