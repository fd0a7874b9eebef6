//! Kernel parameters, tables and memory in the kernel language: buffers (`In<E>`, `Out<E>`,
//! `InOut<E>` parameters become [`Buf`] handles), scalar parameters ([`Scalar`]), constant
//! tables ([`Table`]), loads (`buf[i]`), stores (`buf[i] = v`, or [`store_rounded`] for narrow
//! floats), table lookups (`table[i]`), [`search_sorted`] and the reductions.

use std::marker::PhantomData;

use crate::builder::KernelBuilder;
use crate::error::{Error, Result};
use crate::kernel::{Access, Dim, ParamId, TableId};
use crate::ops::{NanMode, ReduceOrder};
use crate::types::{DType, Rounding};

use super::value::{Kind, Lift, Val};

/// Access of a buffer parameter: read only.
#[derive(Clone, Copy, Debug)]
pub struct In<E = f32>(PhantomData<E>);
/// Access of a buffer parameter: write only (the kernel must not load it).
#[derive(Clone, Copy, Debug)]
pub struct Out<E = f32>(PhantomData<E>);
/// Access of a buffer parameter: read and write.
#[derive(Clone, Copy, Debug)]
pub struct InOut<E = f32>(PhantomData<E>);

/// A buffer parameter type (`In<E>`, `Out<E>`, `InOut<E>`): its access and element type.
pub trait BufferParam {
    /// The element type.
    type Elem: Elem;
    /// The IR access.
    const ACCESS: Access;
}
impl<E: Elem> BufferParam for In<E> {
    type Elem = E;
    const ACCESS: Access = Access::Read;
}
impl<E: Elem> BufferParam for Out<E> {
    type Elem = E;
    const ACCESS: Access = Access::Write;
}
impl<E: Elem> BufferParam for InOut<E> {
    type Elem = E;
    const ACCESS: Access = Access::ReadWrite;
}

/// A buffer parameter the kernel may load from.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is write-only: a kernel cannot load from an `Out<_>` buffer",
    label = "loaded here",
    note = "declare the parameter `InOut<_>` to load and store it"
)]
pub trait Readable: BufferParam {}
impl<E: Elem> Readable for In<E> {}
impl<E: Elem> Readable for InOut<E> {}

/// A buffer parameter the kernel may store into.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is read-only: a kernel cannot store into an `In<_>` buffer",
    label = "stored here",
    note = "declare the parameter `Out<_>` (or `InOut<_>`) to store into it"
)]
pub trait Writable: BufferParam {}
impl<E: Elem> Writable for Out<E> {}
impl<E: Elem> Writable for InOut<E> {}

/// `f16` elements (loads widen exactly to `f32`; stores need a rounding).
#[derive(Clone, Copy, Debug)]
pub struct F16;
/// `bf16` elements (loads widen exactly to `f32`; stores need a rounding).
#[derive(Clone, Copy, Debug)]
pub struct BF16;
/// Float elements whose dtype (`f32`, `f16` or `bf16`) is a build-time value, given with the
/// parameter's `#[dtype(...)]`; stores need a rounding (none is applied to `f32`).
#[derive(Clone, Copy, Debug)]
pub struct Float;

/// An element type in memory: what a load gives (its kernel type) and its dtype.
pub trait Elem: Copy + 'static {
    /// The kernel type of a loaded element.
    type Value: Kind;
    /// The dtype, or `None` when it is chosen when the kernel is built ([`Float`]).
    const DTYPE: Option<DType>;
}
macro_rules! elem {
    ($($t:ty => $v:ty, $d:expr);*) => {$(
        impl Elem for $t {
            type Value = $v;
            const DTYPE: Option<DType> = $d;
        }
    )*};
}
elem!(f32 => f32, Some(DType::F32); u32 => u32, Some(DType::U32); i32 => i32, Some(DType::I32);
      u8 => u32, Some(DType::U8); i8 => i32, Some(DType::I8); F16 => f32, Some(DType::F16);
      BF16 => f32, Some(DType::BF16); Float => f32, None);

/// An element type a plain `buf[i] = v` stores without rounding.
#[diagnostic::on_unimplemented(
    message = "storing into a `{Self}` buffer needs a rounding",
    label = "`buf[i] = v` cannot round",
    note = "write `store_rounded(buf, i, v, Rounding::NearestEven)` (f16 and bf16 stores round to nearest even)"
)]
pub trait PlainStore: Elem {}
impl PlainStore for f32 {}
impl PlainStore for u32 {}
impl PlainStore for i32 {}
impl PlainStore for u8 {}
impl PlainStore for i8 {}

