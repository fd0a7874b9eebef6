//! The ranks' launches for the XLA SPMD engine ([`XlaSpmd`], feature `stablehlo`): the host
//! code of each rank runs on a [`Capture`] device with a [`Rehearsal`] of its rank, so that the
//! kernels it would launch on another engine are recorded, and the engine runs them as one
//! sharded program per launch.

use qforge_runtime::xla_spmd::{Capture, RankLaunch, XlaSpmd};
use qforge_runtime::{Communicator, Error, Result};

/// One rank's side of a group in which every rank passes the same bytes as this one: the
/// host code of rank `rank` runs alone, its agreements succeed, and its chained sums record
/// one launch, at its own step. The engine's program does the real communication.
pub(crate) struct Rehearsal {
    rank: usize,
    size: usize,
}

impl Communicator for Rehearsal {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn engine(&self) -> &str {
        "xla-spmd rehearsal"
    }

    fn all_gather(&self, local: &[u8]) -> Result<Vec<u8>> {
        Ok(local.repeat(self.size))
    }

    fn abort(&self, code: i32) -> ! {
        // Only a program's top level aborts (the CLI); the host ops recorded here never do.
        unreachable!(
            "a rehearsal of rank {} cannot abort (code {code})",
            self.rank
        )
    }
}

/// What [`record`] found: for each launch index, every rank's launch (rank order), and each
/// rank's host result. Empty launches when no rank launched anything (no rows). The host
/// results were computed from outputs the capture never wrote (and, for chained sums, from the
/// rehearsal's stand-in values): use them for shapes and dtypes only.
pub(crate) struct Recorded<T> {
    pub(crate) launches: Vec<Vec<RankLaunch>>,
    pub(crate) results: Vec<T>,
}

/// Runs `one(rank, device, communicator)` for each of `engine`'s ranks on a [`Capture`]
/// device and records its launches; every rank must make `launches` of them, or none when
/// none does.
///
/// # Errors
/// `one`'s errors; [`Error::Invalid`] naming `op` when a rank makes another number of launches
/// (ranks of which some have no rows and the others do, say).
pub(crate) fn record<T>(
    op: &str,
    engine: &XlaSpmd,
    launches: usize,
    one: impl Fn(usize, &Capture, &Rehearsal) -> Result<T>,
) -> Result<Recorded<T>> {
    let size = engine.ranks();
    let capture = Capture::new();
    let mut per_rank = Vec::new();
    let mut results = Vec::new();
    for rank in 0..size {
        results.push(one(rank, &capture, &Rehearsal { rank, size })?);
        per_rank.push(capture.take());
    }
    let counts: Vec<usize> = per_rank.iter().map(Vec::len).collect();
    if counts.iter().all(|c| *c == 0) {
        return Ok(Recorded {
            launches: Vec::new(),
            results,
        });
    }
    if counts.iter().any(|c| *c != launches) {
        return Err(Error::Invalid(format!(
            "{op}: the ranks made {counts:?} launches, {launches} each expected (every rank \
             must pass the same rows; a rank without rows launches nothing)"
        )));
    }
    // Launch `l` of every rank, for each `l`.
    let mut by_launch: Vec<Vec<RankLaunch>> = (0..launches).map(|_| Vec::new()).collect();
    for rank_launches in per_rank {
        for (l, launch) in rank_launches.into_iter().enumerate() {
            by_launch[l].push(launch);
        }
    }
    Ok(Recorded {
        launches: by_launch,
        results,
    })
}
