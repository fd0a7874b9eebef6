//! Property tests that always cover what the docs promise: every listed case deterministically,
//! then random cases on top whose failures are persisted.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

/// The number of random cases a suite runs on top of its fixed ones: `PROPTEST_CASES` when set
/// (so a long run can raise it), else `default`.
///
/// # Panics
/// When `PROPTEST_CASES` is set but not a number.
pub fn random_cases(default: u32) -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PROPTEST_CASES={v:?} is not a number")),
        Err(_) => default,
    }
}

/// The proptest configuration of a suite's random part: `cases` cases (see [`random_cases`]),
/// failures persisted to `<source_file minus .rs>.proptest-regressions` beside the test (commit
/// that file: proptest replays its seeds first in every later run). Pass `file!()`.
pub fn config(source_file: &'static str, cases: u32) -> Config {
    Config {
        cases,
        source_file: Some(source_file),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// A runner with [`config`].
pub fn runner(source_file: &'static str, cases: u32) -> TestRunner {
    TestRunner::new(config(source_file, cases))
}

/// Runs `cases` random cases of `strategy` through `threads` runners at once (scoped threads),
/// each taking its share: the first is [`runner`]'s (it replays the persisted failures), the
/// others draw from RNGs forked from it, so the cases are as deterministic as one runner's. For
/// a suite that checks one case at a time on a slow device, so that every core works.
///
/// # Errors
/// Each failing runner's failure (shrunk; the first runner's persisted), one per line.
pub fn run_split<S>(
    source_file: &'static str,
    cases: u32,
    threads: usize,
    strategy: &S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError> + Sync,
) -> Result<(), String>
where
    S: Strategy + Sync,
{
    let threads = threads.clamp(1, cases.max(1) as usize);
    let mut first = runner(source_file, 0);
    let runners: Vec<TestRunner> = (0..threads)
        .map(|t| {
            let share = cases / threads as u32 + u32::from((t as u32) < cases % threads as u32);
            let config = config(source_file, share);
            if t == 0 {
                TestRunner::new(config)
            } else {
                TestRunner::new_with_rng(config, first.new_rng())
            }
        })
        .collect();
    let test = &test;
    let failures: Vec<String> = std::thread::scope(|s| {
        let running: Vec<_> = runners
            .into_iter()
            .map(|mut r| s.spawn(move || r.run(strategy, test).map_err(|e| e.to_string())))
            .collect();
        running
            .into_iter()
            .filter_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    .err()
            })
            .collect()
    });
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// Runs `test` on every value of `fixed` (all of them, failures collected), then on random
/// values of `strategy` through [`runner`] (shrunk and persisted on failure).
///
/// # Errors
/// One line per failing fixed case (`label: message`), then the random part's failure.
pub fn run_cases<S: Strategy>(
    source_file: &'static str,
    fixed: impl IntoIterator<Item = (String, S::Value)>,
    strategy: S,
    random: u32,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<(), String> {
    let mut failures = Vec::new();
    for (label, value) in fixed {
        if let Err(e) = test(value) {
            failures.push(format!("{label}: {e}"));
        }
    }
    if random > 0 {
        if let Err(e) = runner(source_file, random).run(&strategy, &test) {
            failures.push(format!("random case: {e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::run_split;
    use proptest::test_runner::TestCaseError;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    #[test]
    fn split_runners_run_every_case_and_report_a_failure() {
        // Failures are persisted beside the "source file": a temporary one.
        let dir = std::env::temp_dir().join(format!("qforge-run-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source: &'static str = Box::leak(dir.join("case.rs").display().to_string().into());
        let ran = AtomicU32::new(0);
        let ok = run_split(source, 200, 2, &(0u32..1000), |_| {
            ran.fetch_add(1, Relaxed);
            Ok(())
        });
        assert!(ok.is_ok());
        assert_eq!(ran.into_inner(), 200);
        let failed = run_split(source, 200, 2, &(0u32..1000), |v| {
            if v >= 500 {
                Err(TestCaseError::fail(format!("{v} is too big")))
            } else {
                Ok(())
            }
        });
        let e = failed.unwrap_err();
        // Shrunk to the smallest failing value, by each runner.
        assert!(e.contains("500 is too big"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
