//! The Mosaic backend (TPU): lowers a kernel to a tile program and prints it twice, as a
//! Mosaic module in the Pallas convention (`text.rs`), which libtpu's Mosaic compiler compiles
//! for a TPU, and as its StableHLO twin (`twin.rs`), which the `stablehlo` device's reference
//! interpreter runs, so the lowering is checked bit for bit on a machine without a TPU
//! (`docs/backends/mosaic.md`).
//!
//! # The row-chunk class
//!
//! This first lowering takes the kernels whose work item `w` runs one loop over its chunk of
//! a flat element space, `for i in C*w .. min(C*w + C, n)`, with `n` a dimension parameter,
//! and whose loop body reads and writes buffers only at `i`, or at `2i` and `2i + 1` (and reads
//! or writes per-work-item buffers at `w` and reduces its chunk, or the `2C` elements of its
//! pairs, with `reduce absmax` before it): blockwise dequantization and quantization, 8-bit
//! and 4-bit, for example. The program's arrays put work item `w` in row `w` and its chunk
//! element `i` in column `i - C*w`: a buffer read or written at `i` is an array `[rows, C]`
//! (its flat elements padded with zeros), a buffer written at `2i` and `2i + 1` an array
//! `[rows, 2C]` whose two stored tiles are interleaved (read there: its even and odd lanes), a buffer read or written at `w` an
//! array `[rows, 1]`, a reduced buffer a second `[rows, C]` array whose window is the rows'
//! whole chunk (reduced by an integer max of the magnitudes' bits), a buffer read at an index
//! computed per work item a `[1, n]` array seen whole by every step (each row's entry picked
//! by a one-hot compare), a scalar parameter a `[1, 1]` array. Top-level variables, also under
//! per-work-item `if`s, become selects; `rows` is the grid rounded up to [`STEP_ROWS`], and each grid step
//! takes [`STEP_ROWS`] rows of every array as its window (`R x L` and `R x 1` tiles, `L` the
//! chunk or 512 lanes of it). Each IR
//! value becomes a vector of the tile shape it varies over, computed by the lane-wise ops the
//! IR defines (integer ops wrap, shifts take their amount modulo 32, a `lookup` is a tree of
//! selects on the index bits, `bf16` and `f16` stores round to nearest even with integer ops).
//! Because the chunk buffers are sized by `n` (checked), the lanes past `n` are exactly the
//! padding, which the caller drops: no lane is masked. For the same reason an `if index < P`
//! around stores at `index` into buffers sized by `P` runs unmasked (its false lanes store into
//! the padding). A top-level `if` around two loops over the chunk runs both and selects per
//! row between their stores, and a variable assigned in both branches of an `if` in the loop is
//! each element's select (the 4-bit quantization's full-block and last-block loops).
//!
//! `f32` division, square root, `fma` and the conversions between integers and floats are
//! computed from `i32` ops, correctly rounded (`soft.rs`: the TPU has no `f64`, which the
//! StableHLO backend's exact `fma` uses), and `search_sorted` is the level search
//! (`crate::decompose`), whose small tables are select trees. Anything else is refused with
//! [`Error::Unsupported`] naming the construct: other loops, other control flow, other
//! variables assigned in the loop, `accumulate` and `reduce sum`.
//!
//! # The matmul class
//!
//! A kernel with a top-level `accumulate` whose work items compute `y[m, n]` (the fused
//! 4-bit matmul's forward, the dense GEMMs of two `[rows, K]` operands) is lowered by
//! `matmul/` instead, as a pipelined grid of output tiles and reduction steps; see its docs.
//!
//! # The module and its caller
//!
//! The Mosaic function takes the two grid indices (`i32`: rows step, lane block) and one VMEM
//! window per input array, then one per output array, in parameter order. The grid is
//! `rows / STEP_ROWS` steps over the rows times `C / lanes` lane blocks (a chunk wider than 512
//! lanes is taken 512 at a time), `parallel` (the lane blocks `arbitrary` when a per-work-item
//! array is written); a chunk window's index map is `(r, c) -> (r, c)` (`@transform_chunk`), a
//! per-work-item or whole-chunk window's `(r, c) -> (r, 0)` (`@transform_row`), a whole-buffer
//! or scalar window's `(r, c) -> (0, 0)` (`@transform_fixed`). [`Manifest`] says which
//! parameter each array holds, its shape and dtype: the caller pads and reshapes each buffer
//! (a scalar as a one-element buffer) into its array or arrays, passes the inputs, and keeps
//! the first `elements` of each output (`scripts/mosaic_check.py` does this for `jax`).

mod lint;
mod lowering;
mod matmul;
mod ops;
mod soft;
mod text;
mod tile;
mod twin;

use qforge_ir::{DType, Kernel};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::stablehlo::Shapes;
pub use matmul::scalar_values;
pub use tile::Window;

