//! [`TextStore`]: the embedded text artifacts (PTX, WGSL, ...) a GPU device launches instead of
//! compiling at run time, chosen per kernel under a [`Policy`]; and `ReportOnce`, the
//! once-per-kernel note on standard error that every ahead-of-time device prints when it falls
//! back to a compiler.

use std::sync::Mutex;

use qforge_codegen::compile::{hex, Manifest, Target};
use qforge_ir::Kernel;

use super::{Policy, TextArtifact};
use crate::error::{Error, Result};

/// Kernels already reported as falling back, so each is said once on standard error.
#[derive(Debug, Default)]
pub(crate) struct ReportOnce(Mutex<Vec<String>>);

impl ReportOnce {
    /// Prints `qforge: {message}` on standard error the first time `kernel` is reported.
    pub(crate) fn report(&self, kernel: &str, message: impl FnOnce() -> String) {
        // A poisoned list only means another thread panicked while printing: keep using it.
        let mut reported = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !reported.iter().any(|k| k == kernel) {
            eprintln!("qforge: {}", message());
            reported.push(kernel.to_string());
        }
    }
}

/// An embedded artifact chosen for a kernel: its checked code and its parsed manifest
/// (launch shape, tables, parameters).
#[derive(Clone, Debug)]
pub struct Embedded {
    /// The artifact's record.
    pub artifact: &'static TextArtifact,
    /// The code text, checked against the record's code hash.
    pub code: &'static str,
    /// The artifact's manifest, checked against the record (kernel, content hash, target,
    /// code hash, settings).
    pub manifest: Manifest,
}

/// The text artifacts a device may launch (the `TEXT` slice of
/// [`crate::include_kernels!`]), looked up per kernel by name and `Kernel::content_hash`
/// and checked against the device's [`Target`] (kind and every setting, e.g. `sm=sm_90`
/// or `soft_div=true`) before use, under a [`Policy`]:
///
/// - [`Policy::PreferAot`]: a missing, stale, wrong-target, wrong-settings or corrupted
///   artifact is reported once per kernel on standard error, with the reason, and the
///   device compiles the kernel at run time;
/// - [`Policy::RequireAot`]: it is an error naming the kernel and the reason;
/// - [`Policy::JitOnly`]: the artifacts are ignored.
#[derive(Debug)]
pub struct TextStore {
    /// Device name in errors.
    device: String,
    artifacts: &'static [&'static TextArtifact],
    policy: Policy,
    reported: ReportOnce,
}

