//! The text emitter: temporaries, blocks, types and constants, the function skeleton (argument
//! loads, work-item loop), structured control flow and the dispatch from each IR op to its
//! lowering. IR variables and loop counters live in `alloca`s of the entry block, which LLVM's
//! `mem2reg`/`SROA` turn into SSA registers.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use qforge_ir::{Access, DType, Dim, Kernel, Op, ParamKind, ScalarType, Stmt, Value, VarId};

use super::deferred::Deferred;
use super::{ArgLayout, LlvmOptions, BACKEND, ENTRY};
use crate::error::{Error, Result};

/// What a parameter lowers to, loaded once in the entry block.
#[derive(Clone)]
pub(super) enum ParamVal {
    /// A buffer: `i8*` base, `i64` element count (bounds checks only), dtype, access.
    Buffer {
        base: String,
        count: Option<String>,
        dtype: DType,
        access: Access,
    },
    /// A scalar operand of its LLVM type.
    Scalar(String),
}

/// An operand: its text and its lanes (1: a scalar, uniform across vector lanes).
#[derive(Clone, Debug)]
pub(super) struct Opnd {
    pub(super) text: String,
    pub(super) lanes: u32,
}

/// Loads proven in range, by arena index, with the `(base, i)` of an index `base + i` (see
/// `Emitter::in_range`).
pub(super) type InRange = HashMap<usize, Option<(Value, Value)>>;

/// The state of one lowering.
pub(super) struct Emitter<'a> {
    pub(super) k: &'a Kernel,
    pub(super) opts: LlvmOptions,
    /// Instructions after the entry block's allocas.
    out: String,
    /// The entry block's allocas.
    allocas: String,
    /// Declarations of the intrinsics used.
    decls: BTreeSet<String>,
    next: u32,
    /// The LLVM operand of each IR value, once lowered.
    pub(super) vals: Vec<Option<Opnd>>,
    /// The deferred lookups of the vector body being lowered, by arena index (`deferred.rs`).
    pub(super) deferred: HashMap<usize, Deferred>,
    /// The `<N x i8>` vector each zero-extended `u8` vector load was widened from, by the
    /// widened operand: a per-lane table read indexes with its bytes (`memory.rs`).
    pub(super) widened_bytes: HashMap<String, String>,
    /// The value a vector body replaces by `seed + lane` (its loop index, or the column of
    /// accumulators run as lanes), while one is lowered: its bounds (`bounds.rs`) are not its
    /// ops' bounds there.
    pub(super) lanes_seed: Option<Value>,
    pub(super) params: Vec<ParamVal>,
    /// `i32*` base of each table.
    pub(super) tables: Vec<String>,
    /// `i32*` status word (bounds checks only).
    status: Option<String>,
    /// The alloca and type of each IR variable.
    vars: Vec<(String, ScalarType)>,
    /// The current work item (`i32`).
    work_item: Option<String>,
    /// The label of the block being emitted.
    pub(super) current: String,
    /// Scalar loads (by arena index) whose index a check before their loop proved in range
    /// for every element it runs (`outer.rs`): lowered without their own check. The value is
    /// `(base, i)` when the index is `base + i`, `base` loop-invariant (`None`: the index is the
    /// loop index itself).
    pub(super) in_range: InRange,
    /// Whether a branch uses the weights `!1` (`lanes::lanes_fast_or_exit`).
    pub(super) cold_exits: bool,
    /// Variables (by arena index) that a vector body reads as a `<lanes x float>` slot, lane
    /// `l` standing for the variable of lane `l` (`outer_store.rs`).
    pub(super) lane_vars: HashMap<usize, String>,
}

/// The lookup chain (`lanes::lookup_chain`) from which a vector loop runs twice the lanes on
/// AVX-512: a level search (8-bit quantization) has 7, a dequantization 1.
const INTERLEAVE_CHAIN: u32 = 4;

/// An internal error: something the verifier should have excluded.
pub(super) fn internal(what: impl Into<String>) -> Error {
    Error::Backend {
        backend: BACKEND,
        message: format!("internal: {}", what.into()),
    }
}

