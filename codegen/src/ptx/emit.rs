//! The module skeleton (header, tables, entry, registers), statements and structured control
//! flow. Op lowering lives in `ops.rs` (arithmetic, comparisons, conversions) and `memory.rs`
//! (loads, stores, lookups, reductions); the summation loop `accumulate` in `accumulate.rs`.
//!
//! Registers: the IR value `%k` lives in `%fk` (`f32`), `%rk` (`u32`/`i32`) or `%pk` (`bool`);
//! variable `k` in `%vfk`/`%vrk`/`%vpk`; temporaries are `%tf`, `%tr`, `%tp`, `%rd` (64-bit) and
//! `%h` (16-bit), numbered in emission order; buffer base addresses are `%rbk` for parameter `k`.

use std::fmt::Write as _;

use qforge_ir::{Dim, Kernel, Op, ParamKind, ScalarType, Stmt, Value, VarId};

use super::{SmTarget, BACKEND, PTX_VERSION, THREADS_PER_BLOCK};
use crate::error::{Error, Result};

/// Emits the whole module for `kernel` (already verified).
pub(super) fn module(kernel: &Kernel, target: SmTarget) -> Result<String> {
    let mut e = Emitter::new(kernel);
    e.prologue();
    e.block(&kernel.body)?;
    e.line("$Lexit:");
    e.line("ret;");

    let mut out = String::new();
    let _ = writeln!(out, "//");
    let _ = writeln!(out, "// qforge PTX backend: kernel {}", kernel.name);
    let _ = writeln!(
        out,
        "// launch: {THREADS_PER_BLOCK} threads per block, ceil(grid / {THREADS_PER_BLOCK}) blocks"
    );
    let _ = writeln!(out, "//");
    let _ = writeln!(out, ".version {PTX_VERSION}");
    let _ = writeln!(out, ".target {}", target.name());
    let _ = writeln!(out, ".address_size 64");
    for (h, table) in kernel.tables.iter() {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "// table {} ({}[{}])",
            table.name,
            table.ty,
            table.data.len()
        );
        let _ = writeln!(
            out,
            ".const .align 4 .b32 {}[{}] = {{",
            table_symbol(kernel, h.index()),
            table.data.len()
        );
        for (i, chunk) in table.data.chunks(8).enumerate() {
            let words: Vec<String> = chunk.iter().map(|w| format!("0x{w:08x}")).collect();
            let last = (i + 1) * 8 >= table.data.len();
            let _ = writeln!(out, "\t{}{}", words.join(", "), if last { "" } else { "," });
        }
        let _ = writeln!(out, "}};");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, ".visible .entry {}(", kernel.name);
    let n = kernel.params.len();
    for (i, (_, p)) in kernel.params.iter().enumerate() {
        let ty = match &p.kind {
            ParamKind::Buffer { .. } => ".u64",
            ParamKind::Scalar(t) => param_type(*t),
        };
        let comma = if i + 1 < n { "," } else { "" };
        let _ = writeln!(out, "\t.param {ty} p_{}{comma}", p.name);
    }
    let _ = writeln!(out, ")");
    let _ = writeln!(out, ".maxntid {THREADS_PER_BLOCK}, 1, 1");
    let _ = writeln!(out, "{{");
    out.push_str(&e.declarations());
    out.push('\n');
    out.push_str(&e.body);
    let _ = writeln!(out, "}}");
    Ok(out)
}

/// The `.param` type of a scalar parameter.
fn param_type(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => ".f32",
        ScalarType::U32 => ".u32",
        ScalarType::I32 => ".s32",
        // The verifier rejects bool parameters; a 32-bit slot keeps this total.
        ScalarType::Bool => ".u32",
    }
}

/// The module-scope symbol of table number `index`.
pub(super) fn table_symbol(kernel: &Kernel, index: usize) -> String {
    format!(
        "{}__{}",
        kernel.name,
        kernel
            .tables
            .iter()
            .nth(index)
            .map_or("t", |(_, t)| &t.name)
    )
}

/// A register class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// `.f32`.
    F,
    /// `.b32` (u32 and i32).
    R,
    /// `.pred`.
    P,
}

