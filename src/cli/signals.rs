//! Ctrl-C (SIGINT), SIGTERM and SIGHUP: the temporary outputs being written are removed and the
//! process exits with `128 + signal` (130, 143, 129), as a shell reports a process killed by it,
//! so an interrupted run writes nothing.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Starts the thread that handles the signals (once, at start-up).
///
/// # Errors
/// When the handlers cannot be registered (the caller runs on without them).
pub fn install() -> std::io::Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("qforge-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let removed = crate::checkpoint::io::remove_pending_temps();
                let what = match sig {
                    SIGINT => "interrupted",
                    SIGTERM => "terminated (SIGTERM)",
                    _ => "hung up (SIGHUP)",
                };
                if removed > 0 {
                    eprintln!("error: {what}; no output written");
                } else {
                    eprintln!("error: {what}");
                }
                std::process::exit(128 + sig);
            }
        })?;
    Ok(())
}
