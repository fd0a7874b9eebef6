//! Launching a compiled kernel: binding, the `args` slot array, and the split of the grid into
//! contiguous chunks, which the calling thread and the device's pool threads take one at a time.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use qforge_ir::{bind, Arg, Binding};

use super::entry::Compiled;
use super::CpuOptions;
use crate::error::{Error, Result};

pub(crate) use super::pool::Pool;

/// Chunks per thread of a multi-threaded launch: idle threads take the next chunk, so a thread
/// that is slowed down (another process, a busy core) delays the launch by about one chunk.
const CHUNKS_PER_THREAD: usize = 4;

/// Checks `args` against the kernel and runs every work item, on the calling thread or, when
/// the launch is large, as contiguous chunks of the grid on the device's thread `pool`.
pub(crate) fn launch(
    compiled: &Compiled,
    options: &CpuOptions,
    pool: &Pool,
    args: &mut [Arg<'_>],
) -> Result<()> {
    let kernel = &compiled.kernel;
    let binding = bind(kernel, args)?;
    let slots = slots(compiled, &binding, args);
    let grid = binding.grid;
    let bytes: usize = args
        .iter()
        .map(|a| match a {
            Arg::Read(b) => b.len(),
            Arg::Write(b) => b.len(),
            Arg::Scalar(_) => 0,
        })
        .sum();
    let threads = thread_count(options, grid, bytes);
    let status_slot = compiled.layout.status();
    // Runs one chunk with its own status word; returns the status (0 or failing item + 1).
    let run_chunk = |(begin, end): (u32, u32)| -> u32 {
        let mut status: u32 = 0;
        let mut slots = slots.clone();
        if let Some(s) = status_slot {
            slots[s] = &mut status as *mut u32 as u64;
        }
        // SAFETY: the device that owns the code outlives the launch; `slots` follows the
        // compiled layout and points into `args`, which passed
        // `bind` and stays borrowed (untouched) for the whole launch; chunks run disjoint work
        // items, which write disjoint elements by the IR's contract; `status` is private to
        // this chunk; a device without bounds checks was created through the unsafe
        // `CpuDevice::new_unchecked`, whose caller vouches for in-range indices.
        unsafe { compiled.entry.run(&slots, begin, end) };
        status
    };
    let first_failure = if threads > 1 {
        // Every thread, the caller included, takes the next chunk until none is left; the
        // smallest failing status wins (each chunk reports its first failing item).
        let chunks = chunks(grid, threads * CHUNKS_PER_THREAD);
        let next = AtomicUsize::new(0);
        let failure = FirstFailure::default();
        let work = || {
            while let Some(&c) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                failure.record(run_chunk(c));
            }
        };
        pool.run(pool_threads(options) - 1, threads - 1, &work);
        failure.status()
    } else {
        run_chunk((0, grid))
    };
    match first_failure {
        0 => Ok(()),
        first => Err(Error::Ir(qforge_ir::Error::Execution {
            kernel: kernel.name.clone(),
            work_item: first - 1,
            message: "buffer index out of range (the interpreter names the access)".into(),
        })),
    }
}

/// The `args` array: buffer pointers and scalar bits, table pointers, and (bounds checks on)
/// the element counts; the status slot is filled per chunk.
fn slots(compiled: &Compiled, binding: &Binding, args: &mut [Arg<'_>]) -> Vec<u64> {
    let layout = &compiled.layout;
    let mut slots = vec![0u64; layout.len()];
    for (i, arg) in args.iter_mut().enumerate() {
        slots[i] = match arg {
            Arg::Read(b) => b.as_ptr() as u64,
            Arg::Write(b) => b.as_mut_ptr() as u64,
            Arg::Scalar(s) => s.bits() as u64,
        };
        if let Some(c) = layout.count(i) {
            slots[c] = binding.elements[i] as u64;
        }
    }
    for (t, data) in compiled.tables.iter().enumerate() {
        slots[layout.table(t)] = data.as_ptr() as u64;
    }
    slots
}

/// The smallest non-zero status the chunks of a launch report (0: none failed), shared by the
/// threads. Every `u32` but 0 is a status (failing item + 1, up to `u32::MAX`).
#[derive(Default)]
struct FirstFailure(AtomicU32);

impl FirstFailure {
    /// Keeps `status` if it is non-zero and below the smallest kept so far.
    fn record(&self, status: u32) {
        if status != 0 {
            let _ = self
                .0
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |kept| {
                    (kept == 0 || status < kept).then_some(status)
                });
        }
    }

    /// The smallest status recorded, or 0.
    fn status(self) -> u32 {
        self.0.into_inner()
    }
}

/// How many threads a launch of `grid` work items over `bytes` of buffers uses.
fn thread_count(options: &CpuOptions, grid: u32, bytes: usize) -> usize {
    if grid < 2 || (bytes < options.parallel_min_bytes && grid < options.parallel_min_grid) {
        return 1;
    }
    pool_threads(options).clamp(1, grid as usize)
}

/// The threads of the device's pool: [`CpuOptions::threads`], or all the cores (asked once per
/// process: `available_parallelism` reads the cgroup's quota and the affinity mask on every
/// call, which was 13.7% of a warm MiniLM `finetune`, where every launch asks).
pub(crate) fn pool_threads(options: &CpuOptions) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    options
        .threads
        .unwrap_or_else(|| {
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        })
        .max(1)
}

/// `n` contiguous chunks `(begin, end)` covering `0..grid` (at most `grid` chunks), sizes
/// differing by at most one.
fn chunks(grid: u32, n: usize) -> Vec<(u32, u32)> {
    let g = grid as u64;
    let n = (n as u64).clamp(1, g.max(1));
    (0..n)
        .map(|k| ((g * k / n) as u32, (g * (k + 1) / n) as u32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{chunks, FirstFailure};

    #[test]
    fn the_smallest_failing_status_wins_including_the_largest_item() {
        let f = FirstFailure::default();
        assert_eq!(f.status(), 0);
        for statuses in [
            vec![0, u32::MAX, 0],
            vec![u32::MAX, 7, 0, 9],
            vec![0, 0],
            vec![5, u32::MAX - 1, 5],
        ] {
            let f = FirstFailure::default();
            for s in &statuses {
                f.record(*s);
            }
            let want = statuses
                .iter()
                .copied()
                .filter(|s| *s != 0)
                .min()
                .unwrap_or(0);
            assert_eq!(f.status(), want, "{statuses:?}");
        }
    }

    #[test]
    fn chunks_cover_the_grid_in_order() {
        for (grid, n) in [(10u32, 3usize), (2, 2), (u32::MAX, 16), (7, 7), (3, 8)] {
            let c = chunks(grid, n);
            assert_eq!(c.len(), n.min(grid as usize));
            assert_eq!(c[0].0, 0);
            assert_eq!(c[c.len() - 1].1, grid);
            for w in c.windows(2) {
                assert_eq!(w[0].1, w[1].0);
            }
            assert!(c.iter().all(|&(b, e)| e > b));
        }
    }
}
