//! Variables and control flow of the kernel language: `let mut` variables ([`Var`]), `if` on a
//! build-time `bool` (chosen when the kernel is built) or on a `Val<bool>` (an IR `if`), `for`
//! over build-time bounds (unrolled) or IR bounds (an IR loop), and `#[accumulate]` loops.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::builder::KernelBuilder;
use crate::error::Result;
use crate::kernel::VarId;
use crate::ops::ReduceOrder;

use super::params::Scalar;
use super::value::{Kind, Lift, Operand, Val};

/// A kernel variable (`let mut x`): zero at the start of each work item, assigned with `x = v`,
/// read where it is used.
pub struct Var<T: Kind> {
    id: VarId,
    _t: PhantomData<T>,
}
impl<T: Kind> Clone for Var<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Kind> Copy for Var<T> {}

impl<T: Kind> std::fmt::Debug for Var<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var<{}>({:?})", T::TY, self.id)
    }
}

impl<T: Kind> Var<T> {
    /// The variable's handle.
    pub fn id(self) -> VarId {
        self.id
    }
}

/// Declares the variable `name` of type `T` (`let mut name: T;`).
pub fn var<T: Kind>(b: &mut KernelBuilder, name: &str) -> Var<T> {
    Var {
        id: b.var(name, T::TY),
        _t: PhantomData,
    }
}

/// Declares the variable `name` and assigns `init` (`let mut name = init;`).
pub fn var_init<O: Operand>(b: &mut KernelBuilder, name: &str, init: O) -> Var<O::Kind> {
    let v = var::<O::Kind>(b, name);
    let init = init.to_val(b);
    b.assign(v.id, init.value());
    v
}

/// Something whose value is read where its name is used: a variable (`read_var`) or a scalar
/// parameter (`param`).
pub trait Read: Copy {
    /// The kernel type.
    type Out: Kind;
    /// Emits the read.
    fn read(self, b: &mut KernelBuilder) -> Val<Self::Out>;
}
impl<T: Kind> Read for Var<T> {
    type Out = T;
    fn read(self, b: &mut KernelBuilder) -> Val<T> {
        Val::from_value(b.read_var(self.id))
    }
}
impl<T: Kind> Read for Scalar<T> {
    type Out = T;
    fn read(self, b: &mut KernelBuilder) -> Val<T> {
        Val::from_value(b.param(self.id()))
    }
}

/// The current value of a variable or scalar parameter.
pub fn read<R: Read>(b: &mut KernelBuilder, r: R) -> Val<R::Out> {
    r.read(b)
}

/// `var = value`.
pub fn assign<T: Kind>(b: &mut KernelBuilder, var: Var<T>, value: impl Lift<T>) {
    let value = value.lift(b);
    b.assign(var.id, value.value());
}

/// The condition of an `if`: a build-time `bool` picks a branch when the kernel is built; a
/// `Val<bool>` becomes an IR `if`.
#[diagnostic::on_unimplemented(
    message = "the condition of an `if` in a kernel must be a `bool` or a `Val<bool>`, not `{Self}`",
    note = "compare explicitly, e.g. `x != 0`"
)]
pub trait Cond {
    /// Emits (or picks) the branches.
    fn branch(
        self,
        b: &mut KernelBuilder,
        then: impl FnOnce(&mut KernelBuilder) -> Result<()>,
        otherwise: Option<impl FnOnce(&mut KernelBuilder) -> Result<()>>,
    ) -> Result<()>;
}

impl Cond for bool {
    fn branch(
        self,
        b: &mut KernelBuilder,
        then: impl FnOnce(&mut KernelBuilder) -> Result<()>,
        otherwise: Option<impl FnOnce(&mut KernelBuilder) -> Result<()>>,
    ) -> Result<()> {
        match (self, otherwise) {
            (true, _) => then(b),
            (false, Some(o)) => o(b),
            (false, None) => Ok(()),
        }
    }
}

impl Cond for Val<bool> {
    fn branch(
        self,
        b: &mut KernelBuilder,
        then: impl FnOnce(&mut KernelBuilder) -> Result<()>,
        otherwise: Option<impl FnOnce(&mut KernelBuilder) -> Result<()>>,
    ) -> Result<()> {
        let result = RefCell::new(Ok(()));
        let keep = |r: Result<()>| {
            let mut slot = result.borrow_mut();
            if slot.is_ok() {
                *slot = r;
            }
        };
        match otherwise {
            Some(o) => b.if_else(self.value(), |b| keep(then(b)), |b| keep(o(b))),
            None => b.if_then(self.value(), |b| keep(then(b))),
        }
        result.into_inner()
    }
}

/// `if cond { then } else { otherwise }` as a statement.
///
/// # Errors
/// The first error of a branch (a build-time check that failed).
pub fn if_<C: Cond>(
    b: &mut KernelBuilder,
    cond: C,
    then: impl FnOnce(&mut KernelBuilder) -> Result<()>,
    otherwise: Option<impl FnOnce(&mut KernelBuilder) -> Result<()>>,
) -> Result<()> {
    cond.branch(b, then, otherwise)
}

/// A build-time condition, the only kind an `if` with a value may have.
#[diagnostic::on_unimplemented(
    message = "an `if` on a kernel value (`{Self}`) has no value",
    label = "this `if` is used as a value",
    note = "use `select(cond, a, b)`, or assign a `let mut` variable in both branches"
)]
pub trait StaticCond {
    /// The condition.
    fn get(self) -> bool;
}
impl StaticCond for bool {
    fn get(self) -> bool {
        self
    }
}

