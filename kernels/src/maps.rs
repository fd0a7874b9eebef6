//! Code tables (quantization maps) with bitsandbytes' exact `f32` values.
//!
//! Each function reproduces the float32 arithmetic bitsandbytes does on CPU with torch, bit for
//! bit (checked against the golden `constants.safetensors` in `tests/golden.rs`):
//!
//! * `torch.linspace(start, end, steps)` in float32: `step = f32((end - start) / (steps - 1))`,
//!   element `i < steps/2` is `start + step*i` and the others `end - step*(steps-1-i)`, each with
//!   a single rounding (torch's kernel is compiled with FMA contraction). The product and sum are
//!   exact in `f64` here (24-bit by at most 8-bit operands, within 53 bits), so one `f64 -> f32`
//!   rounding reproduces the fused result.
//! * A Python float times a float32 tensor rounds the scalar to `f32` first, then multiplies in
//!   `f32`.

use crate::normal::normal_ppf;
use qforge_ir::{Error, Result};

/// `torch.linspace(start, end, steps, dtype=float32)` as described in the module docs.
pub fn linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    match steps {
        0 => Vec::new(),
        1 => vec![start],
        _ => {
            let step = (end - start) / (steps - 1) as f32;
            let half = steps / 2;
            (0..steps)
                .map(|i| {
                    let (base, k) = if i < half {
                        (start, i as f64)
                    } else {
                        (end, -((steps - 1 - i) as f64))
                    };
                    (base as f64 + step as f64 * k) as f32
                })
                .collect()
        }
    }
}

/// Python's `10 ** e` for an integer exponent (the correctly rounded `f64`), rounded to `f32` as
/// torch does with a Python scalar multiplying a float32 tensor.
fn pow10_scalar_f32(e: i32) -> f32 {
    let d: f64 = format!("1e{e}").parse().unwrap_or(f64::NAN);
    d as f32
}

/// bitsandbytes `create_dynamic_map(signed, max_exponent_bits, total_bits)`: the dynamic tree
/// (8-bit "dynamic") quantization map, 256 sorted `f32` values padded with zeros.
/// The defaults are `max_exponent_bits = 7`, `total_bits = 8`.
///
/// # Errors
/// [`Error::Unsupported`] when `total_bits` is not in `2..=8`, `max_exponent_bits` is not in
/// `1..=total_bits-1`, or (as bitsandbytes' own assertion) the unsigned map would not have
/// exactly `2^total_bits` entries.
pub fn create_dynamic_map(
    signed: bool,
    max_exponent_bits: u32,
    total_bits: u32,
) -> Result<Vec<f32>> {
    if !(2..=8).contains(&total_bits) {
        return Err(Error::Unsupported(format!(
            "create_dynamic_map: total_bits {total_bits} is not supported; allowed: 2..=8"
        )));
    }
    let non_sign_bits = total_bits - 1;
    if max_exponent_bits == 0 || max_exponent_bits > non_sign_bits {
        return Err(Error::Unsupported(format!(
            "create_dynamic_map: max_exponent_bits {max_exponent_bits} is not supported for total_bits \
             {total_bits}; allowed: 1..={non_sign_bits}"
        )));
    }
    let free = non_sign_bits - max_exponent_bits;
    let additional_items = (1usize << free) - 1;
    let mut data: Vec<f32> = Vec::with_capacity(256);
    let push_scaled = |data: &mut Vec<f32>, items: usize, exponent: i32| {
        let b = linspace_f32(0.1, 1.0, items);
        let means: Vec<f32> = b.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
        let s = pow10_scalar_f32(exponent);
        data.extend(means.iter().map(|m| s * m));
        if signed {
            data.extend(means.iter().map(|m| -s * m));
        }
    };
    let top = max_exponent_bits as i32 - 1;
    for i in 0..max_exponent_bits {
        let items = if signed {
            (1usize << (i + free)) + 1
        } else {
            (1usize << (i + free + 1)) + 1
        };
        push_scaled(&mut data, items, -top + i as i32);
    }
    if additional_items > 0 {
        // bitsandbytes reuses the last loop index here, so the scale is 10^0.
        push_scaled(&mut data, additional_items + 1, 0);
    }
    data.push(0.0);
    data.push(1.0);
    if data.len() != 1usize << total_bits {
        return Err(Error::Unsupported(format!(
            "create_dynamic_map(signed={signed}, max_exponent_bits={max_exponent_bits}, total_bits={total_bits}) \
             yields {} values instead of {}",
            data.len(),
            1usize << total_bits
        )));
    }
    data.resize(256, 0.0);
    data.sort_by(|a, b| a.total_cmp(b));
    Ok(data)
}