/// The LLVM scalar type of an IR type.
pub(super) fn scalar_ty(ty: ScalarType) -> &'static str {
    match ty {
        ScalarType::F32 => "float",
        ScalarType::U32 | ScalarType::I32 => "i32",
        ScalarType::Bool => "i1",
    }
}

/// The LLVM type of `lanes` values of `ty` (`lanes == 1`: the scalar type).
pub(super) fn ty(ty: ScalarType, lanes: u32) -> String {
    vec_of(scalar_ty(ty), lanes)
}

/// `<lanes x elem>`, or `elem` for one lane.
pub(super) fn vec_of(elem: &str, lanes: u32) -> String {
    if lanes == 1 {
        elem.to_string()
    } else {
        format!("<{lanes} x {elem}>")
    }
}

/// The intrinsic suffix of `lanes` values of the LLVM scalar type `elem` (`f32`, `v16f32`, ...).
pub(super) fn suffix(elem: &str, lanes: u32) -> String {
    let e = match elem {
        "float" => "f32",
        "double" => "f64",
        other => other,
    };
    if lanes == 1 {
        e.to_string()
    } else {
        format!("v{lanes}{e}")
    }
}

/// The literal of one scalar constant of `ty` with bit pattern `bits`.
pub(super) fn scalar_literal(ty: ScalarType, bits: u32) -> String {
    match ty {
        // A signaling NaN as a constant bitcast: widening it to `f64` would quiet it (x86's
        // `cvtss2sd`), and the contract keeps a constant's bits.
        ScalarType::F32 if bits & 0x7fc0_0000 == 0x7f80_0000 && bits & 0x003f_ffff != 0 => {
            format!("bitcast (i32 {} to float)", bits as i32)
        }
        // LLVM writes float constants as the hex of the (exactly representable) double.
        ScalarType::F32 => format!("0x{:016X}", (f32::from_bits(bits) as f64).to_bits()),
        ScalarType::U32 | ScalarType::I32 => format!("{}", bits as i32),
        ScalarType::Bool => if bits != 0 { "true" } else { "false" }.to_string(),
    }
}

/// The literal of a constant of `lanes` equal values.
pub(super) fn literal(ty: ScalarType, lanes: u32, bits: u32) -> String {
    splat_literal(scalar_ty(ty), &scalar_literal(ty, bits), lanes)
}

/// `<lanes x elem>` with every lane `value` (a literal), or the literal itself for one lane.
pub(super) fn splat_literal(elem: &str, value: &str, lanes: u32) -> String {
    if lanes == 1 {
        return value.to_string();
    }
    let items: Vec<String> = (0..lanes).map(|_| format!("{elem} {value}")).collect();
    format!("<{}>", items.join(", "))
}

/// The function that runs one work item of a kernel with an `accumulate` (see [`module`]).
const ITEM: &str = "qforge_work_item";

/// Whether `stmts` hold an `accumulate`, at any depth.
fn has_accumulate(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Accumulate { .. } => true,
        Stmt::If {
            then_body,
            else_body,
            ..
        } => has_accumulate(then_body) || has_accumulate(else_body),
        Stmt::For { body, .. } => has_accumulate(body),
        _ => false,
    })
}

/// The body of the entry function of an outlined kernel: `{ITEM}(args, i)` for `i` in
/// `begin..end`.
fn item_loop() -> String {
    format!(
        "entry:
  %enter = icmp ult i32 %begin, %end
  br i1 %enter, label %loop, label %done
loop:
  %i = phi i32 [ %begin, %entry ], [ %next, %loop ]
  call void @{ITEM}(i64* %args, i32 %i)
  %next = add i32 %i, 1
  %more = icmp ult i32 %next, %end
  br i1 %more, label %loop, label %done
done:
  ret void
"
    )
}

