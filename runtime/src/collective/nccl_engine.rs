//! The NCCL engine (feature `nccl`): NCCL's collectives between CUDA GPUs, through cudarc's
//! `nccl` bindings, loaded at run time like the driver (so it builds anywhere). One rank per
//! process and GPU; the ranks find each other through a host [`Communicator`] (MPI, or
//! [`super::SingleRank`] for one rank) that carries rank 0's NCCL unique id.
//!
//! cudarc looks for `libnccl.so` (and `libnccl.so.<CUDA major>`); PyPI's `nvidia-nccl-cu12`
//! ships `libnccl.so.2` only: link it as `libnccl.so` in a folder on `LD_LIBRARY_PATH`.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::safe::{Comm, Id};

use super::{check_equal_lengths, Communicator};
use crate::cuda::driver;
use crate::{Error, Result};

const NAME: &str = "nccl";

fn fail(message: String) -> Error {
    Error::Device {
        device: NAME.into(),
        message,
    }
}

/// One rank of an NCCL communicator on one GPU. [`Communicator::all_gather`] copies the bytes
/// to the GPU, runs `ncclAllGather` and copies the result back.
pub struct NcclCommunicator {
    comm: Comm,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclCommunicator(rank {} of {})",
            self.rank(),
            self.size()
        )
    }
}

/// Whether this process can load the CUDA driver and NCCL; the reason when not.
fn probe() -> std::result::Result<(), String> {
    driver::probe_library()?;
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names and closes them.
    let nccl = driver::guard(|| Ok(unsafe { cudarc::nccl::sys::is_culib_present() }))?;
    if nccl {
        Ok(())
    } else {
        Err(
            "NCCL not found (libnccl.so): install NCCL, or link PyPI nvidia-nccl-cu12's \
             libnccl.so.2 as libnccl.so in a folder on LD_LIBRARY_PATH"
                .into(),
        )
    }
}

impl NcclCommunicator {
    /// Rank `bootstrap.rank()` of `bootstrap.size()` on GPU `ordinal`. Every rank calls it (a
    /// collective on `bootstrap`): each checks that the driver and NCCL load and opens its GPU,
    /// rank 0 makes the NCCL unique id, one all-gather on `bootstrap` shares both, and all
    /// ranks fail together, naming the ranks that could not start, or all go on to
    /// `ncclCommInitRank` (a failure inside NCCL's own initialization or collectives on one
    /// rank is NCCL's to report; the launcher ends the job when that rank exits).
    ///
    /// # Errors
    /// [`Error::Device`] when the CUDA driver or NCCL cannot be loaded on some rank (naming the
    /// ranks and the reason), the GPU cannot be opened, or NCCL fails to start; the bootstrap
    /// all-gather's errors.
    pub fn init(bootstrap: &dyn Communicator, ordinal: usize) -> Result<NcclCommunicator> {
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        // Everything that may fail on one rank only comes before the status all-gather: the
        // libraries, the GPU, rank 0's unique id.
        let ready = probe()
            .and_then(|()| {
                driver::guard(|| {
                    CudaContext::new(ordinal)
                        .map_err(|e| format!("cannot open GPU {ordinal}: {}", driver::describe(&e)))
                })
            })
            .and_then(|ctx| {
                let id = if rank == 0 {
                    Some(driver::guard(|| {
                        Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))
                    })?)
                } else {
                    None
                };
                Ok((ctx, id))
            });
        // Per rank: 1 status byte, then the 128-byte id (rank 0's is the one used).
        let mut mine = vec![u8::from(ready.is_ok())];
        match &ready {
            Ok((_, Some(id))) => mine.extend(id.internal().iter().map(|c| *c as u8)),
            _ => mine.resize(129, 0),
        }
        let all = bootstrap.all_gather(&mine)?;
        let failed: Vec<usize> = (0..size).filter(|r| all[r * 129] == 0).collect();
        let ctx = match ready {
            Ok((ctx, _)) if failed.is_empty() => ctx,
            other => {
                let why = other
                    .err()
                    .unwrap_or_else(|| "see that rank's error".into());
                return Err(fail(format!(
                    "ranks {failed:?} of {size} cannot start NCCL (this rank {rank}: {why})"
                )));
            }
        };
        let id = Id::uninit(std::array::from_fn(|i| all[1 + i] as std::ffi::c_char));
        driver::guard(|| {
            let stream = ctx.default_stream();
            let comm = Comm::from_rank(stream.clone(), rank, size, id)
                .map_err(|e| format!("ncclCommInitRank (rank {rank} of {size}): {e:?}"))?;
            Ok(NcclCommunicator { comm, stream })
        })
        .map_err(fail)
    }

    /// `ncclAllGather` of `local` (equal lengths on every rank, checked before by the caller).
    fn gather_equal(&self, local: &[u8]) -> std::result::Result<Vec<u8>, String> {
        if local.is_empty() {
            return Ok(Vec::new());
        }
        driver::guard(|| {
            let describe = |e: cudarc::driver::DriverError| driver::describe(&e);
            let send = self.stream.clone_htod(local).map_err(describe)?;
            let mut recv = self
                .stream
                .alloc_zeros::<u8>(local.len() * self.size())
                .map_err(describe)?;
            self.comm
                .all_gather(&send, &mut recv)
                .map_err(|e| format!("ncclAllGather: {e:?}"))?;
            self.stream.clone_dtoh(&recv).map_err(describe)
        })
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.world_size()
    }

    fn engine(&self) -> &str {
        NAME
    }

    fn all_gather(&self, local: &[u8]) -> Result<Vec<u8>> {
        let lengths = self
            .gather_equal(&(local.len() as u64).to_le_bytes())
            .map_err(fail)?;
        let lengths: Vec<u64> = lengths
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        check_equal_lengths(NAME, &lengths)?;
        self.gather_equal(local).map_err(fail)
    }

    fn abort(&self, code: i32) -> ! {
        // NCCL has no job-wide abort: this process ends, and the launcher (mpirun) ends the
        // others when one exits with an error.
        std::process::exit(code)
    }
}
