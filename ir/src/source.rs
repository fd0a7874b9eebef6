//! Source locations of macro-built kernels: a side table from values and statements to the line
//! of the user's Rust code that built them, kept outside the [`crate::Kernel`] (its equality and
//! hash never see it), so that a verification error points at the user's code.

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, VerifyError};
use crate::kernel::Value;

/// A place in a Rust source file (`file!()`, `line!()`, `column!()` of the user's code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourceLoc {
    /// The file, as `file!()` names it.
    pub file: &'static str,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Where each value and statement of a kernel was built: values by handle, statements by the
/// verifier's path (`body[3].then[0]`). Filled by [`crate::KernelBuilder`] while a location is
/// set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMap {
    pub(crate) values: HashMap<Value, SourceLoc>,
    pub(crate) stmts: HashMap<String, SourceLoc>,
}

impl SourceMap {
    /// Where `value` was built, if recorded.
    pub fn value(&self, value: Value) -> Option<SourceLoc> {
        self.values.get(&value).copied()
    }

    /// Where the statement at `path` (the verifier's form, e.g. `body[3].then[0]`) was built.
    pub fn stmt(&self, path: &str) -> Option<SourceLoc> {
        self.stmts.get(path).copied()
    }

    /// The source location of a verifier error: the value it names (`%N`), else the innermost
    /// recorded statement on its path.
    pub fn locate(&self, error: &VerifyError) -> Option<SourceLoc> {
        let loc = &error.location;
        if let Some(at) = loc.find('%') {
            let digits: String = loc[at + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Some(v) = digits
                .parse::<usize>()
                .ok()
                .and_then(|i| self.values.keys().find(|v| v.index() == i))
            {
                return self.value(*v);
            }
        }
        // `body[3].then[0].else[1]` and its ancestors, innermost first.
        let path: String = loc.split_whitespace().next().unwrap_or("").to_string();
        let mut end = path.len();
        loop {
            if let Some(l) = self.stmt(&path[..end]) {
                return Some(l);
            }
            match path[..end].rfind('[') {
                Some(open) => match path[..open].rfind(']') {
                    Some(close) => end = close + 1,
                    None => return None,
                },
                None => return None,
            }
        }
    }

    /// `error` with every verifier problem's location followed by its source location
    /// (` at file:line:column`) where one is recorded; other errors unchanged.
    pub fn annotate(&self, error: Error) -> Error {
        match error {
            Error::Verify { kernel, errors } => Error::Verify {
                kernel,
                errors: errors
                    .into_iter()
                    .map(|e| match self.locate(&e) {
                        Some(at) => VerifyError {
                            location: format!("{} at {at}", e.location),
                            message: e.message,
                        },
                        None => e,
                    })
                    .collect(),
            },
            other => other,
        }
    }
}
