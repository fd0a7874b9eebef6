//! Typed access to the launch arguments: decoding and encoding buffer elements (little endian)
//! straight from the argument byte slices, with bounds checks that report instead of panicking.

use crate::args::Arg;
use crate::handle::Handle;
use crate::kernel::{Kernel, ParamKind};
use crate::types::{DType, Rounding};

/// Why an access failed. Turned into [`crate::Error::Execution`] (with the parameter's name) by
/// the driver; kept small so the hot path stays cheap.
#[derive(Clone, Copy, Debug)]
pub(super) enum Fault {
    /// `load` or `store` of element `index` of parameter `param` whose length is `len`.
    OutOfBounds {
        what: &'static str,
        param: usize,
        index: u32,
        len: usize,
    },
    /// `reduce` over elements `start .. start + count` of parameter `param` of length `len`.
    RangeOutOfBounds {
        param: usize,
        start: u32,
        count: u32,
        len: usize,
    },
    /// The parameter cannot be used this way (not a buffer, not writable, not a float buffer,
    /// or a rounding the interpreter does not implement). The verifier and `bind` rule these
    /// out; they are reported rather than trusted.
    Misuse { param: usize, message: &'static str },
}

impl Fault {
    /// The message of the execution error, naming the buffer.
    pub(super) fn message(&self, kernel: &Kernel) -> String {
        let name = |p: usize| {
            kernel
                .params
                .try_get(Handle::from_index(p as u32))
                .map_or("?", |p| p.name.as_str())
        };
        match *self {
            Fault::OutOfBounds {
                what,
                param,
                index,
                len,
            } => format!(
                "{what} buffer '{}' at index {index} is out of bounds (length {len})",
                name(param)
            ),
            Fault::RangeOutOfBounds {
                param,
                start,
                count,
                len,
            } => format!(
                "reduce over buffer '{}' range {start}..{} is out of bounds (length {len})",
                name(param),
                start as u64 + count as u64
            ),
            Fault::Misuse { param, message } => format!("parameter '{}': {message}", name(param)),
        }
    }
}

/// The bytes behind one buffer argument.
enum Bytes<'a> {
    Read(&'a [u8]),
    Write(&'a mut [u8]),
}

/// One bound parameter.
enum Slot<'a> {
    /// A scalar's raw bits.
    Scalar(u32),
    /// A buffer: element type, element count and bytes.
    Buffer {
        dtype: DType,
        len: usize,
        bytes: Bytes<'a>,
    },
}

/// All bound parameters of one launch, in parameter order.
pub(super) struct Memory<'a> {
    slots: Vec<Slot<'a>>,
}

