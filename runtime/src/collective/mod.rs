//! Collectives across ranks: the communication sharded kernels need (`docs/distributed.md`).
//!
//! A [`Communicator`] is one rank's handle on a group of `size` ranks that run the same program
//! (SPMD). Engines: [`SingleRank`] (one rank, no communication: the unsharded run); with the
//! `mpi` feature `MpiCommunicator` (rsmpi over the system's MPI, started with `mpirun`); with
//! the `nccl` feature `NcclCommunicator` (NCCL between CUDA GPUs, bootstrapped over a host
//! communicator).
//!
//! Every collective here moves bytes only; the arithmetic that combines what was gathered is
//! done by the caller in a fixed order, so the result never depends on the engine's own
//! reduction order (MPI's `MPI_Allreduce` does not promise one).

#[cfg(feature = "mpi")]
mod mpi_engine;
#[cfg(feature = "nccl")]
mod nccl_engine;

#[cfg(feature = "mpi")]
pub use mpi_engine::MpiCommunicator;
#[cfg(feature = "nccl")]
pub use nccl_engine::NcclCommunicator;

use crate::{Error, Result};

/// One rank's view of a group of ranks running the same program.
pub trait Communicator {
    /// This rank, in `0..size()`.
    fn rank(&self) -> usize;
    /// The number of ranks (at least 1).
    fn size(&self) -> usize;
    /// The engine's name, for messages (`single`, `mpi`).
    fn engine(&self) -> &str;
    /// Every rank's `local` bytes concatenated in rank order (an `MPI_Allgather`). Every rank
    /// must pass the same number of bytes; a collective call that every rank makes.
    ///
    /// # Errors
    /// [`Error::Invalid`] on every rank when the ranks' lengths differ (naming each rank's
    /// length), or a length over `i32::MAX` bytes; [`Error::Device`] when the engine fails.
    fn all_gather(&self, local: &[u8]) -> Result<Vec<u8>>;
    /// Ends every rank of the group with exit code `code` (`MPI_Abort`): what a rank that
    /// cannot go on calls, so that the others, possibly waiting in a collective, do not hang.
    fn abort(&self, code: i32) -> !;
}

/// The group of one rank: [`Communicator::all_gather`] returns the rank's own bytes. Runs the
/// sharded code paths unsharded, with no engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SingleRank;

impl Communicator for SingleRank {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn engine(&self) -> &str {
        "single"
    }

    fn all_gather(&self, local: &[u8]) -> Result<Vec<u8>> {
        Ok(local.to_vec())
    }

    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// The bytes of a failed rank's message that [`agree`] passes to the others.
const AGREE_MESSAGE: usize = 1024;

/// Every rank's verdict on a step that may fail on some ranks only (a file only rank 0 writes,
/// a device one machine lacks): one all-gather of a status byte and the first 1024 bytes of
/// any error message, so that either every rank goes on, or every rank returns an error (this
/// rank's own, or one naming each failed rank and its message) and none is left waiting in a
/// later collective. A collective call: every rank makes it.
///
/// # Errors
/// This rank's error; [`Error::Invalid`] naming the failed ranks and their messages when
/// others failed; the all-gather's errors.
pub fn agree<T, E: From<Error> + std::fmt::Display>(
    comm: &dyn Communicator,
    local: std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let mut mine = vec![0u8; 1 + AGREE_MESSAGE];
    match &local {
        Ok(_) => mine[0] = 1,
        Err(e) => {
            let text = e.to_string();
            let mut end = text.len().min(AGREE_MESSAGE);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            mine[1..1 + end].copy_from_slice(&text.as_bytes()[..end]);
        }
    }
    let all = comm.all_gather(&mine)?;
    let failed: Vec<String> = all
        .chunks_exact(1 + AGREE_MESSAGE)
        .enumerate()
        .filter(|(_, r)| r[0] == 0)
        .map(|(rank, r)| {
            let text = r[1..].split(|b| *b == 0).next().unwrap_or_default();
            format!("rank {rank}: {}", String::from_utf8_lossy(text))
        })
        .collect();
    match local {
        Err(e) => Err(e),
        Ok(_) if !failed.is_empty() => Err(Error::Invalid(format!(
            "rank {} of {} stops because other ranks failed: {}",
            comm.rank(),
            comm.size(),
            failed.join("; ")
        ))
        .into()),
        Ok(v) => Ok(v),
    }
}

/// Checks that every rank passed `lengths[rank]` equal bytes to an all-gather.
///
/// # Errors
/// [`Error::Invalid`] naming every rank's length when they differ.
#[cfg_attr(not(any(feature = "mpi", feature = "nccl")), allow(dead_code))]
pub(crate) fn check_equal_lengths(engine: &str, lengths: &[u64]) -> Result<()> {
    if lengths.windows(2).all(|w| w[0] == w[1]) {
        return Ok(());
    }
    let each: Vec<String> = lengths
        .iter()
        .enumerate()
        .map(|(rank, len)| format!("rank {rank}: {len}"))
        .collect();
    Err(Error::Invalid(format!(
        "{engine} all_gather: the ranks passed different byte counts ({}); every rank must \
         pass the same shape (mismatched shards or ranks)",
        each.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_rank_gathers_its_own_bytes() {
        let c = SingleRank;
        assert_eq!((c.rank(), c.size()), (0, 1));
        assert_eq!(c.all_gather(&[1, 2, 3]).unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn agree_passes_this_ranks_error_through() {
        assert_eq!(agree::<_, Error>(&SingleRank, Ok(5)).unwrap(), 5);
        let e = agree::<u8, _>(&SingleRank, Err(Error::Invalid("mine".into()))).unwrap_err();
        assert_eq!(e.to_string(), "mine");
    }

    #[test]
    fn unequal_lengths_name_every_rank() {
        assert!(check_equal_lengths("mpi", &[4, 4, 4]).is_ok());
        let e = check_equal_lengths("mpi", &[4, 8]).unwrap_err().to_string();
        assert!(e.contains("rank 0: 4") && e.contains("rank 1: 8"), "{e}");
    }
}
