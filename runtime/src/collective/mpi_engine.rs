//! The MPI engine (feature `mpi`): rsmpi over the system's MPI (OpenMPI on Debian,
//! `libopenmpi-dev`). A program started with `mpirun -n D` makes one [`MpiCommunicator`] per
//! process; its world is the group.

use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives};

use super::{check_equal_lengths, Communicator};
use crate::{Error, Result};

/// `MPI_COMM_WORLD` of this process, with MPI initialized for the life of the value (dropping
/// it finalizes MPI; MPI cannot be initialized again in the same process).
pub struct MpiCommunicator {
    world: SimpleCommunicator,
    /// The most bytes per rank one `MPI_Allgather` moves ([`MpiCommunicator::set_gather_piece`]).
    piece: usize,
    // Finalizes MPI on drop, after `world` is gone.
    _universe: Universe,
}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MpiCommunicator(rank {} of {})",
            self.rank(),
            self.size()
        )
    }
}

impl MpiCommunicator {
    /// Initializes MPI and takes its world. Run under `mpirun -n D` for `D` ranks; a process
    /// started without `mpirun` is a world of one rank (MPI's singleton start).
    ///
    /// # Errors
    /// [`Error::Device`] when MPI was already initialized in this process (a second
    /// communicator; MPI allows one initialization per process).
    pub fn init() -> Result<MpiCommunicator> {
        let universe = mpi::initialize().ok_or_else(|| Error::Device {
            device: "mpi".into(),
            message: "MPI is already initialized in this process: make one MpiCommunicator \
                      and share it"
                .into(),
        })?;
        let world = universe.world();
        // MPI counts the whole receive buffer (every rank's part) as an `int`.
        let piece = i32::MAX as usize / (world.size().max(1) as usize);
        Ok(MpiCommunicator {
            world,
            piece,
            _universe: universe,
        })
    }

    /// Makes [`Communicator::all_gather`] move at most `bytes` per rank per `MPI_Allgather`
    /// (at least 1; the default and the most is `i32::MAX / size()`, MPI's count limit for the
    /// receive buffer): larger gathers are made of several. Every rank must set the same value.
    /// The result does not depend on it; tests set small pieces to run the split.
    pub fn set_gather_piece(&mut self, bytes: usize) {
        let most = i32::MAX as usize / self.size().max(1);
        self.piece = bytes.clamp(1, most);
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn engine(&self) -> &str {
        "mpi"
    }

    fn all_gather(&self, local: &[u8]) -> Result<Vec<u8>> {
        // Lengths first, so that ranks passing different shapes get an error, not undefined
        // behaviour in MPI_Allgather.
        let mut lengths = vec![0u64; self.size()];
        self.world
            .all_gather_into(&(local.len() as u64), &mut lengths[..]);
        check_equal_lengths(self.engine(), &lengths)?;
        let (n, size) = (local.len(), self.size());
        let total = n.checked_mul(size).ok_or_else(|| {
            Error::Invalid(format!(
                "mpi all_gather: {n} bytes on each of {size} ranks overflow the address space"
            ))
        })?;
        let mut out = vec![0u8; total];
        if n <= self.piece {
            self.world.all_gather_into(local, &mut out[..]);
            return Ok(out);
        }
        // Every rank has the same `n` (checked above), so every rank makes the same gathers.
        let mut buf = vec![0u8; self.piece * size];
        for start in (0..n).step_by(self.piece) {
            let len = self.piece.min(n - start);
            let recv = &mut buf[..len * size];
            self.world
                .all_gather_into(&local[start..start + len], &mut recv[..]);
            for (r, part) in recv.chunks_exact(len).enumerate() {
                out[r * n + start..r * n + start + len].copy_from_slice(part);
            }
        }
        Ok(out)
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
