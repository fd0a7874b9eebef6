//! The reference interpreter: runs any verified kernel sequentially with exactly the IR's
//! semantics. It defines what every kernel means; every backend is checked against it.
//!
//! Values live in a flat register file of 32-bit patterns indexed by value handle (`f32` as its
//! bits, `bool` as 0/1); buffer elements are decoded from and encoded into the argument bytes
//! directly. Work items run one after another in increasing order.
//!
//! Corners the op docs leave to the executor are defined here: a `for` loop stops when
//! `index + step` would overflow `u32`; a `reduce` with `len == 0` reads nothing and so is never
//! out of bounds; an out-of-bounds `load`, `store` or `reduce` stops the launch with
//! [`Error::Execution`] (stores made by earlier statements and work items stay written).

mod eval;
mod memory;
mod reduce;

pub use eval::{eval_binary, eval_cmp, eval_float_to_int, eval_fma, eval_int_to_float, eval_unary};

use std::ops::Range;

use crate::args::Arg;
use crate::error::{Error, Result};
use crate::kernel::{Kernel, Stmt, Value};
use crate::ops::Op;
use crate::ops::ReduceOrder;
use memory::{Fault, Memory};

/// Verifies `kernel`, binds `args` and runs every work item `0..grid` in order.
///
/// # Errors
/// [`Error::Verify`] for an invalid kernel, [`Error::Argument`] when the arguments do not match
/// the parameters, [`Error::Execution`] naming the work item, buffer, index and length when a
/// `load`, `store` or `reduce` leaves its buffer.
pub fn run(kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
    execute(kernel, args, None)
}