/// A buffer parameter of the kernel being built.
pub struct Buf<P: BufferParam> {
    id: ParamId,
    _p: PhantomData<P>,
}
impl<P: BufferParam> Clone for Buf<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: BufferParam> Copy for Buf<P> {}

impl<P: BufferParam> Buf<P> {
    /// The parameter's handle.
    pub fn id(self) -> ParamId {
        self.id
    }
}

/// A scalar parameter (`n: u32`, `beta: f32`, ...): its value is read where it is used.
pub struct Scalar<T: Kind> {
    id: ParamId,
    _t: PhantomData<T>,
}
impl<T: Kind> Clone for Scalar<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Kind> Copy for Scalar<T> {}

impl<T: Kind> Scalar<T> {
    /// The parameter's handle.
    pub fn id(self) -> ParamId {
        self.id
    }
}

/// A constant table of the kernel (`table[i]` reads `table[min(i, len - 1)]`).
pub struct Table<T: Kind> {
    id: TableId,
    _t: PhantomData<T>,
}
impl<T: Kind> Clone for Table<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Kind> Copy for Table<T> {}

impl<T: Kind> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table<{}>({:?})", T::TY, self.id)
    }
}
impl<T: Kind> std::fmt::Debug for Scalar<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scalar<{}>({:?})", T::TY, self.id)
    }
}
impl<P: BufferParam> std::fmt::Debug for Buf<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({:?}, {:?})", self.id, P::ACCESS)
    }
}

impl<T: Kind> Table<T> {
    /// The table's handle.
    pub fn id(self) -> TableId {
        self.id
    }
}

/// A dimension of a buffer's shape: a `u32` scalar parameter or a build-time size.
pub trait IntoDim {
    /// The IR dim.
    fn dim(self) -> Dim;
}
impl IntoDim for Scalar<u32> {
    fn dim(self) -> Dim {
        Dim::Param(self.id)
    }
}
impl IntoDim for u32 {
    fn dim(self) -> Dim {
        Dim::Const(self)
    }
}

/// Declares the scalar parameter `name`.
pub fn scalar_param<T: Kind>(b: &mut KernelBuilder, name: &str) -> Scalar<T> {
    Scalar {
        id: b.scalar_param(name, T::TY),
        _t: PhantomData,
    }
}

/// Declares the buffer parameter `name` of type `P` and `shape`; `dtype` is the dtype of a
/// [`Float`] buffer (and must be `None` for the others, whose dtype is their element type).
///
/// # Errors
/// [`Error::Unsupported`] naming the parameter when a `Float` buffer gets no dtype or a
/// non-float one, or another buffer gets one.
pub fn buffer_param<P: BufferParam>(
    b: &mut KernelBuilder,
    name: &str,
    dtype: Option<DType>,
    shape: &[Dim],
) -> Result<Buf<P>> {
    let dtype = match (P::Elem::DTYPE, dtype) {
        (Some(d), None) => d,
        (None, Some(d)) if d.is_float() => d,
        (None, Some(d)) => {
            return Err(Error::Unsupported(format!(
                "parameter '{name}': a Float buffer takes f32, f16 or bf16, not {d}"
            )))
        }
        (None, None) => {
            return Err(Error::Unsupported(format!(
                "parameter '{name}': a Float buffer needs #[dtype(...)]"
            )))
        }
        (Some(d), Some(_)) => {
            return Err(Error::Unsupported(format!(
                "parameter '{name}': #[dtype(...)] is only for Float buffers; this one holds {d}"
            )))
        }
    };
    Ok(Buf {
        id: b.buffer_param(name, dtype, shape, P::ACCESS),
        _p: PhantomData,
    })
}

/// Declares an `f32` table.
pub fn table_f32(b: &mut KernelBuilder, name: &str, data: &[f32]) -> Table<f32> {
    Table {
        id: b.table_f32(name, data),
        _t: PhantomData,
    }
}

/// Declares a `u32` table.
pub fn table_u32(b: &mut KernelBuilder, name: &str, data: &[u32]) -> Table<u32> {
    Table {
        id: b.table_u32(name, data),
        _t: PhantomData,
    }
}