/// The backend name used in errors and in `qforge check`.
pub const BACKEND: &str = "mosaic";

/// Rows of every window: a multiple of the TPU's native tiling of 8-bit arrays (32 sublanes;
/// 16 for 16-bit and 8 for 32-bit ones), so every window of any dtype is aligned.
pub const STEP_ROWS: u32 = 32;

/// The largest table a `lookup` selects from (a tree of `MAX_TABLE - 1` selects).
pub const MAX_TABLE: usize = 256;

/// The most elements of a buffer read at an index computed per work item (a `Table` window:
/// the whole buffer in VMEM, each row's entry picked by a one-hot compare over `32 x n` lanes).
/// A nested absmax of 4096 entries serves 4096 * 256 blocks: 67 M weights at blocksize 64.
pub const MAX_GATHER: usize = 4096;

/// A lowered kernel: the Mosaic module, its twin and the arrays' layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MosaicModule {
    /// The Mosaic module (MLIR text: `func`, `arith`, `vector`, `memref` and `tpu` dialects,
    /// `stable_mosaic.version` 11).
    pub text: String,
    /// The StableHLO twin: the same tile program with the signature of the StableHLO
    /// backend's modules (each parameter as raw bits, results the final contents of the
    /// written buffers), run by the `stablehlo` device's runner.
    pub twin: String,
    /// How the caller passes the buffers.
    pub manifest: Manifest,
}

/// How the Mosaic function's arrays hold the kernel's buffers (JSON for callers).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Manifest {
    /// The kernel name; also the Mosaic function's name.
    pub kernel: String,
    /// Grid steps over the rows (the first of `iteration_bounds`; a row-chunk program's,
    /// 0 for a matmul: see `grid`).
    pub steps: u32,
    /// Rows per step.
    pub step_rows: u32,
    /// Grid steps over the chunk (the second of `iteration_bounds`; 0 for a matmul).
    pub lane_blocks: u32,
    /// Columns of a chunk window per step (0 for a matmul).
    pub lanes: u32,
    /// The grid (`iteration_bounds`): `[steps, lane_blocks]`, or a matmul's
    /// `[M / TM, N / TN, K / TK]`.
    pub grid: Vec<u32>,
    /// The input arrays, in the function's order.
    pub inputs: Vec<ArrayLayout>,
    /// The output arrays, in the function's order.
    pub outputs: Vec<ArrayLayout>,
}

/// One array of the Mosaic function.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArrayLayout {
    /// The kernel parameter it holds.
    pub param: String,
    /// Its index among the kernel's parameters.
    pub index: usize,
    /// `[rows, columns]`: the buffer's flat elements in row-major order, zero-padded (`[1, n]`
    /// for a buffer read whole, `[1, 1]` for a scalar parameter's value); a matmul's 3-D
    /// arrays (4-bit panels, column blocks) are `[lead, rows, columns]`.
    pub shape: Vec<u32>,
    /// The buffer's element dtype as `numpy` spells it (`uint8`, `int8`, `bfloat16`,
    /// `float16`, `float32`, `uint32`, `int32`).
    pub dtype: String,
    /// The array's element dtype: `dtype`, except `uint16` for `float16` (the module holds
    /// `f16` as its bits; a caller bitcasts the buffer to it and the result back).
    pub array_dtype: String,
    /// The buffer's element count (an output's first `elements` are the kernel's result).
    pub elements: usize,
    /// A matmul's arrays: the buffer's first elements in this shape (`[rows, columns]`, or
    /// 4-bit panels' `[panels, K, 16]`), zero-padded on every dimension to `shape` with its
    /// leading dimensions merged to this rank, then split as `shape` (an output's result is
    /// its top-left `[rows, columns]`); absent for a flat buffer padded at its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_shape: Option<Vec<u32>>,
}

/// Lowers `kernel` for a launch of `shapes`: the Mosaic module, its twin and the manifest.
///
/// # Errors
/// [`Error::Unsupported`] naming the first construct outside the row-chunk class (module
/// docs), shapes for another number of parameters, or a grid that does not cover the chunk
/// buffers; [`Error::Ir`] for a kernel that does not verify; [`Error::Backend`] for a module
/// that fails qforge's lint (`lint.rs`: window count, bounds and tiling, index-map and
/// iteration-bound arity), a bug in the lowering.
pub fn lower(kernel: &Kernel, shapes: &Shapes) -> Result<MosaicModule> {
    lower_with(kernel, shapes, &[])
}

