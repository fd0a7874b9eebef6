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