/// bitsandbytes `create_linear_map(signed, total_bits, add_zero)`: `linspace(-1 or 0, 1, k)` with
/// zeros inserted in the middle up to 256 entries. The defaults are `total_bits = 8`,
/// `add_zero = true`.
///
/// # Errors
/// [`Error::Unsupported`] when `total_bits` is not in `1..=8`.
pub fn create_linear_map(signed: bool, total_bits: u32, add_zero: bool) -> Result<Vec<f32>> {
    if !(1..=8).contains(&total_bits) {
        return Err(Error::Unsupported(format!(
            "create_linear_map: total_bits {total_bits} is not supported; allowed: 1..=8"
        )));
    }
    let sign = if signed { -1.0 } else { 0.0 };
    let mut total_values = 1usize << total_bits;
    if (add_zero || total_bits < 8) && signed {
        total_values -= 1;
    }
    let values = linspace_f32(sign, 1.0, total_values);
    let gap = 256 - values.len();
    if gap == 0 {
        return Ok(values);
    }
    let l = values.len() / 2;
    let mut out = values[..l].to_vec();
    out.extend(std::iter::repeat_n(0.0, gap));
    out.extend_from_slice(&values[l..]);
    Ok(out)
}

/// bitsandbytes `create_normal_map(offset, use_extra_value)`: the NormalFloat map, 256 sorted
/// values (mostly zeros) scaled so that the largest is 1. The defaults are
/// `offset = 0.9677083`, `use_extra_value = true` (this gives NF4).
///
/// Each quantile is scipy's `norm.ppf` of a float32 linspace value, computed in `f64` and rounded
/// to `f32` (scipy's float32 loop); the final division by the maximum is in `f32`.
///
/// # Errors
/// [`Error::Unsupported`] when `offset` is not in `(0.5, 1)`.
pub fn create_normal_map(offset: f32, use_extra_value: bool) -> Result<Vec<f32>> {
    if !(offset > 0.5 && offset < 1.0) {
        return Err(Error::Unsupported(format!(
            "create_normal_map: offset {offset} is not supported; allowed: 0.5 < offset < 1"
        )));
    }
    let ppf = |steps: usize| -> Vec<f32> {
        let q = linspace_f32(offset, 0.5, steps);
        q[..steps - 1]
            .iter()
            .map(|&q| normal_ppf(q as f64) as f32)
            .collect()
    };
    let (v1, zeros, v3) = if use_extra_value {
        (ppf(9), 256 - 15, ppf(8))
    } else {
        (ppf(8), 256 - 14, ppf(8))
    };
    let mut v: Vec<f32> = v1;
    v.extend(std::iter::repeat_n(0.0, zeros));
    v.extend(v3.iter().map(|x| -x));
    v.sort_by(|a, b| a.total_cmp(b));
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    Ok(v.iter().map(|x| x / max).collect())
}

