//! A long-lived Python process that answers requests one line at a time: the runners of the
//! `stablehlo` device and of the XLA SPMD engine (feature `stablehlo`). It prints `ready` once
//! it has started (imports done), then one answer line per request line. Its stderr is drained
//! by a thread that keeps the last lines, for error messages.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Lines of stderr kept for error messages.
const KEPT_LINES: usize = 40;

/// A running runner (see the module docs); killed when dropped.
pub(crate) struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The last lines the runner wrote to stderr, which a thread drains (so a chatty runner can
    /// never block on a full pipe).
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Runner {
    /// Starts `script` (Python source) with `py` and `args`, and waits for its `ready`.
    ///
    /// # Errors
    /// A message when the process cannot start or stops before `ready` (with its last lines
    /// of stderr).
    pub(crate) fn start(py: &Path, script: &str, args: &[String]) -> Result<Runner, String> {
        let mut child = Command::new(py)
            .arg("-u")
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", py.display()))?;
        let (Some(stdin), Some(stdout), Some(err)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("the runner has no pipes".into());
        };
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                if let Ok(mut kept) = sink.lock() {
                    if kept.len() == KEPT_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            }
        });
        let mut runner = Runner {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            stderr,
        };
        let mut first = String::new();
        let _ = runner.stdout.read_line(&mut first);
        if first.trim() != "ready" {
            return Err(format!(
                "the runner ({}) did not start: {}",
                py.display(),
                runner.stop_and_tell(3)
            ));
        }
        Ok(runner)
    }

    /// Sends `request` (one line, without its newline) and returns the answer line, trimmed.
    ///
    /// # Errors
    /// A message, with the runner's last `tell` lines of stderr, when it has stopped (then
    /// it is of no further use: drop it).
    pub(crate) fn ask(&mut self, request: &str, tell: usize) -> Result<String, String> {
        let sent = self
            .stdin
            .write_all(format!("{request}\n").as_bytes())
            .and_then(|_| self.stdin.flush());
        let mut answer = String::new();
        let read = sent.and_then(|_| self.stdout.read_line(&mut answer));
        match read {
            Ok(n) if n > 0 => Ok(answer.trim().to_string()),
            _ => Err(format!("the runner stopped: {}", self.stop_and_tell(tell))),
        }
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the process and returns the lines of its stderr from the first that contains
    /// `Check failed` (XLA's fatal check), else its last `tell` lines, joined.
    fn stop_and_tell(&mut self, tell: usize) -> String {
        let _ = self.child.kill();
        let status = self.child.wait();
        // Let the stderr thread catch the last words.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let kept: Vec<String> = self
            .stderr
            .lock()
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default();
        let told = match kept.iter().position(|l| l.contains("Check failed")) {
            Some(at) => &kept[at..(at + tell).min(kept.len())],
            None => &kept[kept.len().saturating_sub(tell)..],
        };
        let status = status.map_or(String::new(), |s| format!("({s}) "));
        format!("{status}{}", told.join(" | "))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system's `python3`, or `None` (the test then has nothing to run).
    fn python3() -> Option<std::path::PathBuf> {
        let found = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("python3"))
                .find(|p| p.exists())
        });
        if found.is_none() {
            eprintln!("skipped: no python3 on PATH");
        }
        found
    }

    #[test]
    fn a_runner_answers_until_it_stops_and_then_tells_why() {
        let Some(py) = python3() else { return };
        let echo = "import sys\nprint('ready')\nfor line in sys.stdin:\n    \
                    if line.strip() == 'die':\n        \
                    print('noise', file=sys.stderr)\n        \
                    print('F0000 Check failed: x == y', file=sys.stderr)\n        \
                    print('*** stack', file=sys.stderr)\n        \
                    sys.stderr.flush()\n        sys.exit(3)\n    \
                    print('got ' + sys.argv[1] + ' ' + line.strip(), flush=True)\n";
        let mut r = Runner::start(&py, echo, &["2".into()]).unwrap();
        assert_eq!(r.ask("a", 3).unwrap(), "got 2 a");
        assert_eq!(r.ask("b", 3).unwrap(), "got 2 b");
        let e = r.ask("die", 1).unwrap_err();
        assert!(
            e.contains("the runner stopped") && e.contains("Check failed: x == y"),
            "{e}"
        );
        assert!(!e.contains("noise") && !e.contains("stack"), "{e}");
        assert!(!r.alive());
        // A runner that fails before `ready`: its last words.
        let fail = "import sys\nprint('no jax here', file=sys.stderr)\nsys.exit(1)\n";
        let e = Runner::start(&py, fail, &[]).err().unwrap();
        assert!(
            e.contains("did not start") && e.contains("no jax here"),
            "{e}"
        );
    }
}