/// Like [`run`], but runs only the work items in `items` (in increasing order). Running a grid
/// as several disjoint ranges gives the same bits as one [`run`]. An empty range runs nothing.
///
/// # Errors
/// As [`run`]; also [`Error::Argument`] (parameter `grid`) when a non-empty `items` reaches past
/// the grid.
pub fn run_items(kernel: &Kernel, args: &mut [Arg<'_>], items: Range<u32>) -> Result<()> {
    execute(kernel, args, Some(items))
}

fn execute(kernel: &Kernel, args: &mut [Arg<'_>], items: Option<Range<u32>>) -> Result<()> {
    crate::verify(kernel)?;
    let binding = crate::bind(kernel, args)?;
    let items = items.unwrap_or(0..binding.grid);
    if items.is_empty() {
        return Ok(());
    }
    if items.end > binding.grid {
        return Err(Error::Argument {
            kernel: kernel.name.clone(),
            param: "grid".into(),
            message: format!(
                "work items {}..{} reach past the grid of {} work items",
                items.start, items.end, binding.grid
            ),
        });
    }
    let mut machine = Machine {
        kernel,
        mem: Memory::new(kernel, args),
        regs: vec![0; kernel.values.len()],
        vars: vec![0; kernel.vars.len()],
        item: 0,
    };
    for item in items {
        machine.item = item;
        machine.vars.fill(0);
        machine
            .block(&kernel.body)
            .map_err(|fault| Error::Execution {
                kernel: kernel.name.clone(),
                work_item: item,
                message: fault.message(kernel),
            })?;
    }
    Ok(())
}

/// The state of one launch: the arguments, the register file and the current work item.
struct Machine<'k, 'a> {
    kernel: &'k Kernel,
    mem: Memory<'a>,
    /// One 32-bit pattern per SSA value, indexed by value handle.
    regs: Vec<u32>,
    /// One 32-bit pattern per local variable, zeroed at the start of each work item.
    vars: Vec<u32>,
    item: u32,
}

impl<'k> Machine<'k, '_> {
    #[inline]
    fn reg(&self, v: Value) -> u32 {
        self.regs[v.index()]
    }

    fn block(&mut self, stmts: &'k [Stmt]) -> Result<(), Fault> {
        for stmt in stmts {
            match stmt {
                Stmt::Let(v) => {
                    let bits = self.eval(*v)?;
                    self.regs[v.index()] = bits;
                }
                Stmt::Store {
                    buf,
                    index,
                    value,
                    rounding,
                } => {
                    self.mem
                        .store(buf.index(), self.reg(*index), self.reg(*value), *rounding)?;
                }
                Stmt::Assign { var, value } => self.vars[var.index()] = self.reg(*value),
                Stmt::If {
                    cond,
                    then_body,
                    else_body,
                } => {
                    if self.reg(*cond) != 0 {
                        self.block(then_body)?;
                    } else {
                        self.block(else_body)?;
                    }
                }
                Stmt::For {
                    index,
                    start,
                    end,
                    step,
                    body,
                } => {
                    let (mut i, end) = (self.reg(*start), self.reg(*end));
                    // The verifier requires step >= 1; never loop forever on an unverified 0.
                    let step = (*step).max(1);
                    while i < end {
                        self.regs[index.index()] = i;
                        self.block(body)?;
                        match i.checked_add(step) {
                            Some(next) => i = next,
                            None => break,
                        }
                    }
                }
                Stmt::Accumulate {
                    index,
                    len,
                    order,
                    body,
                    accs,
                } => {
                    // Partials of every accumulator, `ways` each, all starting at -0.0.
                    let ways = match order {
                        ReduceOrder::Sequential => 1,
                        // The verifier keeps `w` a power of two in 2..=64.
                        ReduceOrder::Strided(w) => (*w as usize).clamp(1, 64),
                    };
                    let mut partials = vec![-0.0f32; ways * accs.len()];
                    for i in 0..self.reg(*len) {
                        self.regs[index.index()] = i;
                        self.block(body)?;
                        let lane = i as usize % ways;
                        for (t, acc) in accs.iter().enumerate() {
                            let (a, b) = (
                                f32::from_bits(self.reg(acc.a)),
                                f32::from_bits(self.reg(acc.b)),
                            );
                            let p = &mut partials[t * ways + lane];
                            *p = a.mul_add(b, *p);
                        }
                    }
                    for (t, acc) in accs.iter().enumerate() {
                        let p = &mut partials[t * ways..(t + 1) * ways];
                        let mut w = ways;
                        while w > 1 {
                            w /= 2;
                            for j in 0..w {
                                p[j] += p[j + w];
                            }
                        }
                        self.vars[acc.var.index()] = p[0].to_bits();
                    }
                }
            }
        }
        Ok(())
    }

    /// Evaluates the op of value `v` (whose operands are already in registers).
    #[inline]
    fn eval(&mut self, v: Value) -> Result<u32, Fault> {
        let kernel = self.kernel;
        let def = &kernel.values[v];
        let ty = |x: Value| kernel.values[x].ty;
        Ok(match &def.op {
            Op::WorkItem => self.item,
            // Set by the enclosing `for` (a `let` of a loop index is rejected by the verifier).
            Op::LoopIndex => self.reg(v),
            Op::Param(p) => self.mem.scalar(p.index())?,
            Op::Const(c) => c.bits(),
            Op::ReadVar(var) => self.vars[var.index()],
            Op::Load { buf, index } => self.mem.load(buf.index(), self.reg(*index))?,
            Op::Lookup { table, index } => {
                let data = &kernel.tables[*table].data;
                let i = (self.reg(*index) as usize).min(data.len().saturating_sub(1));
                data.get(i).copied().unwrap_or(0)
            }
            Op::SearchSorted { table, value } => {
                // A sorted, NaN-free table (a typing rule): the entries below `value` form a
                // prefix. A NaN value is below nothing.
                let v = f32::from_bits(self.reg(*value));
                let data = &kernel.tables[*table].data;
                data.partition_point(|t| f32::from_bits(*t) < v) as u32
            }
            Op::Unary(op, a) => eval_unary(*op, def.ty, self.reg(*a)),
            Op::Binary(op, a, b) => eval_binary(*op, def.ty, self.reg(*a), self.reg(*b)),
            Op::Fma(a, b, c) => eval_fma(self.reg(*a), self.reg(*b), self.reg(*c)),
            Op::Cmp(op, a, b) => eval_cmp(*op, ty(*a), self.reg(*a), self.reg(*b)) as u32,
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                if self.reg(*cond) != 0 {
                    self.reg(*if_true)
                } else {
                    self.reg(*if_false)
                }
            }
            Op::FloatToInt {
                value,
                to,
                rounding,
            } => eval_float_to_int(self.reg(*value), *to, *rounding),
            Op::IntToFloat { value, rounding } => {
                eval_int_to_float(self.reg(*value), ty(*value), *rounding)
            }
            Op::Bitcast { value, .. } => self.reg(*value),
            Op::Reduce {
                kind,
                buf,
                start,
                len,
                order,
            } => {
                let (dtype, bytes) =
                    self.mem
                        .float_range(buf.index(), self.reg(*start), self.reg(*len))?;
                reduce::reduce(*kind, *order, dtype, bytes)
            }
        })
    }
}