impl Class {
    /// The class of values of type `t`.
    pub(super) fn of(t: ScalarType) -> Class {
        match t {
            ScalarType::F32 => Class::F,
            ScalarType::U32 | ScalarType::I32 => Class::R,
            ScalarType::Bool => Class::P,
        }
    }

    /// The `mov` type of the class.
    pub(super) fn mov(self) -> &'static str {
        match self {
            Class::F => "f32",
            Class::R => "b32",
            Class::P => "pred",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Class::F => "f",
            Class::R => "r",
            Class::P => "p",
        }
    }
}

/// Emission state of one entry.
pub(super) struct Emitter<'k> {
    pub(super) kernel: &'k Kernel,
    pub(super) body: String,
    counts: [u32; 5],
    labels: u32,
}

const TF: usize = 0;
const TR: usize = 1;
const TP: usize = 2;
const RD: usize = 3;
const H: usize = 4;

impl<'k> Emitter<'k> {
    fn new(kernel: &'k Kernel) -> Self {
        Emitter {
            kernel,
            body: String::new(),
            counts: [0; 5],
            labels: 0,
        }
    }

    /// Appends one instruction (or a label, when it ends with `:`).
    pub(super) fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        if s.ends_with(':') {
            let _ = writeln!(self.body, "{s}");
        } else {
            let _ = writeln!(self.body, "\t{s}");
        }
    }

    fn fresh(&mut self, which: usize, prefix: &str) -> String {
        let n = self.counts[which];
        self.counts[which] += 1;
        format!("%{prefix}{n}")
    }

    /// A fresh `.f32` temporary.
    pub(super) fn tf(&mut self) -> String {
        self.fresh(TF, "tf")
    }
    /// A fresh `.b32` temporary.
    pub(super) fn tr(&mut self) -> String {
        self.fresh(TR, "tr")
    }
    /// A fresh `.pred` temporary.
    pub(super) fn tp(&mut self) -> String {
        self.fresh(TP, "tp")
    }
    /// A fresh `.b64` temporary.
    pub(super) fn rd(&mut self) -> String {
        self.fresh(RD, "rd")
    }
    /// A fresh `.b16` temporary.
    pub(super) fn h(&mut self) -> String {
        self.fresh(H, "h")
    }

    /// A fresh label with a readable suffix.
    pub(super) fn label(&mut self, what: &str) -> String {
        let n = self.labels;
        self.labels += 1;
        format!("$L{n}_{what}")
    }

    /// The type of value `v`.
    pub(super) fn ty(&self, v: Value) -> ScalarType {
        self.kernel.values[v].ty
    }

    /// The register holding value `v`.
    pub(super) fn reg(&self, v: Value) -> String {
        format!("%{}{}", Class::of(self.ty(v)).prefix(), v.index())
    }

    /// The register holding variable `var`.
    pub(super) fn var_reg(&self, var: VarId) -> String {
        let ty = self.kernel.vars[var].ty;
        format!("%v{}{}", Class::of(ty).prefix(), var.index())
    }

    /// The base address register of buffer parameter number `index`.
    pub(super) fn base_reg(index: usize) -> String {
        format!("%rb{index}")
    }

    /// Register declarations for everything the body used.
    fn declarations(&self) -> String {
        let mut out = String::new();
        let nv = self.kernel.values.len().max(1);
        let _ = writeln!(out, "\t.reg .f32 %f<{nv}>;");
        let _ = writeln!(out, "\t.reg .b32 %r<{nv}>;");
        let _ = writeln!(out, "\t.reg .pred %p<{nv}>;");
        let np = self.kernel.params.len().max(1);
        let _ = writeln!(out, "\t.reg .b64 %rb<{np}>;");
        let _ = writeln!(out, "\t.reg .b32 %wi, %nt;");
        let _ = writeln!(out, "\t.reg .b64 %wide<4>;");
        let _ = writeln!(out, "\t.reg .pred %out_of_grid;");
        let decl = [
            (TF, ".f32", "tf"),
            (TR, ".b32", "tr"),
            (TP, ".pred", "tp"),
            (RD, ".b64", "rd"),
            (H, ".b16", "h"),
        ];
        for (which, ty, prefix) in decl {
            if self.counts[which] > 0 {
                let _ = writeln!(out, "\t.reg {ty} %{prefix}<{}>;", self.counts[which]);
            }
        }
        for (h, var) in self.kernel.vars.iter() {
            let ty = match Class::of(var.ty) {
                Class::F => ".f32",
                Class::R => ".b32",
                Class::P => ".pred",
            };
            let _ = writeln!(out, "\t.reg {ty} {}; // var {}", self.var_reg(h), var.name);
        }
        out
    }

    /// Work-item index, early return, buffer base addresses, variable initialisation.
    fn prologue(&mut self) {
        self.line("// work_item = ctaid.x * ntid.x + tid.x (64-bit: never wraps)");
        self.line("mov.u32 %wi, %ctaid.x;");
        self.line("mov.u32 %nt, %ntid.x;");
        self.line("mul.wide.u32 %wide0, %wi, %nt;");
        self.line("mov.u32 %wi, %tid.x;");
        self.line("cvt.u64.u32 %wide1, %wi;");
        self.line("add.s64 %wide2, %wide0, %wide1;");
        let grid = match self.kernel.grid {
            Dim::Const(c) => c.to_string(),
            Dim::Param(p) => {
                self.line(format!(
                    "ld.param.u32 %wi, [p_{}];",
                    self.kernel.params[p].name
                ));
                "%wi".to_string()
            }
        };
        self.line(format!("cvt.u64.u32 %wide3, {grid};"));
        self.line("setp.ge.u64 %out_of_grid, %wide2, %wide3;");
        self.line("@%out_of_grid bra $Lexit;");
        self.line("cvt.u32.u64 %wi, %wide2;");
        let buffers: Vec<(usize, String)> = self
            .kernel
            .params
            .iter()
            .enumerate()
            .filter(|(_, (_, p))| matches!(p.kind, ParamKind::Buffer { .. }))
            .map(|(i, (_, p))| (i, p.name.clone()))
            .collect();
        for (i, name) in buffers {
            let rb = Self::base_reg(i);
            self.line(format!("ld.param.u64 {rb}, [p_{name}];"));
            self.line(format!("cvta.to.global.u64 {rb}, {rb};"));
        }
        let vars: Vec<VarId> = self.kernel.vars.iter().map(|(h, _)| h).collect();
        for var in vars {
            let r = self.var_reg(var);
            match Class::of(self.kernel.vars[var].ty) {
                Class::F => self.line(format!("mov.b32 {r}, 0f00000000;")),
                Class::R => self.line(format!("mov.b32 {r}, 0;")),
                Class::P => self.line(format!("setp.ne.b32 {r}, %wi, %wi;")),
            }
        }
    }

    /// Emits a block of statements.
    pub(super) fn block(&mut self, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::Accumulate {
                index,
                len,
                order,
                body,
                accs,
            } => self.accumulate(*index, *len, *order, body, accs),
            Stmt::Let(v) => self.value(*v),
            Stmt::Store {
                buf,
                index,
                value,
                rounding,
            } => self.store(*buf, *index, *value, *rounding),
            Stmt::Assign { var, value } => {
                let class = Class::of(self.ty(*value));
                let (dst, src) = (self.var_reg(*var), self.reg(*value));
                self.line(format!("mov.{} {dst}, {src};", class.mov()));
                Ok(())
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
            } => {
                let c = self.reg(*cond);
                let end = self.label("endif");
                if else_body.is_empty() {
                    self.line(format!("@!{c} bra {end};"));
                    self.block(then_body)?;
                } else {
                    let els = self.label("else");
                    self.line(format!("@!{c} bra {els};"));
                    self.block(then_body)?;
                    self.line(format!("bra {end};"));
                    self.line(format!("{els}:"));
                    self.block(else_body)?;
                }
                self.line(format!("{end}:"));
                Ok(())
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                body,
            } => {
                let i = self.reg(*index);
                let (s, e) = (self.reg(*start), self.reg(*end));
                let head = self.label("for");
                let done = self.label("endfor");
                let (p, left) = (self.tp(), self.tr());
                self.line(format!("// for {i} in {s}..{e} step {step}"));
                self.line(format!("mov.b32 {i}, {s};"));
                self.line(format!("setp.ge.u32 {p}, {i}, {e};"));
                self.line(format!("@{p} bra {done};"));
                self.line(format!("{head}:"));
                self.block(body)?;
                // Next index only when it stays below `end` (no u32 wrap-around).
                self.line(format!("sub.u32 {left}, {e}, {i};"));
                self.line(format!("setp.le.u32 {p}, {left}, {step};"));
                self.line(format!("@{p} bra {done};"));
                self.line(format!("add.u32 {i}, {i}, {step};"));
                self.line(format!("bra {head};"));
                self.line(format!("{done}:"));
                Ok(())
            }
        }
    }

    /// Evaluates the op of value `v` into its register.
    fn value(&mut self, v: Value) -> Result<()> {
        let op = self.kernel.values[v].op.clone();
        let dst = self.reg(v);
        match &op {
            Op::WorkItem => self.line(format!("mov.b32 {dst}, %wi;")),
            // The enclosing `for` writes the index register itself.
            Op::LoopIndex => {}
            Op::Param(p) => {
                let name = &self.kernel.params[*p].name;
                let ty = match &self.kernel.params[*p].kind {
                    ParamKind::Scalar(t) => param_type(*t),
                    ParamKind::Buffer { .. } => {
                        return Err(Error::Backend {
                            backend: BACKEND,
                            message: format!("parameter '{name}' is a buffer, not a scalar"),
                        })
                    }
                };
                self.line(format!("ld.param{ty} {dst}, [p_{name}];"));
            }
            Op::Const(c) => {
                let class = Class::of(c.ty());
                match class {
                    Class::F => self.line(format!("mov.b32 {dst}, 0f{:08X};", c.bits())),
                    Class::R => self.line(format!("mov.b32 {dst}, {};", int_imm(c.bits()))),
                    Class::P => {
                        let t = self.tr();
                        self.line(format!("mov.b32 {t}, {};", c.bits()));
                        self.line(format!("setp.ne.b32 {dst}, {t}, 0;"));
                    }
                }
            }
            Op::ReadVar(var) => {
                let class = Class::of(self.kernel.vars[*var].ty);
                let src = self.var_reg(*var);
                self.line(format!("mov.{} {dst}, {src};", class.mov()));
            }
            Op::Load { buf, index } => self.load(&dst, *buf, &self.reg(*index))?,
            Op::Lookup { table, index } => self.lookup(&dst, *table, *index),
            Op::SearchSorted { .. } => return Err(crate::decompose::undecomposed(BACKEND)),
            Op::Unary(u, a) => self.unary(&dst, *u, *a),
            Op::Binary(b, x, y) => self.binary(&dst, *b, *x, *y),
            Op::Fma(a, b, c) => {
                let (a, b, c) = (self.reg(*a), self.reg(*b), self.reg(*c));
                self.line(format!("fma.rn.f32 {dst}, {a}, {b}, {c};"));
            }
            Op::Cmp(c, x, y) => self.cmp(&dst, *c, *x, *y),
            Op::Select {
                cond,
                if_true,
                if_false,
            } => self.select(&dst, *cond, *if_true, *if_false),
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => self.float_to_int(&dst, *value, *to, *rounding),
            Op::IntToFloat { value, rounding } => self.int_to_float(&dst, *value, *rounding),
            Op::Bitcast { value, .. } => {
                let src = self.reg(*value);
                self.line(format!("mov.b32 {dst}, {src};"));
            }
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => self.reduce(&dst, *kind, *buf, *start, *len, *order)?,
        }
        Ok(())
    }
}

/// A 32-bit integer immediate: decimal below 2^31, hex above (unambiguous for `.b32`).
pub(super) fn int_imm(bits: u32) -> String {
    if bits < 0x8000_0000 {
        bits.to_string()
    } else {
        format!("0x{bits:08X}")
    }
}
