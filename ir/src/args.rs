//! Binding launch arguments to a kernel's parameters: the one check shared by the interpreter and
//! every device.

use crate::error::{Error, Result};
use crate::kernel::{Dim, Kernel, ParamKind};
use crate::types::Scalar;

/// One launch argument, in parameter order. Buffers are raw little-endian bytes; their length
/// must be exactly `element count * dtype size`.
#[derive(Debug)]
pub enum Arg<'a> {
    /// Bytes of a `Read` buffer.
    Read(&'a [u8]),
    /// Bytes of a `Write` or `ReadWrite` buffer.
    Write(&'a mut [u8]),
    /// A scalar (its type must match the parameter's).
    Scalar(Scalar),
}

/// What binding found: the grid size and each buffer's element count (0 for scalars).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Number of work items.
    pub grid: u32,
    /// Element count per parameter (0 for scalar parameters).
    pub elements: Vec<usize>,
}

/// Checks `args` against `kernel`'s parameters and evaluates the symbolic sizes.
///
/// # Errors
/// [`Error::Argument`] naming the parameter when the count, kind, access, scalar type or buffer
/// byte length is wrong, or a dim parameter is not a `u32` scalar.
pub fn bind(kernel: &Kernel, args: &[Arg<'_>]) -> Result<Binding> {
    let err = |param: &str, message: String| Error::Argument {
        kernel: kernel.name.clone(),
        param: param.to_string(),
        message,
    };
    if args.len() != kernel.params.len() {
        // Name the first parameter without an argument, or the last one when there are extras.
        let (param, what) = match kernel.params.iter().nth(args.len()) {
            Some((_, p)) => (p.name.as_str(), "missing from here on"),
            None => (
                kernel
                    .params
                    .iter()
                    .last()
                    .map_or("*", |(_, p)| p.name.as_str()),
                "extra arguments after this last parameter",
            ),
        };
        return Err(err(
            param,
            format!(
                "expected {} arguments, got {} ({what})",
                kernel.params.len(),
                args.len()
            ),
        ));
    }
    let dim = |d: &Dim| -> Result<u64> {
        match d {
            Dim::Const(c) => Ok(*c as u64),
            Dim::Param(p) => match args.get(p.index()) {
                Some(Arg::Scalar(Scalar::U32(v))) => Ok(*v as u64),
                _ => Err(err(
                    kernel.params.try_get(*p).map_or("?", |p| p.name.as_str()),
                    "a size parameter must be passed as a u32 scalar".into(),
                )),
            },
        }
    };
    let mut elements = Vec::with_capacity(args.len());
    for ((_, param), arg) in kernel.params.iter().zip(args) {
        match (&param.kind, arg) {
            (ParamKind::Scalar(ty), Arg::Scalar(s)) => {
                if s.ty() != *ty {
                    return Err(err(
                        &param.name,
                        format!("expected a {ty} scalar, got {}", s.ty()),
                    ));
                }
                elements.push(0);
            }
            (ParamKind::Scalar(ty), _) => {
                return Err(err(
                    &param.name,
                    format!("expected a {ty} scalar, got a buffer"),
                ));
            }
            (
                ParamKind::Buffer {
                    dtype,
                    shape,
                    access,
                },
                arg,
            ) => {
                let bytes = match arg {
                    Arg::Read(b) if !access.can_write() => b.len(),
                    Arg::Write(b) if access.can_write() => b.len(),
                    Arg::Scalar(_) => {
                        return Err(err(
                            &param.name,
                            format!("expected a {dtype} buffer, got a scalar"),
                        ))
                    }
                    _ => {
                        return Err(err(
                            &param.name,
                            format!("{} buffer passed with the wrong access", access.name()),
                        ))
                    }
                };
                let mut n: u64 = 1;
                for d in shape {
                    n = n.saturating_mul(dim(d)?);
                }
                let want = n.saturating_mul(dtype.size_bytes() as u64);
                if want != bytes as u64 {
                    return Err(err(
                        &param.name,
                        format!("expected {n} {dtype} elements ({want} bytes), got {bytes} bytes"),
                    ));
                }
                elements.push(n as usize);
            }
        }
    }
    let grid = dim(&kernel.grid)?;
    let grid = u32::try_from(grid).map_err(|_| err("grid", format!("grid {grid} exceeds u32")))?;
    Ok(Binding { grid, elements })
}

/// An owned launch argument: what tests, `qforge check` and the op library's example inputs
/// hold before borrowing them as [`Arg`]s.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedArg {
    /// Bytes of a `Read` buffer.
    Read(Vec<u8>),
    /// Bytes of a `Write` or `ReadWrite` buffer (initial contents; the kernel's output after
    /// the launch).
    Write(Vec<u8>),
    /// A scalar.
    Scalar(Scalar),
}

impl OwnedArg {
    /// Borrows a list of owned arguments as launch arguments.
    pub fn borrow_all(args: &mut [OwnedArg]) -> Vec<Arg<'_>> {
        args.iter_mut()
            .map(|a| match a {
                OwnedArg::Read(b) => Arg::Read(b),
                OwnedArg::Write(b) => Arg::Write(b),
                OwnedArg::Scalar(s) => Arg::Scalar(*s),
            })
            .collect()
    }

    /// Copies launch arguments into owned ones (e.g. the positional list a typed kernel's
    /// named arguments produce, `dsl::TypedKernel::args`).
    pub fn copy_all(args: &[Arg<'_>]) -> Vec<OwnedArg> {
        args.iter()
            .map(|a| match a {
                Arg::Read(b) => OwnedArg::Read(b.to_vec()),
                Arg::Write(b) => OwnedArg::Write(b.to_vec()),
                Arg::Scalar(s) => OwnedArg::Scalar(*s),
            })
            .collect()
    }
}

/// Counts the elements of the writable buffers of `kernel` that differ between two argument
/// lists (after two launches on the same inputs). Floats compare by bits, except that any two
/// NaNs are equal (the numeric contract's only relaxation). Returns `(mismatches, elements)`.
pub fn count_mismatches(kernel: &Kernel, a: &[OwnedArg], b: &[OwnedArg]) -> (usize, usize) {
    use crate::types::DType;
    let (mut bad, mut total) = (0, 0);
    for (((_, param), x), y) in kernel.params.iter().zip(a).zip(b) {
        let (ParamKind::Buffer { dtype, .. }, OwnedArg::Write(x), OwnedArg::Write(y)) =
            (&param.kind, x, y)
        else {
            continue;
        };
        let size = dtype.size_bytes();
        if x.len() != y.len() {
            bad += x.len().max(y.len()) / size;
            total += x.len().max(y.len()) / size;
            continue;
        }
        for (ex, ey) in x.chunks_exact(size).zip(y.chunks_exact(size)) {
            total += 1;
            let same = ex == ey
                || match dtype {
                    DType::F32 => {
                        let f = |e: &[u8]| f32::from_le_bytes([e[0], e[1], e[2], e[3]]).is_nan();
                        f(ex) && f(ey)
                    }
                    DType::F16 => {
                        let f = |e: &[u8]| half::f16::from_le_bytes([e[0], e[1]]).is_nan();
                        f(ex) && f(ey)
                    }
                    DType::BF16 => {
                        let f = |e: &[u8]| half::bf16::from_le_bytes([e[0], e[1]]).is_nan();
                        f(ex) && f(ey)
                    }
                    _ => false,
                };
            if !same {
                bad += 1;
            }
        }
    }
    (bad, total)
}