/// The 16 NF4 code values (bitsandbytes `get_4bit_type("nf4")`), index = 4-bit code, ascending:
/// the distinct values of [`create_normal_map`] with the defaults (code 7 is 0), computed once.
pub fn nf4_code() -> [f32; 16] {
    static NF4: std::sync::OnceLock<[f32; 16]> = std::sync::OnceLock::new();
    *NF4.get_or_init(|| {
        let m = create_normal_map(0.967_708_3, true).unwrap_or_default();
        let mut out = [0.0f32; 16];
        if m.len() == 256 {
            out[..8].copy_from_slice(&m[..8]);
            out[8..].copy_from_slice(&m[248..]);
        }
        out
    })
}

/// The 16 FP4 code values exactly as bitsandbytes' `get_4bit_type("fp4")` builds its `code`
/// (1 sign bit, 2 exponent bits, 1 mantissa bit: `[0, 0.0625, 8, 12, 4, 6, 2, 3] / 12` and their
/// negatives, where Python's integer `-0` makes index 8 `+0.0`). This is the `quant_map` a
/// bitsandbytes checkpoint stores. The dequantization kernels use [`fp4_dequant_table`].
pub fn fp4_code() -> [f32; 16] {
    let mut out = fp4_dequant_table();
    out[8] = 0.0;
    out
}

/// The FP4 table of bitsandbytes' native (CUDA and C++) dequantization kernels: [`fp4_code`] with
/// `-0.0` at index 8, so code 8 ("negative zero") dequantizes to `-0.0`.
pub fn fp4_dequant_table() -> [f32; 16] {
    let mags = [0.0f32, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0];
    let mut out = [0.0f32; 16];
    for (i, m) in mags.iter().enumerate() {
        out[i] = m / 12.0;
        out[i + 8] = -(m / 12.0);
    }
    out
}

/// The 15 NF4 decision midpoints `f32((a + b) / 2)` of adjacent code values (float32 sum, then
/// an exact halving), ascending; identical to bitsandbytes' `nf4_quantize_midpoints`.
pub fn nf4_midpoints() -> [f32; 15] {
    let c = nf4_code();
    let mut m = [0.0f32; 15];
    for k in 0..15 {
        m[k] = (c[k] + c[k + 1]) / 2.0;
    }
    m
}

/// The 8 FP4 magnitudes in ascending order (`[0, 0.0625, 2, 3, 4, 6, 8, 12] / 12`).
pub fn fp4_magnitudes() -> [f32; 8] {
    let c = fp4_code();
    [c[0], c[1], c[6], c[7], c[4], c[5], c[2], c[3]]
}

/// The 3-bit FP4 code of each magnitude of [`fp4_magnitudes`] (`[0, 1, 6, 7, 4, 5, 2, 3]`).
pub const FP4_MAGNITUDE_CODES: [u32; 8] = [0, 1, 6, 7, 4, 5, 2, 3];