/// The text of the module for `kernel`. The entry function runs work items `begin..end`. For a
/// kernel with an `accumulate` it calls a separate function per work item, kept out of line:
/// inlined into the loop over work items, LLVM hoisted the work-item-invariant parts of the
/// checked paths (e.g. a 32-lane splat of a buffer's length, four AVX-512 registers) above that
/// loop, where they stayed live across the hot loop of every work item and pushed an
/// accumulator of the dense products' 8 x 32 tile onto the stack (a store and a reload every
/// iteration). A call per work item costs some ten instructions against thousands of products.
pub(super) fn module(kernel: &Kernel, opts: &LlvmOptions) -> Result<String> {
    let mut e = Emitter {
        k: kernel,
        opts: *opts,
        out: String::new(),
        allocas: String::new(),
        decls: BTreeSet::new(),
        next: 0,
        vals: vec![None; kernel.values.len()],
        deferred: HashMap::new(),
        widened_bytes: HashMap::new(),
        lanes_seed: None,
        in_range: HashMap::new(),
        cold_exits: false,
        lane_vars: HashMap::new(),
        params: Vec::new(),
        tables: Vec::new(),
        status: None,
        vars: Vec::new(),
        work_item: None,
        current: "entry".into(),
    };
    let outlined = has_accumulate(&kernel.body);
    e.function_body(outlined)?;
    let mut text = String::new();
    let _ = writeln!(text, "; qforge kernel '{}' (LLVM backend)", kernel.name);
    let args = "i64* noalias nocapture readonly %args";
    if outlined {
        let _ = writeln!(
            text,
            "define internal void @{ITEM}({args}, i32 %item) #1 {{"
        );
    } else {
        let _ = writeln!(
            text,
            "define void @{ENTRY}({args}, i32 %begin, i32 %end) #0 {{"
        );
    }
    text.push_str("entry:\n");
    text.push_str(&e.allocas);
    text.push_str(&e.out);
    text.push_str("}\n\n");
    if outlined {
        let _ = writeln!(
            text,
            "define void @{ENTRY}({args}, i32 %begin, i32 %end) #0 {{"
        );
        text.push_str(&item_loop());
        text.push_str("}\n\n");
    }
    for d in &e.decls {
        let _ = writeln!(text, "{d}");
    }
    text.push_str("\nattributes #0 = { nounwind }\n");
    if outlined {
        text.push_str("attributes #1 = { nounwind noinline }\n");
    }
    // The weights of a bounds check: the out-of-range branch is cold.
    text.push_str("!0 = !{!\"branch_weights\", i32 1, i32 1048575}\n");
    if e.cold_exits {
        // The weights of the fast-form test of a loop that leaves for checked code: leaving
        // is cold.
        text.push_str("!1 = !{!\"branch_weights\", i32 1048575, i32 1}\n");
    }
    Ok(text)
}

