//! The threads of a CPU device's multi-threaded launches: a rayon pool, started on the first
//! such launch and kept for the life of the device, whose threads stay awake for
//! [`LINGER`] after each launch.
//!
//! A rayon thread with nothing to do sleeps on a futex after a few rounds of yielding, and the
//! next launch then wakes it with a system call: on the 2-core development VM that wake was
//! 18% of the calling thread's time in a MiniLM `qforge finetune` (about 70 launches a step, a
//! few tens of microseconds of host work between them), and the woken thread started late. So
//! after a launch each pool thread runs a task that yields the core until the next launch
//! begins or [`LINGER`] has passed; a launch that finds the threads lingering hands them its
//! chunks without a wake (rayon wakes only sleeping threads). Yielding, not spinning, leaves
//! the core to any other runnable thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long the pool's threads stay awake after a launch.
pub(crate) const LINGER: Duration = Duration::from_micros(200);

/// See the module docs.
#[derive(Default)]
pub(crate) struct Pool {
    threads: OnceLock<std::result::Result<rayon::ThreadPool, String>>,
    /// Launches handing work to the pool now: a lingering thread stops when this is not 0.
    launching: Arc<AtomicUsize>,
    /// Lingering tasks running or queued.
    lingering: Arc<AtomicUsize>,
}

impl Pool {
    /// The pool of `threads` threads (the caller excluded), started on the first call; `None`
    /// if the system refused them.
    fn get(&self, threads: usize) -> Option<&rayon::ThreadPool> {
        self.threads
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("qforge-cpu-{i}"))
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .ok()
    }

    /// Runs `work` on the calling thread and on `helpers` pool threads at once (a pool of
    /// `pool_threads` threads, started if need be), and returns when every call has returned;
    /// on the caller alone if the system refused the pool's threads. Then the pool's threads
    /// linger ([`LINGER`]).
    pub(crate) fn run(&self, pool_threads: usize, helpers: usize, work: &(dyn Fn() + Sync)) {
        let Some(pool) = self.get(pool_threads) else {
            return work();
        };
        self.launching.fetch_add(1, Ordering::SeqCst);
        pool.in_place_scope(|scope| {
            for _ in 0..helpers {
                scope.spawn(|_| work());
            }
            work();
        });
        self.launching.fetch_sub(1, Ordering::SeqCst);
        // One lingering task per pool thread at most (running or queued behind other work).
        let n = pool.current_num_threads();
        for _ in 0..n {
            let claimed = self
                .lingering
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                    (c < n).then_some(c + 1)
                });
            if claimed.is_err() {
                break;
            }
            let (launching, lingering) = (Arc::clone(&self.launching), Arc::clone(&self.lingering));
            pool.spawn(move || {
                let start = Instant::now();
                while launching.load(Ordering::SeqCst) == 0 && start.elapsed() < LINGER {
                    std::thread::yield_now();
                }
                lingering.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pool, LINGER};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Each run calls `work` once on the caller and once per helper, from several threads at
    /// once too; the lingering tasks never outnumber the pool's threads and all end.
    #[test]
    fn runs_call_work_on_every_helper_and_the_lingering_tasks_end() {
        let pool = Pool::default();
        let calls = AtomicUsize::new(0);
        for helpers in [0, 1, 3, 2] {
            calls.store(0, Ordering::SeqCst);
            pool.run(3, helpers, &|| {
                calls.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(
                calls.load(Ordering::SeqCst),
                helpers + 1,
                "{helpers} helpers"
            );
            assert!(pool.lingering.load(Ordering::SeqCst) <= 3);
        }
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let calls = AtomicUsize::new(0);
                        pool.run(3, 2, &|| {
                            calls.fetch_add(1, Ordering::SeqCst);
                        });
                        assert_eq!(calls.load(Ordering::SeqCst), 3);
                        assert!(pool.lingering.load(Ordering::SeqCst) <= 3);
                    }
                });
            }
        });
        assert_eq!(pool.launching.load(Ordering::SeqCst), 0);
        let start = Instant::now();
        while pool.lingering.load(Ordering::SeqCst) > 0 {
            assert!(
                start.elapsed() < LINGER * 100 + Duration::from_secs(5),
                "lingering tasks still running"
            );
            std::thread::sleep(LINGER);
        }
    }
}