/// Something a kernel reads with `x[i]`: a loadable buffer (a load) or a table (a lookup).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be indexed in a kernel",
    note = "`x[i]` loads from an `In<_>`/`InOut<_>` buffer parameter or reads a table"
)]
pub trait KIndex {
    /// The kernel type read.
    type Out: Kind;
    /// Emits the load or lookup.
    fn read_at(self, b: &mut KernelBuilder, index: Val<u32>) -> Val<Self::Out>;
}
impl<P: Readable> KIndex for Buf<P> {
    type Out = <P::Elem as Elem>::Value;
    fn read_at(self, b: &mut KernelBuilder, index: Val<u32>) -> Val<Self::Out> {
        Val::from_value(b.load(self.id, index.value()))
    }
}
impl<T: Kind> KIndex for Table<T> {
    type Out = T;
    fn read_at(self, b: &mut KernelBuilder, index: Val<u32>) -> Val<T> {
        Val::from_value(b.lookup(self.id, index.value()))
    }
}

/// `x[index]`: a load from a buffer or a table lookup.
pub fn index<X: KIndex>(b: &mut KernelBuilder, x: X, index: impl Lift<u32>) -> Val<X::Out> {
    let index = index.lift(b);
    x.read_at(b, index)
}

/// `buf[index] = value` for element types that need no rounding.
pub fn store<P>(
    b: &mut KernelBuilder,
    buf: Buf<P>,
    index: impl Lift<u32>,
    value: impl Lift<<P::Elem as Elem>::Value>,
) where
    P: Writable,
    P::Elem: PlainStore,
{
    let index = index.lift(b);
    let value = value.lift(b);
    b.store(buf.id, index.value(), value.value());
}

/// `buf[index] = value` rounded with `rounding` to a narrow float dtype (`f16`, `bf16`, or a
/// [`Float`] buffer built as one); an `f32` buffer stores the value as it is.
pub fn store_rounded<P>(
    b: &mut KernelBuilder,
    buf: Buf<P>,
    index: impl Lift<u32>,
    value: impl Lift<f32>,
    rounding: Rounding,
) where
    P: Writable,
    P::Elem: Elem<Value = f32>,
{
    let index = index.lift(b);
    let value = value.lift(b);
    let narrow = match P::Elem::DTYPE {
        Some(d) => d.is_narrow_float(),
        None => b.kernel().params.try_get(buf.id).is_some_and(|p| {
            matches!(&p.kind, crate::kernel::ParamKind::Buffer { dtype, .. } if dtype.is_narrow_float())
        }),
    };
    if narrow {
        b.store_rounded(buf.id, index.value(), value.value(), rounding);
    } else {
        b.store(buf.id, index.value(), value.value());
    }
}

/// The number of entries of the sorted `f32` table below `value` (`Op::SearchSorted`).
pub fn search_sorted(b: &mut KernelBuilder, table: Table<f32>, value: impl Lift<f32>) -> Val<u32> {
    let value = value.lift(b);
    Val::from_value(b.search_sorted(table.id, value.value()))
}

/// The `f32` sum of `buf[start .. start + len]` in `order`.
pub fn reduce_sum<P>(
    b: &mut KernelBuilder,
    buf: Buf<P>,
    start: impl Lift<u32>,
    len: impl Lift<u32>,
    order: ReduceOrder,
) -> Val<f32>
where
    P: Readable,
    P::Elem: Elem<Value = f32>,
{
    let (start, len) = (start.lift(b), len.lift(b));
    Val::from_value(b.reduce_sum(buf.id, start.value(), len.value(), order))
}

/// `max |x|` over `buf[start .. start + len]`, from `+0.0`, NaN handled as `nan` says.
pub fn reduce_absmax<P>(
    b: &mut KernelBuilder,
    buf: Buf<P>,
    start: impl Lift<u32>,
    len: impl Lift<u32>,
    nan: NanMode,
) -> Val<f32>
where
    P: Readable,
    P::Elem: Elem<Value = f32>,
{
    let (start, len) = (start.lift(b), len.lift(b));
    Val::from_value(b.reduce_absmax(buf.id, start.value(), len.value(), nan))
}

/// The index of this work item in the grid (`u32`).
pub fn work_item(b: &mut KernelBuilder) -> Val<u32> {
    Val::from_value(b.work_item())
}
