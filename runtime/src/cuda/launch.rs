//! One launch on the CUDA device: a device allocation per buffer parameter (filled with the
//! argument's bytes, `Write` buffers included), the `.entry` parameters in order (buffers as
//! 64-bit device addresses, scalars as their 32 bits), `ceil(grid / 128)` blocks of 128 threads,
//! then the copy back of every writable buffer and a stream synchronization.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use qforge_codegen::ptx::PtxParam;
use qforge_ir::{Arg, Binding};

use super::{driver, Compiled, CudaDevice};
use crate::error::Result;

/// Runs `compiled` on `args` (already checked by `bind`, giving `binding`); the caller holds the
/// launch lock. An empty grid launches nothing and leaves the buffers as they are.
pub(super) fn launch(
    dev: &CudaDevice,
    compiled: &Compiled,
    binding: &Binding,
    args: &mut [Arg<'_>],
) -> Result<()> {
    let blocks = binding.grid.div_ceil(compiled.threads_per_block);
    if blocks == 0 {
        return Ok(());
    }
    driver::guard(|| run(dev, compiled, blocks, args))
        .map_err(|m| dev.err(format!("'{}': {m}", compiled.kernel.name)))
}

/// A device allocation's size for `len` host bytes: at least one byte (the driver refuses
/// zero-byte allocations; a kernel never reads an empty buffer's byte).
fn alloc_len(len: usize) -> usize {
    len.max(1)
}

/// Uploads, launches, reads back and synchronizes; errors are messages for [`super::Error`].
fn run(
    dev: &CudaDevice,
    compiled: &Compiled,
    blocks: u32,
    args: &mut [Arg<'_>],
) -> std::result::Result<(), String> {
    let stream = &dev.stream;
    let params = &compiled.params;
    if params.len() != args.len() {
        return Err(format!(
            "the PTX module has {} parameters, the launch {} arguments",
            params.len(),
            args.len()
        ));
    }
    // One device buffer per buffer parameter, one 32-bit word per scalar parameter (indexed by
    // parameter; both vectors are complete before any argument pointer is taken).
    let mut buffers: Vec<Option<CudaSlice<u8>>> = Vec::with_capacity(args.len());
    let mut words: Vec<u32> = vec![0; args.len()];
    for (i, (arg, param)) in args.iter().zip(params).enumerate() {
        let bytes: &[u8] = match (arg, param) {
            (Arg::Read(b), PtxParam::Pointer) => b,
            (Arg::Write(b), PtxParam::Pointer) => b,
            (Arg::Scalar(s), PtxParam::Scalar(_)) => {
                // u32, i32 (two's complement) and f32 (IEEE bits) are all 32-bit `.param`s.
                words[i] = s.bits();
                buffers.push(None);
                continue;
            }
            (Arg::Scalar(_), PtxParam::Pointer)
            | (Arg::Read(_) | Arg::Write(_), PtxParam::Scalar(_)) => {
                return Err(format!(
                    "argument {i} does not match the PTX parameter layout ({param:?})"
                ))
            }
        };
        // SAFETY: the allocation is written (the argument's bytes) before the kernel runs; a
        // one-byte stand-in for an empty buffer is never read.
        let mut slice = unsafe { stream.alloc::<u8>(alloc_len(bytes.len())) }
            .map_err(|e| format!("allocating {} bytes: {}", bytes.len(), driver::describe(&e)))?;
        if !bytes.is_empty() {
            stream
                .memcpy_htod(bytes, &mut slice.slice_mut(..bytes.len()))
                .map_err(|e| {
                    format!("copying argument {i} to the GPU: {}", driver::describe(&e))
                })?;
        }
        buffers.push(Some(slice));
    }

    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (compiled.threads_per_block, 1, 1),
        shared_mem_bytes: 0,
    };
    {
        let mut builder = stream.launch_builder(&compiled.function);
        for (buffer, word) in buffers.iter().zip(&words) {
            match buffer {
                Some(slice) => builder.arg(slice),
                None => builder.arg(word),
            };
        }
        // SAFETY: the arguments follow the module's `.entry` signature (checked above against
        // `params`, which the backend derived from the same kernel): a device address for each
        // buffer, 32 bits for each scalar. Every buffer holds exactly the elements `bind`
        // checked, and the kernel's indices stay in range for such arguments (see the module
        // docs for what an out-of-range index does).
        unsafe { builder.launch(cfg) }
            .map_err(|e| format!("launching {blocks} blocks: {}", driver::describe(&e)))?;
    }

    for (i, (arg, buffer)) in args.iter_mut().zip(&buffers).enumerate() {
        if let (Arg::Write(out), Some(slice)) = (arg, buffer) {
            if out.is_empty() {
                continue;
            }
            let n = out.len();
            stream
                .memcpy_dtoh(&slice.slice(..n), &mut out[..])
                .map_err(|e| {
                    format!(
                        "running the kernel or copying argument {i} back: {}",
                        driver::describe(&e)
                    )
                })?;
        }
    }
    stream
        .synchronize()
        .map_err(|e| format!("waiting for the GPU: {}", driver::describe(&e)))?;
    drop(buffers);
    dev.ctx
        .check_err()
        .map_err(|e| format!("freeing the launch's buffers: {}", driver::describe(&e)))
}

#[cfg(test)]
mod tests {
    use super::alloc_len;

    #[test]
    fn empty_buffers_get_a_one_byte_allocation() {
        assert_eq!(alloc_len(0), 1);
        assert_eq!(alloc_len(1), 1);
        assert_eq!(alloc_len(4097), 4097);
    }
}
