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
        Ok(MpiCommunicator {
            world,
            _universe: universe,
        })
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
        if local.len() > i32::MAX as usize {
            return Err(Error::Invalid(format!(
                "mpi all_gather: {} bytes per rank is over MPI's count limit of {} bytes",
                local.len(),
                i32::MAX
            )));
        }
        let mut out = vec![0u8; local.len() * self.size()];
        self.world.all_gather_into(local, &mut out[..]);
        Ok(out)
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