/// The 7 positive FP4 decision midpoints `f32((a + b) / 2)` between adjacent magnitudes,
/// ascending; identical to the positive half of bitsandbytes' `fp4_quantize_midpoints`.
pub fn fp4_midpoints() -> [f32; 7] {
    let m = fp4_magnitudes();
    let mut out = [0.0f32; 7];
    for k in 0..7 {
        out[k] = (m[k] + m[k + 1]) / 2.0;
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::excessive_precision)] // bitsandbytes' literals, kept verbatim
    use super::*;

    /// bitsandbytes' literal NF4 table in `get_4bit_type("nf4")` (Python floats, i.e. the
    /// shortest repr of each float32 value).
    const NF4_LITERAL: [f32; 16] = [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ];

    #[test]
    fn library_nf4_from_normal_map_equals_bitsandbytes_literal() {
        let got = nf4_code();
        for k in 0..16 {
            assert_eq!(
                got[k].to_bits(),
                NF4_LITERAL[k].to_bits(),
                "nf4[{k}] = {} want {}",
                got[k],
                NF4_LITERAL[k]
            );
        }
        let m = create_normal_map(0.967_708_3, true).unwrap();
        assert_eq!(m.iter().filter(|v| **v == 0.0).count(), 241);
    }

    #[test]
    fn library_fp4_code_has_negative_zero_at_8_only_in_the_dequant_table() {
        assert_eq!(fp4_dequant_table()[8].to_bits(), 0x8000_0000);
        assert_eq!(fp4_code()[8].to_bits(), 0);
        let c = fp4_code();
        assert_eq!(c[0].to_bits(), 0);
        assert_eq!(c[3], 1.0);
        assert_eq!(c[1], 0.0625f32 / 12.0);
        assert_eq!(
            fp4_magnitudes(),
            [
                0.0,
                0.0625f32 / 12.0,
                2.0 / 12.0,
                0.25,
                4.0 / 12.0,
                0.5,
                8.0 / 12.0,
                1.0
            ]
        );
        for (k, code) in FP4_MAGNITUDE_CODES.iter().enumerate() {
            assert_eq!(c[*code as usize], fp4_magnitudes()[k]);
        }
    }

    #[test]
    fn library_midpoints_are_sorted_and_strictly_inside() {
        let m = nf4_midpoints();
        assert!(m.windows(2).all(|w| w[0] < w[1]));
        assert!(m[0] > -1.0 && m[14] < 1.0);
        let f = fp4_midpoints();
        assert!(f.windows(2).all(|w| w[0] < w[1]));
        assert!(f[0] > 0.0 && f[6] < 1.0);
        assert_eq!(f[0], 0.0026041667f32);
        assert_eq!(f[1], 0.0859375);
    }

    #[test]
    fn library_linspace_matches_torch_examples() {
        // torch.linspace(0.1, 1, 3) and the middle of torch.linspace(-1, 1, 255).
        assert_eq!(linspace_f32(0.1, 1.0, 3), vec![0.1f32, 0.55, 1.0]);
        let l = linspace_f32(-1.0, 1.0, 255);
        assert_eq!(l[0], -1.0);
        assert_eq!(l[254], 1.0);
        // The middle element is computed from the end: 1 - 127 * f32(2/254), not 0.
        assert_eq!(l[127].to_bits(), 0x3180_0000);
    }

    #[test]
    fn library_maps_have_256_sorted_entries() {
        for m in [
            create_dynamic_map(true, 7, 8).unwrap(),
            create_dynamic_map(false, 7, 8).unwrap(),
            create_linear_map(true, 8, true).unwrap(),
            create_linear_map(false, 8, true).unwrap(),
        ] {
            assert_eq!(m.len(), 256);
            assert!(m.windows(2).all(|w| w[0] <= w[1]));
            assert_eq!(m[255], 1.0);
        }
        let d = create_dynamic_map(true, 7, 8).unwrap();
        assert_eq!(d[127], 0.0);
        assert_eq!(d[0].to_bits(), (-0.992968738079071f32).to_bits());
        let u = create_dynamic_map(false, 7, 8).unwrap();
        assert_eq!(u[0], 0.0);
        assert_eq!(u[1].to_bits(), 3.2500003044333425e-07f32.to_bits());
    }

    #[test]
    fn library_map_parameters_are_validated() {
        assert!(matches!(
            create_dynamic_map(true, 0, 8),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            create_dynamic_map(true, 7, 9),
            Err(Error::Unsupported(_))
        ));
        // bitsandbytes' own assertion fails for an unsigned map with free fraction bits.
        assert!(matches!(
            create_dynamic_map(false, 4, 8),
            Err(Error::Unsupported(_))
        ));
        assert_eq!(create_dynamic_map(true, 4, 8).unwrap().len(), 256);
        assert!(matches!(
            create_linear_map(true, 0, true),
            Err(Error::Unsupported(_))
        ));
        assert_eq!(
            create_linear_map(true, 4, true)
                .unwrap()
                .iter()
                .filter(|v| **v == 0.0)
                .count(),
            241
        );
        assert!(matches!(
            create_normal_map(1.0, true),
            Err(Error::Unsupported(_))
        ));
        assert_eq!(create_normal_map(0.99, false).unwrap().len(), 256);
    }
}
