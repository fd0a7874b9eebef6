//! The exact nearest 8-bit code: one [`Op::SearchSorted`](crate::Op::SearchSorted) over the 255
//! midpoint thresholds of the code table ([`exact_midpoints`]). The number of thresholds below
//! `v` is the number of exact midpoints below `v`, i.e. the nearest code with ties to the lower
//! code, and code 0 for NaN (below nothing); for an unsigned map (every threshold positive)
//! every `v <= 0` also gets code 0. This is bitsandbytes' CUDA choice of code
//! (`dQuantize`'s binary search over the code with ties to the lower code, NaN to 0).
//!
//! How the search runs is the backend's choice (`qforge_codegen::decompose`): a bucket table
//! plus two compares, or a finer packed bucket table read once, on backends that read tables
//! from memory, a binary search with one small table per level where tables live in vector
//! registers.

use crate::blockwise8::exact_midpoints;
use qforge_ir::KernelBuilder;
use qforge_ir::{Error, Result};
use qforge_ir::{TableId, Value};

/// `+inf` entries after the 255 thresholds: they count nothing, and let a bucket search read
/// past the last candidate in the table itself (`qforge_codegen::decompose`).
const PADDING: usize = 2;

/// The declared threshold table of one code table's search.
#[derive(Clone, Copy, Debug)]
pub struct Nearest8Tables {
    /// The 255 thresholds (`Midpoints8::thresholds`: `mid_k < v` exactly when `t_k < v` for
    /// non-NaN `v`), then two `+inf`.
    thresholds: TableId,
}

/// The sorted thresholds of `code` (256 sorted finite values), padded with two `+inf`.
///
/// # Errors
/// [`Error::Unsupported`] when `code` is not a valid 8-bit table ([`exact_midpoints`]).
pub fn thresholds(code: &[f32]) -> Result<Vec<f32>> {
    let mut t = exact_midpoints(code)?.thresholds();
    if t.iter().any(|x| x.is_nan()) || t.windows(2).any(|w| w[0] > w[1]) {
        return Err(Error::Unsupported(
            "the midpoint thresholds of an 8-bit code table must be sorted".into(),
        ));
    }
    t.extend([f32::INFINITY; PADDING]);
    Ok(t)
}

/// Declares the threshold table of `code`, named `mid_thresholds{suffix}`.
///
/// # Errors
/// As [`thresholds`].
pub fn declare(b: &mut KernelBuilder, code: &[f32], suffix: &str) -> Result<Nearest8Tables> {
    Ok(Nearest8Tables {
        thresholds: b.table_f32(&format!("mid_thresholds{suffix}"), &thresholds(code)?),
    })
}

/// The 8-bit code of the scaled value `v` (`f32`) as a `u32` (see the module docs).
pub fn emit_code(b: &mut KernelBuilder, v: Value, t: &Nearest8Tables) -> Value {
    b.search_sorted(t.thresholds, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockwiseMap;

    /// The nearest code, ties to the lower code, NaN to 0, independently of the `f32`
    /// thresholds: the number of midpoints `(c[k] + c[k+1]) / 2`, computed in `f64` (exact for
    /// these tables), below `v`.
    fn nearest_by_scan(code: &[f32], v: f32) -> u32 {
        code.windows(2)
            .filter(|w| (w[0] as f64 + w[1] as f64) / 2.0 < v as f64)
            .count() as u32
    }

    /// The emitted IR, run by the interpreter on edge values and every code's neighbours, picks
    /// the nearest code by a scan of the code table in f64 (ties to the lower code).
    #[test]
    fn the_search_picks_the_nearest_code_on_the_interpreter() {
        use qforge_ir::OwnedArg;
        use qforge_ir::{Access, Dim};
        use qforge_ir::{DType, Scalar, ScalarType};
        for map in BlockwiseMap::ALL {
            let code = map.code();
            let mut b = KernelBuilder::new("nearest8_probe");
            let np = b.scalar_param("n", ScalarType::U32);
            let x = b.buffer_param("x", DType::F32, &[Dim::Param(np)], Access::Read);
            let q = b.buffer_param("q", DType::U32, &[Dim::Param(np)], Access::Write);
            b.set_grid(Dim::Param(np));
            let tables = declare(&mut b, &code, "").unwrap();
            let i = b.work_item();
            let v = b.load(x, i);
            let c = emit_code(&mut b, v, &tables);
            b.store(q, i, c);
            let k = b.finish();
            qforge_ir::verify(&k).unwrap();
            let mut values = vec![
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                f32::from_bits(1),
                -f32::from_bits(1),
                f32::MAX,
                f32::MIN,
            ];
            for w in code.windows(2) {
                let mid = ((w[0] as f64 + w[1] as f64) / 2.0) as f32;
                values.extend([w[0], mid, mid.next_up(), mid.next_down()]);
            }
            let mut args = vec![
                OwnedArg::Scalar(Scalar::U32(values.len() as u32)),
                OwnedArg::Read(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
                OwnedArg::Write(vec![0; 4 * values.len()]),
            ];
            crate::test_util::run(&k, &mut args);
            let out = crate::test_util::out(&args, 2);
            for (i, v) in values.iter().enumerate() {
                let got = u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
                assert_eq!(got, nearest_by_scan(&code, *v), "{map}: v = {v:e}");
            }
        }
    }
}