/// `if cond { a } else { b }` as a value: the branch is picked when the kernel is built.
///
/// # Errors
/// The picked branch's error.
pub fn if_value<R>(
    b: &mut KernelBuilder,
    cond: impl StaticCond,
    then: impl FnOnce(&mut KernelBuilder) -> Result<R>,
    otherwise: impl FnOnce(&mut KernelBuilder) -> Result<R>,
) -> Result<R> {
    if cond.get() {
        then(b)
    } else {
        otherwise(b)
    }
}

/// The bounds of a `for` loop: two build-time `u32`s unroll the loop when the kernel is built
/// (the index is a Rust `u32`); any `Val<u32>` makes it an IR loop (the index is a `Val<u32>`).
#[diagnostic::on_unimplemented(
    message = "a `for` loop in a kernel runs over `u32` bounds, not `{Self}..{End}`",
    note = "write `for i in start..end` with `u32` bounds (or `(start..end).step_by(k)`)"
)]
pub trait Bounds<End> {
    /// The loop index: `u32` (unrolled) or `Val<u32>`.
    type Index;
    /// Runs (or emits) the loop.
    fn run(
        self,
        end: End,
        step: u32,
        b: &mut KernelBuilder,
        body: impl FnMut(&mut KernelBuilder, Self::Index) -> Result<()>,
    ) -> Result<()>;
}

impl Bounds<u32> for u32 {
    type Index = u32;
    fn run(
        self,
        end: u32,
        step: u32,
        b: &mut KernelBuilder,
        mut body: impl FnMut(&mut KernelBuilder, u32) -> Result<()>,
    ) -> Result<()> {
        for i in (self..end).step_by(step.max(1) as usize) {
            body(b, i)?;
        }
        Ok(())
    }
}

macro_rules! ir_bounds {
    ($($s:ty, $e:ty);*) => {$(
        impl Bounds<$e> for $s {
            type Index = Val<u32>;
            fn run(
                self,
                end: $e,
                step: u32,
                b: &mut KernelBuilder,
                mut body: impl FnMut(&mut KernelBuilder, Val<u32>) -> Result<()>,
            ) -> Result<()> {
                let (start, end) = (self.lift(b), end.lift(b));
                let result = RefCell::new(Ok(()));
                b.for_range(start.value(), end.value(), step, |b, i| {
                    *result.borrow_mut() = body(b, Val::from_value(i));
                });
                result.into_inner()
            }
        }
    )*};
}
ir_bounds!(Val<u32>, Val<u32>; Val<u32>, u32; u32, Val<u32>);

/// `for i in (start..end).step_by(step) { body }` (see [`Bounds`]).
///
/// # Errors
/// The body's first error.
pub fn for_<S: Bounds<E>, E>(
    b: &mut KernelBuilder,
    start: S,
    end: E,
    step: u32,
    body: impl FnMut(&mut KernelBuilder, S::Index) -> Result<()>,
) -> Result<()> {
    start.run(end, step, b, body)
}

/// An `#[accumulate(order)] for i in 0..len { ...; acc = sum(a * b); ... }` loop: each `acc`
/// ends holding the sum over the loop of its `a * b` in `order` (the IR's `accumulate`; the
/// variables' earlier values are not added). `body` returns the factor pairs in the order of
/// `vars`.
///
/// # Errors
/// The body's error.
pub fn accumulate(
    b: &mut KernelBuilder,
    len: impl Lift<u32>,
    order: ReduceOrder,
    vars: &[Var<f32>],
    body: impl FnOnce(&mut KernelBuilder, Val<u32>) -> Result<Vec<(Val<f32>, Val<f32>)>>,
) -> Result<()> {
    let len = len.lift(b);
    let ids: Vec<VarId> = vars.iter().map(|v| v.id).collect();
    let mut result = Ok(());
    b.accumulate(len.value(), order, &ids, |b, i| {
        match body(b, Val::from_value(i)) {
            Ok(pairs) => pairs.iter().map(|(x, y)| (x.value(), y.value())).collect(),
            Err(e) => {
                result = Err(e);
                Vec::new()
            }
        }
    });
    result
}

/// How a helper receives a bare scalar parameter or variable name: as the handle (a helper
/// parameter typed `Scalar<T>` or `Var<T>`) or as its current value (`Val<T>`).
pub trait Pass<H> {
    /// Converts the handle.
    fn pass(b: &mut KernelBuilder, h: H) -> Self;
}
impl<X> Pass<X> for X {
    fn pass(_: &mut KernelBuilder, h: X) -> X {
        h
    }
}
impl<T: Kind> Pass<Var<T>> for Val<T> {
    fn pass(b: &mut KernelBuilder, h: Var<T>) -> Val<T> {
        h.read(b)
    }
}
impl<T: Kind> Pass<Scalar<T>> for Val<T> {
    fn pass(b: &mut KernelBuilder, h: Scalar<T>) -> Val<T> {
        h.read(b)
    }
}

/// A handle passed to a helper (see [`Pass`]).
pub fn pass<H, X: Pass<H>>(b: &mut KernelBuilder, h: H) -> X {
    X::pass(b, h)
}

/// The current value of an optional (`#[when]`) scalar parameter or variable, if present.
pub fn read_option<R: Read>(b: &mut KernelBuilder, r: Option<R>) -> Option<Val<R::Out>> {
    r.map(|r| r.read(b))
}
