//! The ranks' launches for the XLA SPMD engine ([`XlaSpmd`], feature `stablehlo`): the host
//! code of each rank runs on a [`Capture`] device with a [`Rehearsal`] of its rank, so that the
//! kernels it would launch on another engine are recorded, and the engine runs them as one
//! sharded program per launch. Host code whose launches are independent runs a second time on
//! a [`Replay`] device, which gives it the engine's results ([`run_each_rank`]).

use qforge_runtime::xla_spmd::{writable, Capture, Combine, RankLaunch, Replay, XlaSpmd};
use qforge_runtime::{Communicator, Device, Error, Result};

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
/// device and records its launches; every rank must make `launches` of them (as many as rank
/// 0 when `None`), or none when none does.
///
/// # Errors
/// `one`'s errors; [`Error::Invalid`] naming `op` when a rank makes another number of launches
/// (ranks of which some have no rows and the others do, say).
pub(crate) fn record<T>(
    op: &str,
    engine: &XlaSpmd,
    launches: Option<usize>,
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
    let launches = launches.unwrap_or(counts[0]);
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

/// Runs host code on every rank of `engine`: `one(rank, device)` runs once per rank on a
/// [`Capture`] device to record its launches, the engine runs launch `l` of every rank as one
/// sharded program (each rank keeps its own results, [`Combine::Local`]), and `one` runs again
/// per rank on a [`Replay`] device that gives each launch that rank's results. Returns each
/// rank's result of the second run, in rank order. `one` must build its inputs afresh on each
/// call (the first run's results are dropped), and no launch may read what an earlier one of
/// the same call wrote (the capture computed nothing: the replay names such a launch).
///
/// # Errors
/// `one`'s errors; [`Error::Invalid`] naming `op` when the ranks make different numbers of
/// launches; the engine's and the replay's errors.
pub(crate) fn run_each_rank<T>(
    op: &str,
    engine: &XlaSpmd,
    one: impl Fn(usize, &dyn Device) -> Result<T>,
) -> Result<Vec<T>> {
    let d = engine.ranks();
    let recorded = record(op, engine, None, |rank, capture, _| one(rank, capture))?;
    let mut per_rank: Vec<Vec<RankLaunch>> = vec![Vec::new(); d];
    let mut results: Vec<Vec<Vec<Vec<u8>>>> = vec![Vec::new(); d];
    for launch in recorded.launches {
        let outputs = writable(&launch[0].kernel).count();
        let global = engine.run(&launch, &vec![Combine::Local; outputs])?;
        // Each global result is the ranks' results concatenated in rank order.
        for (rank, rank_launch) in launch.into_iter().enumerate() {
            let mine = global
                .iter()
                .map(|g| {
                    let n = g.len() / d;
                    g[rank * n..(rank + 1) * n].to_vec()
                })
                .collect();
            per_rank[rank].push(rank_launch);
            results[rank].push(mine);
        }
    }
    per_rank
        .into_iter()
        .zip(results)
        .enumerate()
        .map(|(rank, (launches, outputs))| {
            let replay = Replay::new(rank, launches, outputs);
            let out = one(rank, &replay).map_err(|e| {
                Error::Invalid(format!(
                    "{op}: rank {rank}, replaying the engine's results: {e}"
                ))
            })?;
            replay.finish()?;
            Ok(out)
        })
        .collect()
}
