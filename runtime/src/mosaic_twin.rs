//! The `mosaic-twin` device: runs each kernel's Mosaic lowering through its StableHLO twin
//! (`qforge_codegen::mosaic`) on the `stablehlo` device's reference-interpreter runners. It
//! is how the Mosaic backend is checked bit for bit without a TPU: the twin computes the
//! Mosaic module's tile program op for op. A kernel outside the lowering's class fails its
//! launch with the backend's `Unsupported` error naming the construct.

use qforge_codegen::mosaic;
use qforge_ir::{Arg, Kernel};

use crate::device::{Caps, Device, DeviceKind};
use crate::error::Result;
use crate::stablehlo::{launch_shapes, StableHloDevice};

const NAME: &str = "mosaic-twin";

/// The device (see the module docs); shares the process's StableHLO runners.
pub struct MosaicTwinDevice {
    runner: StableHloDevice,
}

impl MosaicTwinDevice {
    /// A device on the process's StableHLO runners.
    ///
    /// # Errors
    /// As [`StableHloDevice::new`]: the Python interpreter is missing or cannot import jax's
    /// MLIR bindings (run `scripts/install-stablehlo.sh`).
    pub fn new() -> Result<MosaicTwinDevice> {
        Ok(MosaicTwinDevice {
            runner: StableHloDevice::new()?,
        })
    }
}

impl Device for MosaicTwinDevice {
    fn name(&self) -> &str {
        NAME
    }

    fn backend(&self) -> &'static str {
        mosaic::BACKEND
    }

    fn caps(&self) -> Caps {
        Caps {
            kind: DeviceKind::Xla,
            ..Caps::SEQUENTIAL
        }
    }

    fn compile(&self, kernel: &Kernel) -> Result<()> {
        Ok(qforge_ir::verify(kernel)?)
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        let Some(shapes) = launch_shapes(kernel, args)? else {
            return Ok(());
        };
        let module = mosaic::lower_with(kernel, &shapes, &mosaic::scalar_values(args))?;
        self.runner.run_launch(kernel, &module.twin, args)
    }
}
