//! The activation kernels in the catalog ([`ActSpec::all`]), with example arguments made
//! through their typed signature.

use qforge_ir::dsl::{FloatIn, FloatOut, TypedKernel};
use qforge_ir::{Kernel, OwnedArg, Result};

use super::{ActBetaArgs, ActDirection, ActSpec, ACT_BLOCKSIZE};
use crate::catalog::{example_len, float_bytes};
use crate::CatalogEntry;

impl CatalogEntry for ActSpec {
    fn name(&self) -> String {
        ActSpec::name(self)
    }

    fn build(&self) -> Result<Kernel> {
        ActSpec::build(self).map(TypedKernel::into_kernel)
    }

    fn blocksize(&self) -> usize {
        ACT_BLOCKSIZE as usize
    }

    /// `z = values`, `dy = values` rotated by one, both rounded to the dtype; `beta` cycles
    /// through `0`, `0.625`, `1` with `n % 3` (the linear end, an interior value and the pure
    /// activation); the output starts zeroed.
    fn example_args(&self, values: &[f32]) -> Result<Vec<OwnedArg>> {
        let n = example_len(values)?;
        let kernel = ActSpec::build(self)?;
        let dtype = self.dtype;
        let z = float_bytes(dtype, values);
        let dy: Vec<f32> = (0..values.len())
            .map(|i| values[(i + 1) % values.len()])
            .collect();
        let dy = float_bytes(dtype, &dy);
        let mut out = vec![0u8; z.len()];
        let out = FloatOut {
            dtype,
            bytes: &mut out,
        };
        let backward = self.direction == ActDirection::Backward;
        let (dy, y, dz) = if backward {
            (Some(FloatIn { dtype, bytes: &dy }), None, Some(out))
        } else {
            (None, Some(out), None)
        };
        let mut args = ActBetaArgs {
            n,
            n_blocks: n.div_ceil(ACT_BLOCKSIZE),
            beta: [0.0f32, 0.625, 1.0][values.len() % 3],
            z: FloatIn { dtype, bytes: &z },
            dy,
            y,
            dz,
        };
        Ok(OwnedArg::copy_all(&kernel.args(&mut args)?))
    }
}
