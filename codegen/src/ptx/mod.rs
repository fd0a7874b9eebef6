//! The PTX backend: lowers a verified [`Kernel`] to PTX text for NVIDIA GPUs (sm_80, sm_90).
//!
//! # Module and ABI
//!
//! One PTX module per kernel (`.version 8.0`, `.target sm_80` or `sm_90`, `.address_size 64`)
//! with one `.visible .entry` named after the kernel and one `.param` per kernel parameter, in
//! order, named `p_<name>`:
//!
//! | IR parameter | PTX parameter |
//! |---|---|
//! | buffer (any dtype, any access) | `.param .u64` global address of element 0 |
//! | `u32` scalar | `.param .u32` |
//! | `i32` scalar | `.param .s32` |
//! | `f32` scalar | `.param .f32` (the 32 bits of the value) |
//!
//! Constant tables are module-scope `.const .b32` arrays named `<kernel>__<table>`; they need no
//! launch argument.
//!
//! # Launch shape
//!
//! The IR's one-dimensional grid of `grid` work items maps to a one-dimensional CUDA launch of
//! [`THREADS_PER_BLOCK`] threads per block and `ceil(grid / THREADS_PER_BLOCK)` blocks (see
//! [`LaunchShape`]); thread `tid.x` of block `ctaid.x` runs work item
//! `ctaid.x * ntid.x + tid.x` (computed in 64 bits, so it never wraps) and returns at once when
//! that is `>= grid`. The entry declares `.maxntid 128, 1, 1`. No shared memory, no barriers:
//! work items are independent, as the IR requires.
//!
//! # Semantics
//!
//! Every float instruction names its rounding (`add.rn.f32`, `div.rn.f32`, `sqrt.rn.f32`,
//! `cvt.rn...`), so ptxas may neither contract nor approximate; there is no `.ftz` and no
//! `.approx` anywhere, and `fma.rn.f32` appears only for [`qforge_ir::Op::Fma`] and the
//! per-element products of [`qforge_ir::Stmt::Accumulate`]. min/max are `setp` + `selp`,
//! neg/abs are sign-bit operations, integer division is guarded, shifts are masked with `& 31`,
//! table indices are clamped, reductions and accumulates run in their stated order (an
//! accumulate is one thread's loop, unrolled over its partial sums). The full table is in
//! `docs/backends/ptx.md`.

mod accumulate;
mod emit;
mod memory;
mod ops;

use qforge_ir::{Dim, Kernel, ParamKind, ScalarType};

use crate::error::Result;

/// The backend name used in errors and in `qforge check`.
pub const BACKEND: &str = "ptx";

/// Bytes of `.const` data one module may declare (ptxas rejects more): the kernel's tables.
const CONST_BANK_BYTES: usize = 64 * 1024;

/// Threads per CUDA block of every launch (the entry's `.maxntid`).
pub const THREADS_PER_BLOCK: u32 = 128;

/// The PTX ISA version written in `.version` (CUDA 12.0 and later accept it).
pub const PTX_VERSION: &str = "8.0";

/// The GPU architecture a module is emitted for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SmTarget {
    /// Ampere (A100): `.target sm_80`.
    #[default]
    Sm80,
    /// Hopper (H100/H200): `.target sm_90`.
    Sm90,
}

impl SmTarget {
    /// Both targets, in a fixed order.
    pub const ALL: [SmTarget; 2] = [SmTarget::Sm80, SmTarget::Sm90];

    /// The name in `.target` and in `ptxas -arch=` (`sm_80`, `sm_90`).
    pub const fn name(self) -> &'static str {
        match self {
            SmTarget::Sm80 => "sm_80",
            SmTarget::Sm90 => "sm_90",
        }
    }
}

/// How one kernel parameter is passed to the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PtxParam {
    /// A 64-bit global address (`.param .u64`): a buffer parameter.
    Pointer,
    /// A scalar passed by value (`.param .u32`, `.s32` or `.f32`).
    Scalar(ScalarType),
}

/// The launch the runtime must use for a kernel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchShape {
    /// Threads per block (`blockDim.x`); always [`THREADS_PER_BLOCK`].
    pub threads_per_block: u32,
    /// The number of work items: a constant or a `u32` scalar parameter known at launch.
    pub grid: Dim,
}

impl LaunchShape {
    /// The number of blocks (`gridDim.x`) for `work_items` work items: the ceiling of
    /// `work_items / threads_per_block` (0 for an empty grid, which the runtime must not launch).
    pub fn blocks(&self, work_items: u32) -> u32 {
        work_items.div_ceil(self.threads_per_block)
    }
}

/// A kernel lowered to PTX: the module text plus what the runtime needs to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxModule {
    /// The entry name (the kernel name).
    pub entry: String,
    /// The architecture the text targets.
    pub target: SmTarget,
    /// The complete PTX module text (deterministic).
    pub text: String,
    /// How each kernel parameter is passed, in parameter order.
    pub params: Vec<PtxParam>,
    /// The launch shape.
    pub launch: LaunchShape,
    /// [`Kernel::content_hash`] of the lowered kernel (a cache key for the loaded module).
    pub ir_hash: u64,
}

/// The PTX backend for one target architecture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtxBackend {
    /// The architecture to emit for.
    pub target: SmTarget,
}

impl PtxBackend {
    /// A backend emitting for `target`.
    pub const fn new(target: SmTarget) -> Self {
        PtxBackend { target }
    }
}

impl crate::Backend for PtxBackend {
    type Artifact = PtxModule;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn lower(&self, kernel: &Kernel) -> Result<PtxModule> {
        lower(kernel, self.target)
    }