impl Emitter<'_> {
    /// A fresh temporary name.
    pub(super) fn tmp(&mut self) -> String {
        self.next += 1;
        format!("%t{}", self.next)
    }

    /// Emits `%tN = rhs` and returns `%tN`.
    pub(super) fn ins(&mut self, rhs: impl AsRef<str>) -> String {
        let t = self.tmp();
        let _ = writeln!(self.out, "  {t} = {}", rhs.as_ref());
        t
    }

    /// Emits an instruction without a result.
    pub(super) fn line(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.out, "  {}", text.as_ref());
    }

    /// A fresh block label.
    pub(super) fn label(&mut self, hint: &str) -> String {
        self.next += 1;
        format!("b{}.{hint}", self.next)
    }

    /// Starts block `label`.
    pub(super) fn start(&mut self, label: &str) {
        let _ = writeln!(self.out, "{label}:");
        self.current = label.to_string();
    }

    /// `br label %to`.
    pub(super) fn br(&mut self, to: &str) {
        self.line(format!("br label %{to}"));
    }

    /// `br i1 cond, label %t, label %f`.
    pub(super) fn cond_br(&mut self, cond: &str, t: &str, f: &str) {
        self.line(format!("br i1 {cond}, label %{t}, label %{f}"));
    }

    /// An `alloca` of `ty` in the entry block.
    pub(super) fn alloca(&mut self, ty: &str) -> String {
        let t = self.tmp();
        let _ = writeln!(self.allocas, "  {t} = alloca {ty}");
        t
    }

    /// Calls intrinsic `name` (declared once) returning `ret`, with typed arguments.
    pub(super) fn call(&mut self, name: &str, ret: &str, args: &[(&str, &str)]) -> String {
        let types: Vec<&str> = args.iter().map(|(t, _)| *t).collect();
        self.decls
            .insert(format!("declare {ret} @{name}({})", types.join(", ")));
        let list: Vec<String> = args.iter().map(|(t, v)| format!("{t} {v}")).collect();
        self.ins(format!("call {ret} @{name}({})", list.join(", ")))
    }

    /// `lanes` copies of the scalar operand `x` of LLVM type `elem`.
    pub(super) fn splat(&mut self, x: &str, elem: &str, lanes: u32) -> String {
        if lanes == 1 {
            return x.to_string();
        }
        let v = vec_of(elem, lanes);
        let one = self.ins(format!("insertelement {v} undef, {elem} {x}, i32 0"));
        self.ins(format!(
            "shufflevector {v} {one}, {v} undef, <{lanes} x i32> zeroinitializer"
        ))
    }

    /// The operand of IR value `v` with `lanes` lanes (a scalar is splatted).
    pub(super) fn get(&mut self, v: Value, lanes: u32) -> Result<String> {
        self.materialize(v)?;
        let o = self.opnd(v)?;
        if o.lanes == lanes {
            return Ok(o.text);
        }
        if o.lanes != 1 {
            return Err(internal(format!(
                "%{} has {} lanes, {lanes} wanted",
                v.index(),
                o.lanes
            )));
        }
        let elem = scalar_ty(self.k.values[v].ty);
        Ok(self.splat(&o.text, elem, lanes))
    }

    /// The lowered operand of IR value `v`.
    pub(super) fn opnd(&self, v: Value) -> Result<Opnd> {
        self.vals
            .get(v.index())
            .cloned()
            .flatten()
            .ok_or_else(|| internal(format!("%{} used before it was lowered", v.index())))
    }

    /// The scalar operand of IR value `v`.
    pub(super) fn val(&mut self, v: Value) -> Result<String> {
        self.get(v, 1)
    }

    /// Records the operand of IR value `v`.
    pub(super) fn set(&mut self, v: Value, text: String, lanes: u32) {
        self.deferred.remove(&v.index());
        self.vals[v.index()] = Some(Opnd { text, lanes });
    }

    /// The buffer behind parameter `p` (its element count only with bounds checks).
    pub(super) fn buffer(
        &self,
        p: qforge_ir::ParamId,
    ) -> Result<(String, Option<String>, DType, Access)> {
        match self.params.get(p.index()) {
            Some(ParamVal::Buffer {
                base,
                count,
                dtype,
                access,
            }) => Ok((base.clone(), count.clone(), *dtype, *access)),
            _ => Err(internal(format!(
                "parameter #{} is not a buffer",
                p.index()
            ))),
        }
    }

    /// The body of the work-item function (`outlined`: one work item, `%item`) or of the entry
    /// function (a loop over `%begin..%end`).
    fn function_body(&mut self, outlined: bool) -> Result<()> {
        let layout = ArgLayout::new(self.k, self.opts.bounds_checks);
        let slot = |e: &mut Self, i: usize| {
            let p = e.ins(format!("getelementptr i64, i64* %args, i64 {i}"));
            e.ins(format!("load i64, i64* {p}, align 8"))
        };
        for (i, (_, param)) in self.k.params.iter().enumerate() {
            let v = match &param.kind {
                ParamKind::Buffer { dtype, access, .. } => {
                    let raw = slot(self, i);
                    let base = self.ins(format!("inttoptr i64 {raw} to i8*"));
                    let count = layout.count(i).map(|c| slot(self, c));
                    ParamVal::Buffer {
                        base,
                        count,
                        dtype: *dtype,
                        access: *access,
                    }
                }
                ParamKind::Scalar(ty) => {
                    let raw = slot(self, i);
                    let low = self.ins(format!("trunc i64 {raw} to i32"));
                    ParamVal::Scalar(match ty {
                        ScalarType::F32 => self.ins(format!("bitcast i32 {low} to float")),
                        ScalarType::U32 | ScalarType::I32 => low,
                        ScalarType::Bool => return Err(internal("bool scalar parameter")),
                    })
                }
            };
            self.params.push(v);
        }
        for t in 0..self.k.tables.len() {
            let raw = slot(self, layout.table(t));
            let p = self.ins(format!("inttoptr i64 {raw} to i32*"));
            self.tables.push(p);
        }
        if let Some(s) = layout.status() {
            let raw = slot(self, s);
            self.status = Some(self.ins(format!("inttoptr i64 {raw} to i32*")));
        }
        for (_, var) in self.k.vars.iter() {
            let a = self.alloca(scalar_ty(var.ty));
            self.vars.push((a, var.ty));
        }
        if outlined {
            self.work_item_body("%item")?;
        } else {
            self.counted_loop("i32", "%begin", "%end", 1, |e, wi| e.work_item_body(wi))?;
        }
        self.line("ret void");
        Ok(())
    }

    /// Work item `wi`: its variables zeroed, then the kernel's body.
    fn work_item_body(&mut self, wi: &str) -> Result<()> {
        self.work_item = Some(wi.to_string());
        for i in 0..self.vars.len() {
            let (a, t) = self.vars[i].clone();
            let zero = scalar_literal(t, 0);
            self.line(format!(
                "store {} {zero}, {}* {a}",
                scalar_ty(t),
                scalar_ty(t)
            ));
        }
        let k = self.k;
        self.block(&k.body)
    }

    /// Emits `for i in (start..end).step_by(step) { body(i) }` on unsigned integers of LLVM
    /// type `ity` (no wrap-around: the loop stops when `i + step` would reach or pass `end`).
    /// Leaves the emitter after the loop.
    pub(super) fn counted_loop(
        &mut self,
        ity: &str,
        start: &str,
        end: &str,
        step: u32,
        body: impl FnOnce(&mut Self, &str) -> Result<()>,
    ) -> Result<()> {
        let slot = self.alloca(ity);
        let (head, exit) = (self.label("loop"), self.label("done"));
        self.line(format!("store {ity} {start}, {ity}* {slot}"));
        let enter = self.ins(format!("icmp ult {ity} {start}, {end}"));
        self.cond_br(&enter, &head, &exit);
        self.start(&head);
        let i = self.ins(format!("load {ity}, {ity}* {slot}"));
        body(self, &i)?;
        // Continue while `i + step < end`, written as `end - i > step` (no overflow: i < end).
        let left = self.ins(format!("sub {ity} {end}, {i}"));
        let more = self.ins(format!("icmp ugt {ity} {left}, {step}"));
        let next = self.ins(format!("add {ity} {i}, {step}"));
        self.line(format!("store {ity} {next}, {ity}* {slot}"));
        self.cond_br(&more, &head, &exit);
        self.start(&exit);
        Ok(())
    }

    /// Emits `if oob { report } else { in_range }`: the report records the current work item
    /// in the status word unless an earlier one is there and yields zero of type `ty`;
    /// `in_range` emits the access (no blocks). Returns the value the access yields.
    pub(super) fn guarded(
        &mut self,
        oob: &str,
        ty: Option<&str>,
        zero: &str,
        in_range: impl FnOnce(&mut Self) -> Option<String>,
    ) -> Result<Option<String>> {
        let status = self
            .status
            .clone()
            .ok_or_else(|| internal("bounds check without a status word"))?;
        let wi = self
            .work_item
            .clone()
            .ok_or_else(|| internal("bounds check outside the work-item loop"))?;
        let (ok, cold, join) = (self.label("ok"), self.label("oob"), self.label("join"));
        self.line(format!("br i1 {oob}, label %{cold}, label %{ok}, !prof !0"));
        self.start(&cold);
        let old = self.ins(format!("load i32, i32* {status}"));
        let none = self.ins(format!("icmp eq i32 {old}, 0"));
        let wi1 = self.ins(format!("add i32 {wi}, 1"));
        let new = self.ins(format!("select i1 {none}, i32 {wi1}, i32 {old}"));
        self.line(format!("store i32 {new}, i32* {status}"));
        self.br(&join);
        self.start(&ok);
        let value = in_range(self);
        let ok_end = self.current.clone();
        self.br(&join);
        self.start(&join);
        Ok(match (ty, value) {
            (Some(ty), Some(v)) => {
                Some(self.ins(format!("phi {ty} [ {zero}, %{cold} ], [ {v}, %{ok_end} ]")))
            }
            _ => None,
        })
    }

    /// The alloca of IR variable `var`.
    fn var_of(&self, var: VarId) -> Result<(String, ScalarType)> {
        self.vars
            .get(var.index())
            .cloned()
            .ok_or_else(|| internal("missing variable"))
    }

    /// Sets IR variable `var` to the scalar operand `value`.
    pub(super) fn assign_var(&mut self, var: VarId, value: &str) -> Result<()> {
        let (a, t) = self.var_of(var)?;
        let st = scalar_ty(t);
        self.line(format!("store {st} {value}, {st}* {a}"));
        Ok(())
    }

    /// Lowers a block of statements.
    pub(super) fn block(&mut self, stmts: &[Stmt]) -> Result<()> {
        let mut at = 0;
        while let Some(stmt) = stmts.get(at) {
            at += 1;
            if let Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } = stmt
            {
                // Sums of the outer plan: the stores after it may take them as vectors.
                if let Some(sums) = self.accumulate(*index, *len, *order, body, accs)? {
                    at += self.outer_stores(&stmts[at..], &sums)?;
                }
                continue;
            }
            self.stmt(stmt)?;
        }
        Ok(())
    }

    /// Lowers the `let` of IR value `v` as scalar code.
    pub(super) fn let_scalar(&mut self, v: Value) -> Result<()> {
        let def = self
            .k
            .values
            .try_get(v)
            .ok_or_else(|| internal("let of a missing value"))?;
        let out = match &def.op {
            Op::Load { buf, index } if self.in_range.contains_key(&v.index()) => {
                let (base, at) = match self.in_range[&v.index()] {
                    Some((base, i)) => (Some(self.val(base)?), i),
                    None => (None, *index),
                };
                let at = self.val(at)?;
                self.load_in_range(*buf, base.as_deref(), &at)?
            }
            Op::Load { buf, index } if self.fits_const_buffer(*buf, *index) => {
                let at = self.val(*index)?;
                self.load_in_range(*buf, None, &at)?
            }
            op => self.op(op, def.ty)?,
        };
        self.set(v, out, 1);
        Ok(())
    }

    /// Whether every value of `index` lies in `buf` at any launch: the buffer's shape is
    /// constant (a launch binds exactly that many elements, `qforge_ir::bind`) and the index's
    /// proven upper bound (`bounds.rs`) is below it, e.g. `nested_code[qabsmax[b]]`, a `u8`
    /// into 256 entries.
    fn fits_const_buffer(&self, buf: qforge_ir::ParamId, index: Value) -> bool {
        let Some(ParamKind::Buffer { shape, .. }) = self.k.params.try_get(buf).map(|p| &p.kind)
        else {
            return false;
        };
        let mut n = 1u64;
        for d in shape {
            match d {
                Dim::Const(c) => n = n.saturating_mul(u64::from(*c)),
                Dim::Param(_) => return false,
            }
        }
        u64::from(super::bounds::upper_bound(self.k, index, self.lanes_seed)) < n
    }

    pub(super) fn stmt(&mut self, stmt: &Stmt) -> Result<()> {
        match stmt {
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => {
                if let Some(sums) = self.accumulate(*index, *len, *order, body, accs)? {
                    self.outer_stores(&[], &sums)?;
                }
            }
            Stmt::Let(v) => self.let_scalar(*v)?,
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => {
                let (index, value) = (self.val(*index)?, self.val(*value)?);
                self.store(*buf, &index, &value, *rounding)?;
            }
            Stmt::Assign { var, value } => {
                let value = self.val(*value)?;
                self.assign_var(*var, &value)?;
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                let cond = self.val(*cond)?;
                let (then_l, else_l, merge) =
                    (self.label("then"), self.label("else"), self.label("endif"));
                self.cond_br(&cond, &then_l, &else_l);
                self.start(&then_l);
                self.block(then_body)?;
                self.br(&merge);
                self.start(&else_l);
                self.block(else_body)?;
                self.br(&merge);
                self.start(&merge);
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => {
                let lanes = self.for_lanes(*start, *end, body);
                let (start, end) = (self.val(*start)?, self.val(*end)?);
                if lanes != 0 && *step == 1 && super::lanes::eligible(self.k, *index, body, true) {
                    return self.vector_for(*index, &start, &end, lanes, body);
                }
                self.counted_loop("i32", &start, &end, *step, |e, i| {
                    e.set(*index, i.to_string(), 1);
                    e.block(body)
                })?;
            }
        }
        Ok(())
    }

    /// The lanes of a vectorized `for start..end`: [`LlvmOptions::lanes`], or twice as many
    /// (four times with VBMI, for the byte planes) when lookups are permutes and the body's
    /// lookups form a chain of at least [`INTERLEAVE_CHAIN`] or read two or more tables of more
    /// than 16 entries: such a body (a level search, 8-bit decodes) is latency-bound, and
    /// independent 16-lane parts per iteration keep more permutes in flight (8-bit AdamW step:
    /// 1.6x faster at 32 lanes than at 16); fewer (at least 4) when the bounds are constants
    /// with a smaller trip count (e.g. a loop over the 8 lanes of an emulated SIMD sum).
    fn for_lanes(&self, start: Value, end: Value, body: &[Stmt]) -> u32 {
        let constant = |v: Value| match self.k.values.try_get(v).map(|d| &d.op) {
            Some(Op::Const(c)) => Some(c.bits()),
            _ => None,
        };
        let lanes = self.opts.lanes;
        let lanes = if self.opts.x86_avx512 && lanes == 16 && {
            let (chain, large) = super::lanes::lookup_chain(self.k, body);
            chain >= INTERLEAVE_CHAIN || large >= 2
        } {
            // Byte-plane lookups (VBMI) take 64 lanes per step.
            if self.opts.x86_avx512_vbmi {
                4 * lanes
            } else {
                2 * lanes
            }
        } else {
            lanes
        };
        match (constant(start), constant(end)) {
            (Some(a), Some(b)) if b > a && b - a < lanes => {
                let fit = 1u32 << (31 - (b - a).leading_zeros());
                if fit >= 4 {
                    fit
                } else {
                    0
                }
            }
            _ => lanes,
        }
    }

    /// Lowers one op yielding a scalar of IR type `ty`.
    pub(super) fn op(&mut self, op: &Op, ty: ScalarType) -> Result<String> {
        Ok(match op {
            Op::WorkItem => self
                .work_item
                .clone()
                .ok_or_else(|| internal("work item outside the loop"))?,
            Op::LoopIndex => return Err(internal("loop index defined by a let")),
            Op::Param(p) => match self.params.get(p.index()) {
                Some(ParamVal::Scalar(v)) => v.clone(),
                _ => {
                    return Err(internal(format!(
                        "parameter #{} is not a scalar",
                        p.index()
                    )))
                }
            },
            Op::Const(c) => scalar_literal(ty, c.bits()),
            Op::ReadVar(var) => {
                let (a, t) = self.var_of(*var)?;
                let st = scalar_ty(t);
                self.ins(format!("load {st}, {st}* {a}"))
            }
            Op::Load { buf, index } => {
                let index = self.val(*index)?;
                self.load(*buf, &index)?
            }
            Op::SearchSorted { .. } => return Err(crate::decompose::undecomposed(super::BACKEND)),
            Op::Lookup { table, index } => {
                let idx = self.val(*index)?;
                self.lookup(*table, &idx, *index, 1)?
            }
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => {
                let (start, len) = (self.val(*start)?, self.val(*len)?);
                self.reduce(*kind, *buf, &start, &len, *order)?
            }
            Op::Unary(..)
            | Op::Binary(..)
            | Op::Fma(..)
            | Op::Cmp(..)
            | Op::Select { .. }
            | Op::FloatToInt { .. }
            | Op::IntToFloat { .. }
            | Op::Bitcast { .. } => self.pure(op, ty, 1)?,
        })
    }
}
