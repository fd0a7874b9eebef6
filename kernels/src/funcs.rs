//! The library's shared IR fragments as kernel-language helpers, for macro-built kernels (the
//! library's and users'): each follows the `#[qforge::func]` calling convention (the builder
//! first, a `Result`) and wraps the builder fragment of `emit` (or an IR routine of
//! `qforge_ir::routines`), so both forms emit the same IR.

use crate::{emit, maps, QuantType};
use qforge_ir::dsl::{Buf, Elem, Kind, Readable, Table, Val, Var};
use qforge_ir::KernelBuilder;
use qforge_ir::{DType, Result};

/// `(start, end)` of block `item` of `size` elements, clamped to `limit`: `start = item * size`,
/// `end = min(start + size, limit)`, or `end = start` when `start >= limit` (all `u32`).
///
/// # Errors
/// None (the `Result` is the helper calling convention).
pub fn block_range(
    b: &mut KernelBuilder,
    item: Val<u32>,
    size: u32,
    limit: Val<u32>,
) -> Result<(Val<u32>, Val<u32>)> {
    let (s, e) = emit::block_range(b, item.value(), size, limit.value());
    Ok((Val::from_value(s), Val::from_value(e)))
}

/// `1.0 / max(absmax, 1e-38)` in `f32` (bitsandbytes' clamp; a NaN absmax propagates).
///
/// # Errors
/// None (the helper calling convention).
pub fn inv_absmax(b: &mut KernelBuilder, absmax: Val<f32>) -> Result<Val<f32>> {
    Ok(Val::from_value(emit::inv_absmax(b, absmax.value())))
}

/// `buf[index]` when `index < limit`, else `+0.0` (no load out of bounds), through a variable
/// called `name`.
///
/// # Errors
/// None (the helper calling convention).
pub fn load_f32_or_zero<P>(
    b: &mut KernelBuilder,
    buf: Buf<P>,
    index: Val<u32>,
    limit: Val<u32>,
    name: &str,
) -> Result<Val<f32>>
where
    P: Readable,
    P::Elem: Elem<Value = f32>,
{
    Ok(Val::from_value(emit::load_f32_or_zero(
        b,
        buf.id(),
        index.value(),
        limit.value(),
        name,
    )))
}

/// `count` kernel variables of type `T` called `{prefix}0`, `{prefix}1`, ... (e.g. the
/// accumulators of a tile, whose number is a build-time value).
///
/// # Errors
/// None (the helper calling convention).
pub fn vars<T: Kind>(b: &mut KernelBuilder, count: usize, prefix: &str) -> Result<Vec<Var<T>>> {
    Ok((0..count)
        .map(|i| qforge_ir::dsl::var::<T>(b, &format!("{prefix}{i}")))
        .collect())
}

/// `v` rounded (nearest even) to `dtype` and widened back to `f32` (unchanged for `f32`): the
/// IR routine [`qforge_ir::routines::round::round_to`].
///
/// # Errors
/// None (the helper calling convention).
pub fn round_to(b: &mut KernelBuilder, v: Val<f32>, dtype: DType) -> Result<Val<f32>> {
    Ok(Val::from_value(qforge_ir::routines::round::round_to(
        b,
        v.value(),
        dtype,
    )))
}

/// The tables of one 4-bit quant type, declared once per kernel ([`coder4`]).
#[derive(Clone, Copy, Debug)]
pub enum Coder4 {
    /// NF4: the 15 midpoints (`nf4_midpoints`).
    Nf4 {
        /// The sorted decision midpoints.
        midpoints: Table<f32>,
    },
    /// FP4: the magnitude thresholds and the magnitude codes.
    Fp4 {
        /// `fp4_thresholds`.
        thresholds: Table<f32>,
        /// `fp4_magnitude_codes`.
        mag_codes: Table<u32>,
    },
}

/// Declares the code tables of `qt` (`nf4_midpoints`; or `fp4_thresholds` and
/// `fp4_magnitude_codes`).
///
/// # Errors
/// None (the helper calling convention).
pub fn coder4(b: &mut KernelBuilder, qt: QuantType) -> Result<Coder4> {
    Ok(match qt {
        QuantType::Nf4 => Coder4::Nf4 {
            midpoints: qforge_ir::dsl::table_f32(b, "nf4_midpoints", &maps::nf4_midpoints()),
        },
        QuantType::Fp4 => Coder4::Fp4 {
            thresholds: qforge_ir::dsl::table_f32(
                b,
                "fp4_thresholds",
                &emit::fp4_thresholds(&maps::fp4_midpoints()),
            ),
            mag_codes: qforge_ir::dsl::table_u32(
                b,
                "fp4_magnitude_codes",
                &maps::FP4_MAGNITUDE_CODES,
            ),
        },
    })
}

/// The 4-bit code (`u32`, 0..=15) of the scaled value `v` with bitsandbytes' CUDA choices: NF4
/// counts the midpoints `m` with `!(v <= m)` (ties down, NaN 15); FP4 takes the sign bit and
/// the magnitude index (ties to the lower magnitude for a positive sign, NaN 3). See
/// `quant4`'s module docs.
///
/// # Errors
/// None (the helper calling convention).
pub fn code4(b: &mut KernelBuilder, coder: Coder4, v: Val<f32>) -> Result<Val<u32>> {
    Ok(Val::from_value(match coder {
        Coder4::Nf4 { midpoints } => emit::nf4_code(b, v.value(), midpoints.id()),
        Coder4::Fp4 {
            thresholds,
            mag_codes,
        } => emit::fp4_code(b, v.value(), thresholds.id(), mag_codes.id()),
    }))
}

/// The IR routines of [`qforge_ir::routines::math`] (fixed coefficients, the same bits on every
/// backend) in the helper calling convention.
macro_rules! math_func {
    ($($name:ident),*) => {$(
        #[doc = concat!("`", stringify!($name), "(x)` of [`qforge_ir::routines::math::", stringify!($name), "`].")]
        ///
        /// # Errors
        /// None (the helper calling convention).
        pub fn $name(b: &mut KernelBuilder, x: Val<f32>) -> Result<Val<f32>> {
            Ok(Val::from_value(qforge_ir::routines::math::$name(b, x.value())))
        }
    )*};
}
math_func!(exp, erf, tanh, sigmoid);