/// [`lower`] with the launch's integer scalar parameters (`scalars[i]` the value of parameter
/// `i`, [`scalar_values`]), which a matmul's lowering needs (`matmul/`: its tiles follow
/// `M`, `N` and `K`, and its work items are evaluated).
///
/// # Errors
/// As [`lower`]; a matmul without its scalars is refused naming what it misses.
pub fn lower_with(
    kernel: &Kernel,
    shapes: &Shapes,
    scalars: &[Option<u32>],
) -> Result<MosaicModule> {
    // `search_sorted` as the level search: its tables (1, 2, 4, ... entries) are select
    // trees, where the bucket search's would be hundreds of entries.
    let searched = crate::decompose::search(kernel, crate::decompose::SearchStrategy::Levels)?;
    let kernel = searched.as_ref();
    if shapes.elements.len() != kernel.params.len() {
        return Err(refuse(
            kernel,
            &format!(
                "launch shapes for {} parameters (the kernel has {})",
                shapes.elements.len(),
                kernel.params.len()
            ),
        ));
    }
    let program = if matmul::is_matmul(kernel) {
        matmul::tile_program(kernel, shapes, scalars)?
    } else {
        lowering::tile_program(kernel, shapes)?
    };
    let layout = |w: &Window| ArrayLayout {
        param: w.name.clone(),
        index: w.param,
        shape: program.array_shape(w),
        dtype: numpy_dtype(w.dtype).to_string(),
        array_dtype: match w.dtype {
            DType::F16 => "uint16",
            d => numpy_dtype(d),
        }
        .to_string(),
        elements: w.elements,
        buffer_shape: program.buffer_shape(w),
    };
    let manifest = Manifest {
        kernel: kernel.name.clone(),
        steps: program.steps(),
        step_rows: STEP_ROWS,
        lane_blocks: program.lane_blocks(),
        lanes: program.lanes(),
        grid: program.grid(),
        inputs: program
            .windows
            .iter()
            .filter(|w| w.read)
            .map(layout)
            .collect(),
        outputs: program
            .windows
            .iter()
            .filter(|w| w.written)
            .map(layout)
            .collect(),
    };
    let text = text::print(&program);
    lint::lint(&text, &manifest).map_err(|fault| Error::Backend {
        backend: "mosaic",
        message: format!("{}: the module fails qforge's lint: {fault}", kernel.name),
    })?;
    Ok(MosaicModule {
        text,
        twin: twin::print(kernel, shapes, &program),
        manifest,
    })
}

/// The launch `qforge compile --target mosaic --dim D --scalar NAME=VALUE` means: every
/// integer scalar parameter `D`, except those `named`; each buffer's elements its declared
/// dimensions' product; the grid its dimension's value. Returns the shapes and the scalars
/// for [`lower_with`].
///
/// # Errors
/// [`Error::Target`] for a name that is not an integer scalar parameter of `kernel`, or a
/// grid or buffer size past `u32` or `usize`.
pub fn launch(
    kernel: &Kernel,
    dim: u32,
    named: &[(String, u32)],
) -> Result<(Shapes, Vec<Option<u32>>)> {
    use qforge_ir::{Dim, ParamKind, ScalarType};
    for (name, _) in named {
        let ok = kernel.params.iter().any(|(_, p)| {
            p.name == *name
                && matches!(p.kind, ParamKind::Scalar(ScalarType::U32 | ScalarType::I32))
        });
        if !ok {
            return Err(Error::Target(format!(
                "--scalar {name}: {} has no integer scalar parameter {name}",
                kernel.name
            )));
        }
    }
    let scalars: Vec<Option<u32>> = kernel
        .params
        .iter()
        .map(|(_, p)| match p.kind {
            ParamKind::Scalar(ScalarType::U32 | ScalarType::I32) => Some(
                named
                    .iter()
                    .rev()
                    .find(|(n, _)| *n == p.name)
                    .map_or(dim, |(_, v)| *v),
            ),
            _ => None,
        })
        .collect();
    let value = |d: &Dim| -> u64 {
        match d {
            Dim::Const(c) => u64::from(*c),
            Dim::Param(p) => u64::from(scalars.get(p.index()).copied().flatten().unwrap_or(dim)),
        }
    };
    let too_big = || {
        Error::Target(format!(
            "a launch of {} past the address space",
            kernel.name
        ))
    };
    let elements = kernel
        .params
        .iter()
        .map(|(_, p)| match &p.kind {
            ParamKind::Buffer { shape, .. } => shape
                .iter()
                .try_fold(1u64, |n, d| n.checked_mul(value(d)))
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(too_big),
            ParamKind::Scalar(_) => Ok(0),
        })
        .collect::<Result<Vec<usize>>>()?;
    let grid = u32::try_from(value(&kernel.grid)).map_err(|_| too_big())?;
    Ok((Shapes { grid, elements }, scalars))
}

/// `Unsupported` naming the kernel and what this backend does not lower in it.
fn refuse(k: &Kernel, what: &str) -> Error {
    Error::Unsupported {
        backend: BACKEND,
        op: format!("{} in {}", what, k.name),
    }
}

fn numpy_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::U8 => "uint8",
        DType::I8 => "int8",
        DType::U32 => "uint32",
        DType::I32 => "int32",
    }
}

#[cfg(test)]
mod tests;
