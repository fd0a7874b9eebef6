//! Launching a compiled kernel: binding, the `args` slot array, and the split of the grid into
//! contiguous chunks over threads.

use qforge_ir::{bind, Arg, Binding};

use super::{Compiled, CpuOptions};
use crate::error::{Error, Result};

/// Checks `args` against the kernel and runs every work item, on the calling thread or on
/// several threads (contiguous chunks of the grid) when the launch is large.
pub(super) fn launch(
    compiled: &Compiled,
    options: &CpuOptions,
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
    let run_chunk = |begin: u32, end: u32| -> u32 {
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
    let statuses: Vec<u32> = if threads <= 1 {
        vec![run_chunk(0, grid)]
    } else {
        let chunks = chunks(grid, threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunks[1..]
                .iter()
                .map(|&(begin, end)| {
                    let run_chunk = &run_chunk;
                    scope.spawn(move || run_chunk(begin, end))
                })
                .collect();
            let mut statuses = vec![run_chunk(chunks[0].0, chunks[0].1)];
            for h in handles {
                // A chunk cannot panic (no Rust code runs inside); treat a panic as a failure.
                statuses.push(h.join().unwrap_or(1));
            }
            statuses
        })
    };
    match statuses.into_iter().filter(|&s| s != 0).min() {
        None => Ok(()),
        Some(first) => Err(Error::Ir(qforge_ir::Error::Execution {
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

/// How many threads a launch of `grid` work items over `bytes` of buffers uses.
fn thread_count(options: &CpuOptions, grid: u32, bytes: usize) -> usize {
    if grid < 2 || (bytes < options.parallel_min_bytes && grid < options.parallel_min_grid) {
        return 1;
    }
    let available = options
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    available.clamp(1, grid as usize)
}

/// `n` contiguous chunks `(begin, end)` covering `0..grid`, sizes differing by at most one.
fn chunks(grid: u32, n: usize) -> Vec<(u32, u32)> {
    let n = n as u64;
    let g = grid as u64;
    (0..n)
        .map(|k| ((g * k / n) as u32, (g * (k + 1) / n) as u32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_the_grid_in_order() {
        for (grid, n) in [(10u32, 3usize), (2, 2), (u32::MAX, 16), (7, 7)] {
            let c = chunks(grid, n);
            assert_eq!(c.len(), n);
            assert_eq!(c[0].0, 0);
            assert_eq!(c[n - 1].1, grid);
            for w in c.windows(2) {
                assert_eq!(w[0].1, w[1].0);
            }
            assert!(c.iter().all(|&(b, e)| e > b));
        }
    }
}
