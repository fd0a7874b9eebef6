//! Runs the example binary: every ahead-of-time kernel bit-exact with the interpreter on every
//! CPU feature level this machine has, and every text artifact matching the program's kernels.

use std::process::Command;

#[test]
fn the_example_runs_every_level_bit_exact() {
    let out = Command::new(env!("CARGO_BIN_EXE_qforge-example-aot"))
        .output()
        .expect("the example binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    // The baseline level runs on every x86-64 CPU, so at least it is checked.
    #[cfg(target_arch = "x86_64")]
    assert!(
        stdout.contains("level x86-64: bit-exact with the interpreter"),
        "{stdout}"
    );
    assert!(!stdout.contains("DIFFERS"), "{stdout}");
    // 4 kernels x 3 text targets.
    assert_eq!(stdout.matches("manifest checked").count(), 12, "{stdout}");
}
