//! The dense products in the catalog ([`Gemm::catalog`]), with example arguments made through
//! their typed signature.

use qforge_ir::dsl::{FloatIn, FloatOut};
use qforge_ir::{Kernel, OwnedArg, Result};

use super::host::packed;
use super::{Gemm, GemmKernelArgs, Layout};
use crate::catalog::float_bytes;
use crate::CatalogEntry;

impl CatalogEntry for Gemm {
    fn name(&self) -> String {
        Gemm::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        Gemm::build(self)
    }

    fn blocksize(&self) -> usize {
        64
    }

    /// A reduction over `L = values.len()` with `M = 1 + L % 3` and `N = 3 + L % 5`: the
    /// operands, bias and residual cycle through `values` (rounded to the dtype; for panels `B`
    /// cycles as if written `[N, L]` and is then packed), the output starts zeroed; two row tiles
    /// per group.
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        let l = values.len().max(1);
        let (m, n) = (1 + l % 3, 3 + l % 5);
        let n_tiles = n.div_ceil(self.tile.tn as usize);
        let n_items = m.div_ceil(self.tile.tm as usize) * n_tiles;
        let dtype = self.dtype;
        let cycle = |count: usize, shift: usize| -> Vec<u8> {
            let v: Vec<f32> = (0..count)
                .map(|i| values.get((i + i / l + shift) % l).copied().unwrap_or(0.0))
                .collect();
            float_bytes(dtype, &v)
        };
        let (a, b, bias, r) = (
            cycle(m * l, 0),
            cycle(n * l, 1),
            cycle(n, 2),
            cycle(m * n, 3),
        );
        // `B` as written, `[N, L]`, in the spec's layout.
        let tn = self.tile.tn as usize;
        let b = match self.b {
            Layout::Panels => packed(&b, dtype, Layout::RowMajor, (n, l), tn, 1),
            _ => b,
        };
        let panel_len = (self.b == Layout::Panels).then_some((l * tn) as u32);
        let mut c = vec![0u8; m * n * dtype.size_bytes()];
        let kernel = self.build_typed()?;
        let mut args = GemmKernelArgs {
            m: m as u32,
            n: n as u32,
            l: l as u32,
            n_items: n_items as u32,
            m_tiles: m.div_ceil(self.tile.tm as usize) as u32,
            n_tiles: n_tiles as u32,
            group: 2,
            panel_len,
            a: FloatIn { dtype, bytes: &a },
            b: FloatIn { dtype, bytes: &b },
            bias: self.bias.then_some(FloatIn {
                dtype,
                bytes: &bias,
            }),
            r: self.residual.then_some(FloatIn { dtype, bytes: &r }),
            c: FloatOut {
                dtype,
                bytes: &mut c,
            },
        };
        Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
    }
}