impl<'a> Memory<'a> {
    /// Borrows `args` (already checked by [`crate::bind`]) as typed slots. Element counts come
    /// from the byte lengths, so every in-bounds index is also in bounds of the byte slice.
    pub(super) fn new(kernel: &Kernel, args: &'a mut [Arg<'_>]) -> Memory<'a> {
        let slots = kernel
            .params
            .iter()
            .zip(args.iter_mut())
            .map(|((_, param), arg)| {
                let dtype = match &param.kind {
                    ParamKind::Buffer { dtype, .. } => Some(*dtype),
                    ParamKind::Scalar(_) => None,
                };
                match (arg, dtype) {
                    (Arg::Scalar(s), _) => Slot::Scalar(s.bits()),
                    (Arg::Read(b), Some(dtype)) => {
                        let b: &'a [u8] = b;
                        Slot::Buffer {
                            dtype,
                            len: b.len() / dtype.size_bytes(),
                            bytes: Bytes::Read(b),
                        }
                    }
                    (Arg::Write(b), Some(dtype)) => {
                        let b: &'a mut [u8] = b;
                        Slot::Buffer {
                            dtype,
                            len: b.len() / dtype.size_bytes(),
                            bytes: Bytes::Write(b),
                        }
                    }
                    // A buffer passed for a scalar parameter: `bind` rejects it.
                    (Arg::Read(_) | Arg::Write(_), None) => Slot::Scalar(0),
                }
            })
            .collect();
        Memory { slots }
    }

    /// The raw bits of scalar parameter `param`.
    #[inline]
    pub(super) fn scalar(&self, param: usize) -> Result<u32, Fault> {
        match self.slots.get(param) {
            Some(Slot::Scalar(bits)) => Ok(*bits),
            _ => Err(Fault::Misuse {
                param,
                message: "is not a scalar",
            }),
        }
    }

    /// Loads element `index` of buffer `param`, widened to a 32-bit value.
    #[inline]
    pub(super) fn load(&self, param: usize, index: u32) -> Result<u32, Fault> {
        let Some(Slot::Buffer { dtype, len, bytes }) = self.slots.get(param) else {
            return Err(Fault::Misuse {
                param,
                message: "is not a buffer",
            });
        };
        let i = index as usize;
        if i >= *len {
            return Err(Fault::OutOfBounds {
                what: "load from",
                param,
                index,
                len: *len,
            });
        }
        let bytes: &[u8] = match bytes {
            Bytes::Read(b) => b,
            Bytes::Write(b) => b,
        };
        Ok(decode(*dtype, bytes, i))
    }

    /// Stores the 32-bit value `bits` into element `index` of buffer `param`, narrowing to its
    /// dtype (`f16`/`bf16` with `rounding`, `u8`/`i8` keep the low 8 bits).
    #[inline]
    pub(super) fn store(
        &mut self,
        param: usize,
        index: u32,
        bits: u32,
        rounding: Option<Rounding>,
    ) -> Result<(), Fault> {
        let Some(Slot::Buffer { dtype, len, bytes }) = self.slots.get_mut(param) else {
            return Err(Fault::Misuse {
                param,
                message: "is not a buffer",
            });
        };
        let Bytes::Write(bytes) = bytes else {
            return Err(Fault::Misuse {
                param,
                message: "is not writable",
            });
        };
        let i = index as usize;
        if i >= *len {
            return Err(Fault::OutOfBounds {
                what: "store to",
                param,
                index,
                len: *len,
            });
        }
        match *dtype {
            DType::F32 | DType::U32 | DType::I32 => put(bytes, i, bits.to_le_bytes()),
            DType::U8 | DType::I8 => bytes[i] = bits as u8,
            DType::F16 => {
                check_rne(param, rounding)?;
                put(
                    bytes,
                    i,
                    half::f16::from_f32(f32::from_bits(bits))
                        .to_bits()
                        .to_le_bytes(),
                )
            }
            DType::BF16 => {
                check_rne(param, rounding)?;
                put(
                    bytes,
                    i,
                    half::bf16::from_f32(f32::from_bits(bits))
                        .to_bits()
                        .to_le_bytes(),
                )
            }
        }
        Ok(())
    }

    /// The dtype and bytes of elements `start .. start + count` of float buffer `param`.
    pub(super) fn float_range(
        &self,
        param: usize,
        start: u32,
        count: u32,
    ) -> Result<(DType, &[u8]), Fault> {
        let Some(Slot::Buffer { dtype, len, bytes }) = self.slots.get(param) else {
            return Err(Fault::Misuse {
                param,
                message: "is not a buffer",
            });
        };
        if !dtype.is_float() {
            return Err(Fault::Misuse {
                param,
                message: "is not a float buffer",
            });
        }
        let bytes: &[u8] = match bytes {
            Bytes::Read(b) => b,
            Bytes::Write(b) => b,
        };
        if count == 0 {
            // Nothing is read, so no element can be out of bounds.
            return Ok((*dtype, &[]));
        }
        let end = start as u64 + count as u64;
        if end > *len as u64 {
            return Err(Fault::RangeOutOfBounds {
                param,
                start,
                count,
                len: *len,
            });
        }
        let size = dtype.size_bytes();
        Ok((*dtype, &bytes[start as usize * size..end as usize * size]))
    }
}

/// Only round-to-nearest-even stores to `f16`/`bf16` exist so far (the verifier enforces it).
#[inline]
fn check_rne(param: usize, rounding: Option<Rounding>) -> Result<(), Fault> {
    match rounding {
        Some(Rounding::NearestEven) => Ok(()),
        None | Some(Rounding::TowardZero | Rounding::Down | Rounding::Up) => Err(Fault::Misuse {
            param,
            message: "stores to f16/bf16 need rounding rne (the only one implemented)",
        }),
    }
}

#[inline]
fn put<const N: usize>(bytes: &mut [u8], i: usize, v: [u8; N]) {
    bytes[i * N..i * N + N].copy_from_slice(&v);
}

/// Element `i` of a little-endian buffer of `dtype`, widened exactly to its 32-bit value type.
#[inline]
pub(super) fn decode(dtype: DType, bytes: &[u8], i: usize) -> u32 {
    match dtype {
        DType::F32 | DType::U32 | DType::I32 => {
            let b = &bytes[i * 4..i * 4 + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }
        DType::F16 => {
            let h = u16::from_le_bytes([bytes[i * 2], bytes[i * 2 + 1]]);
            half::f16::from_bits(h).to_f32().to_bits()
        }
        DType::BF16 => {
            let h = u16::from_le_bytes([bytes[i * 2], bytes[i * 2 + 1]]);
            half::bf16::from_bits(h).to_f32().to_bits()
        }
        DType::U8 => bytes[i] as u32,
        DType::I8 => bytes[i] as i8 as i32 as u32,
    }
}