impl TextStore {
    /// A store of `artifacts` for the device named `device` (in its errors), following
    /// `policy`.
    pub fn new(
        device: impl Into<String>,
        artifacts: &'static [&'static TextArtifact],
        policy: Policy,
    ) -> TextStore {
        TextStore {
            device: device.into(),
            artifacts,
            policy,
            reported: ReportOnce::default(),
        }
    }

    /// A store with no artifacts that compiles every kernel ([`Policy::JitOnly`]): what a
    /// device has until it is given artifacts.
    pub fn jit_only(device: impl Into<String>) -> TextStore {
        TextStore::new(device, &[], Policy::JitOnly)
    }

    /// The policy the store follows.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The embedded artifact to launch for `kernel` on `target`, after `check` accepted its
    /// manifest (a device's launch-shape check, returning what the device needs from it),
    /// or `None` when the device should compile `kernel` at run time (policy
    /// [`Policy::JitOnly`], or [`Policy::PreferAot`] without a usable artifact: reported
    /// once per kernel on standard error).
    ///
    /// # Errors
    /// Under [`Policy::RequireAot`], [`Error::Device`] naming the device, the kernel and
    /// why no artifact can run: missing (none of the kernel's name for the target's kind),
    /// stale (built from another content hash), wrong settings, another manifest version,
    /// corrupted code or manifest, or a launch shape `check` refuses.
    pub fn select<T>(
        &self,
        kernel: &Kernel,
        target: &Target,
        check: impl Fn(&Manifest) -> std::result::Result<T, String>,
    ) -> Result<Option<(Embedded, T)>> {
        if self.policy == Policy::JitOnly {
            return Ok(None);
        }
        let found = self
            .find(kernel, target)
            .and_then(|e| match check(&e.manifest) {
                Ok(t) => Ok((e, t)),
                Err(why) => Err(format!(
                    "the {} artifact of kernel '{}' cannot launch here: {why}",
                    target.kind(),
                    kernel.name
                )),
            });
        match (found, self.policy) {
            (Ok(chosen), _) => Ok(Some(chosen)),
            (Err(why), Policy::RequireAot) => Err(Error::Device {
                device: self.device.clone(),
                message: format!("{why} (policy RequireAot)"),
            }),
            (Err(why), _) => {
                self.reported.report(&kernel.name, || {
                    format!("{}: {why}; compiling it at run time", self.device)
                });
                Ok(None)
            }
        }
    }

    /// The valid artifact of `kernel` for `target`, or why there is none.
    fn find(&self, kernel: &Kernel, target: &Target) -> std::result::Result<Embedded, String> {
        let kind = target.kind();
        let hash = kernel.content_hash();
        let named: Vec<&'static TextArtifact> = self
            .artifacts
            .iter()
            .copied()
            .filter(|a| a.name == kernel.name)
            .collect();
        let of_kind: Vec<&'static TextArtifact> =
            named.iter().copied().filter(|a| a.target == kind).collect();
        if of_kind.is_empty() {
            let mut others: Vec<&str> = named.iter().map(|a| a.target).collect();
            others.sort_unstable();
            others.dedup();
            let built = if others.is_empty() {
                String::new()
            } else {
                format!(" (it has artifacts for {} only)", others.join(", "))
            };
            return Err(format!(
                "kernel '{}' (hash {}) has no embedded {kind} artifact{built}: add the \
                 target to the build script's qforge_build::Builder",
                kernel.name,
                hex(hash)
            ));
        }
        let current: Vec<&'static TextArtifact> = of_kind
            .iter()
            .copied()
            .filter(|a| a.content_hash == hash)
            .collect();
        if current.is_empty() {
            let mut hashes: Vec<String> = of_kind.iter().map(|a| hex(a.content_hash)).collect();
            hashes.sort_unstable();
            hashes.dedup();
            return Err(format!(
                "kernel '{}' is stale: its {kind} artifacts were built from kernel hash {} \
                 and the program's kernel is {} (rebuild to regenerate them)",
                kernel.name,
                hashes.join(", "),
                hex(hash)
            ));
        }
        let settings = target.settings();
        let wanted: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut refusals = Vec::new();
        for artifact in current {
            match artifact
                .code_for(hash, kind, &wanted)
                .map_err(|e| match e {
                    // The record's own message, without its `device 'aot'` prefix.
                    Error::Device { message, .. } => message,
                    other => other.to_string(),
                })
                .and_then(|code| embedded(artifact, code, &wanted))
            {
                Ok(e) => return Ok(e),
                Err(why) => refusals.push(why),
            }
        }
        Err(refusals.join("; "))
    }
}

/// `artifact` with its manifest parsed and checked against the record.
fn embedded(
    artifact: &'static TextArtifact,
    code: &'static [u8],
    wanted: &[(&str, &str)],
) -> std::result::Result<Embedded, String> {
    let bad = |what: String| {
        format!(
            "artifact of kernel '{}' ({}): corrupted manifest: {what}",
            artifact.name, artifact.target
        )
    };
    let manifest = Manifest::from_json(artifact.manifest).map_err(|e| bad(e.to_string()))?;
    let record = [
        (
            "kernel",
            manifest.kernel.as_str(),
            artifact.name.to_string(),
        ),
        (
            "content_hash",
            manifest.content_hash.as_str(),
            hex(artifact.content_hash),
        ),
        (
            "target",
            manifest.target.as_str(),
            artifact.target.to_string(),
        ),
        (
            "code_hash",
            manifest.code_hash.as_str(),
            hex(artifact.code_hash),
        ),
    ];
    for (field, in_manifest, in_record) in record {
        if in_manifest != in_record {
            return Err(bad(format!(
                "{field} is {in_manifest}, the record says {in_record}"
            )));
        }
    }
    for (key, value) in wanted {
        let found = manifest.settings.get(*key).map(String::as_str);
        if found != Some(*value) {
            return Err(bad(format!(
                "{key}={}, the record says {key}={value}",
                found.unwrap_or("(unset)")
            )));
        }
    }
    let code = std::str::from_utf8(code).map_err(|e| {
        format!(
            "artifact of kernel '{}' ({}): corrupted: the code is not UTF-8 text: {e}",
            artifact.name, artifact.target
        )
    })?;
    Ok(Embedded {
        artifact,
        code,
        manifest,
    })
}