    fn emit_text(&self, kernel: &Kernel) -> Result<String> {
        Ok(lower(kernel, self.target)?.text)
    }
}

/// Verifies `kernel` and lowers it to a PTX module for `target`.
///
/// # Errors
/// [`crate::Error::Ir`] when the kernel does not verify; [`crate::Error::Unsupported`] for a
/// `bf16` store rounding other than `rne`/`rtz` (PTX has no directed `cvt` to bf16), or for
/// tables of more than 64 KiB in all (the `.const` bank).
pub fn lower(kernel: &Kernel, target: SmTarget) -> Result<PtxModule> {
    qforge_ir::verify(kernel)?;
    let kernel = &*crate::decompose::search(kernel, crate::decompose::SearchStrategy::Buckets)?;
    lower_prepared(kernel, target)
}

/// [`lower`] for a verified kernel already through the bucket search decomposition.
pub(crate) fn lower_prepared(kernel: &Kernel, target: SmTarget) -> Result<PtxModule> {
    let table_bytes: usize = kernel.tables.iter().map(|(_, t)| 4 * t.data.len()).sum();
    if table_bytes > CONST_BANK_BYTES {
        return Err(crate::Error::Unsupported {
            backend: BACKEND,
            op: format!(
                "constant tables of {table_bytes} bytes in kernel '{}' (the tables live in the \
                 .const bank, which holds {CONST_BANK_BYTES} bytes)",
                kernel.name
            ),
        });
    }
    let text = emit::module(kernel, target)?;
    let params = kernel
        .params
        .iter()
        .map(|(_, p)| match &p.kind {
            ParamKind::Buffer { .. } => PtxParam::Pointer,
            ParamKind::Scalar(t) => PtxParam::Scalar(*t),
        })
        .collect();
    Ok(PtxModule {
        entry: kernel.name.clone(),
        target,
        text,
        params,
        launch: LaunchShape {
            threads_per_block: THREADS_PER_BLOCK,
            grid: kernel.grid,
        },
        ir_hash: kernel.content_hash(),
    })
}

/// The PTX text of `kernel` for `target` (deterministic: suitable for snapshots).
///
/// # Errors
/// As [`lower`].
pub fn ptx_text(kernel: &Kernel, target: SmTarget) -> Result<String> {
    Ok(lower(kernel, target)?.text)
}

#[cfg(test)]
mod tests {
    use qforge_ir::{Access, DType, Dim, KernelBuilder, ScalarType};

    use super::*;

    /// `out[i] = x[i] / s` over a grid of `n`: the ABI and launch shape of the module docs.
    fn scale() -> Kernel {
        let mut b = KernelBuilder::new("scale");
        let n = b.scalar_param("n", ScalarType::U32);
        let s = b.scalar_param("s", ScalarType::F32);
        let x = b.buffer_param("x", DType::F16, &[Dim::Param(n)], Access::Read);
        let out = b.buffer_param("out", DType::F32, &[Dim::Param(n)], Access::Write);
        b.set_grid(Dim::Param(n));
        let w = b.work_item();
        let v = b.load(x, w);
        let sv = b.param(s);
        let q = b.div(v, sv);
        b.store(out, w, q);
        b.finish()
    }

    #[test]
    fn abi_and_launch_shape() {
        let m = lower(&scale(), SmTarget::Sm90).expect("lowers");
        assert_eq!(m.entry, "scale");
        assert_eq!(
            m.params,
            vec![
                PtxParam::Scalar(ScalarType::U32),
                PtxParam::Scalar(ScalarType::F32),
                PtxParam::Pointer,
                PtxParam::Pointer
            ]
        );
        for needle in [
            ".version 8.0\n",
            ".target sm_90\n",
            ".address_size 64\n",
            ".visible .entry scale(\n",
            "\t.param .u32 p_n,\n",
            "\t.param .f32 p_s,\n",
            "\t.param .u64 p_x,\n",
            "\t.param .u64 p_out\n",
            ".maxntid 128, 1, 1\n",
            "\tld.param.u32 %wi, [p_n];\n",
            "\tsetp.ge.u64 %out_of_grid, %wide2, %wide3;\n",
            "\tcvt.f32.f16 ",
            "\tdiv.rn.f32 ",
            "\tst.global.f32 ",
        ] {
            assert!(m.text.contains(needle), "missing {needle:?} in\n{}", m.text);
        }
        assert_eq!(m.launch.threads_per_block, 128);
        assert_eq!(m.launch.blocks(0), 0);
        assert_eq!(m.launch.blocks(1), 1);
        assert_eq!(m.launch.blocks(128), 1);
        assert_eq!(m.launch.blocks(129), 2);
        assert_eq!(m.launch.blocks(u32::MAX), 33_554_432);
        assert_eq!(m.ir_hash, scale().content_hash());
    }

    #[test]
    fn emission_is_deterministic_and_per_target() {
        let k = scale();
        let a = ptx_text(&k, SmTarget::Sm80).expect("lowers");
        assert_eq!(a, ptx_text(&k, SmTarget::Sm80).expect("lowers"));
        let b = ptx_text(&k, SmTarget::Sm90).expect("lowers");
        assert_eq!(a.replace("sm_80", "sm_90"), b);
    }

    #[test]
    fn unverified_kernels_are_rejected() {
        let mut b = KernelBuilder::new("bad");
        let out = b.buffer_param("o", DType::F32, &[Dim::Const(1)], Access::Read);
        let (z, v) = (b.const_u32(0), b.const_f32(1.0));
        b.store(out, z, v); // store into a read-only buffer
        let err = lower(&b.finish(), SmTarget::Sm80).expect_err("must not verify");
        assert!(matches!(err, crate::Error::Ir(_)), "{err}");
    }
}
