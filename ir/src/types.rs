//! Element types of buffers, types of values, constants and rounding modes.

use std::fmt;

/// Element type of a buffer parameter (its storage layout in memory, little endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32, 4 bytes.
    F32,
    /// IEEE binary16, 2 bytes.
    F16,
    /// bfloat16 (upper half of a binary32), 2 bytes.
    BF16,
    /// Unsigned byte.
    U8,
    /// Signed byte (two's complement).
    I8,
    /// Signed 32-bit integer (two's complement).
    I32,
    /// Unsigned 32-bit integer.
    U32,
}

impl DType {
    /// All buffer dtypes, in a fixed order.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::U8,
        DType::I8,
        DType::I32,
        DType::U32,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::I8 => 1,
        }
    }

    /// The value type a load from such a buffer produces: floats widen exactly to `f32`,
    /// unsigned integers zero-extend to `u32`, signed integers sign-extend to `i32`.
    pub const fn value_type(self) -> ScalarType {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => ScalarType::F32,
            DType::U8 | DType::U32 => ScalarType::U32,
            DType::I8 | DType::I32 => ScalarType::I32,
        }
    }

    /// True for the narrow float formats whose stores need a named rounding.
    pub const fn is_narrow_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }

    /// True for `f32`, `f16` and `bf16`.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The name used in the text form and in kernel names (`f32`, `bf16`, `u8`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::U32 => "u32",
        }
    }

    /// Parses a name produced by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Type of an SSA value inside a kernel body. Values are 32-bit scalars or booleans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// IEEE binary32.
    F32,
    /// Unsigned 32-bit integer (wrapping arithmetic).
    U32,
    /// Signed 32-bit integer (two's complement, wrapping arithmetic).
    I32,
    /// Boolean (result of comparisons, condition of `select` / `if`).
    Bool,
}

impl ScalarType {
    /// All value types.
    pub const ALL: [ScalarType; 4] = [
        ScalarType::F32,
        ScalarType::U32,
        ScalarType::I32,
        ScalarType::Bool,
    ];

    /// The name used in the text form.
    pub const fn name(self) -> &'static str {
        match self {
            ScalarType::F32 => "f32",
            ScalarType::U32 => "u32",
            ScalarType::I32 => "i32",
            ScalarType::Bool => "bool",
        }
    }

    /// Parses a name produced by [`ScalarType::name`].
    pub fn from_name(name: &str) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// True for `u32` and `i32`.
    pub const fn is_int(self) -> bool {
        matches!(self, ScalarType::U32 | ScalarType::I32)
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A typed constant. Floats are kept as their bit pattern so that `-0.0` and NaN payloads
/// survive printing, parsing and hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// An `f32`, as its IEEE bit pattern.
    F32(u32),
    /// A `u32`.
    U32(u32),
    /// An `i32`.
    I32(i32),
    /// A boolean.
    Bool(bool),
}

impl Scalar {
    /// An `f32` constant from its value.
    pub fn f32(v: f32) -> Scalar {
        Scalar::F32(v.to_bits())
    }

    /// The type of this constant.
    pub const fn ty(self) -> ScalarType {
        match self {
            Scalar::F32(_) => ScalarType::F32,
            Scalar::U32(_) => ScalarType::U32,
            Scalar::I32(_) => ScalarType::I32,
            Scalar::Bool(_) => ScalarType::Bool,
        }
    }

    /// The 32 raw bits of the value (`bool` is 0 or 1).
    pub const fn bits(self) -> u32 {
        match self {
            Scalar::F32(b) | Scalar::U32(b) => b,
            Scalar::I32(v) => v as u32,
            Scalar::Bool(b) => b as u32,
        }
    }

    /// Rebuilds a constant of type `ty` from raw bits (inverse of [`Scalar::bits`]).
    pub const fn from_bits(ty: ScalarType, bits: u32) -> Scalar {
        match ty {
            ScalarType::F32 => Scalar::F32(bits),
            ScalarType::U32 => Scalar::U32(bits),
            ScalarType::I32 => Scalar::I32(bits as i32),
            ScalarType::Bool => Scalar::Bool(bits != 0),
        }
    }
}

/// A named rounding mode, carried by every conversion that can round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// Round to nearest, ties to even (`rne`).
    NearestEven,
    /// Round toward zero / truncate (`rtz`).
    TowardZero,
    /// Round toward negative infinity / floor (`rdn`).
    Down,
    /// Round toward positive infinity / ceil (`rup`).
    Up,
}

impl Rounding {
    /// All rounding modes.
    pub const ALL: [Rounding; 4] = [
        Rounding::NearestEven,
        Rounding::TowardZero,
        Rounding::Down,
        Rounding::Up,
    ];

    /// The name used in the text form.
    pub const fn name(self) -> &'static str {
        match self {
            Rounding::NearestEven => "rne",
            Rounding::TowardZero => "rtz",
            Rounding::Down => "rdn",
            Rounding::Up => "rup",
        }
    }

    /// Parses a name produced by [`Rounding::name`].
    pub fn from_name(name: &str) -> Option<Rounding> {
        Rounding::ALL.into_iter().find(|r| r.name() == name)
    }
}
