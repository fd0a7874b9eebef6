//! [`AotDevice`]: runs ahead-of-time CPU kernels, choosing per kernel the best feature level
//! this CPU has, and following a [`Policy`] for kernels without a usable artifact.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use qforge_ir::cpu_abi::{ArgLayout, MANIFEST_VERSION};
use qforge_ir::{Arg, Kernel, SharedKernel};

#[cfg(feature = "compiler")]
use super::text_store::ReportOnce;
use super::AotKernel;
use crate::cpu::entry::{Compiled, Entry};
use crate::cpu::{launch, CpuOptions};
use crate::device::{Caps, Device, DeviceKind, KernelRef};
use crate::error::{Error, Result};

/// What a device given ahead-of-time artifacts ([`AotDevice`]; the GPU devices'
/// `with_artifacts` through a `TextStore`) does with a kernel that has no artifact for this
/// program (none built, or one built from other kernel text: stale) or none it can run (no
/// level this CPU has; another target, settings or manifest version; corrupted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Run the artifact when there is one, else compile the kernel with the JIT (when the
    /// runtime's `compiler` feature is on; an error naming the kernel otherwise). Each fallback
    /// is reported once on standard error, naming the kernel and why.
    PreferAot,
    /// Run only artifacts: a missing, stale or unrunnable one is an error naming the kernel.
    RequireAot,
    /// Ignore the artifacts and JIT-compile every kernel (needs the `compiler` feature).
    JitOnly,
}

/// Runs kernels compiled ahead of time (`qforge-build`, [`crate::include_kernels!`]) on the
/// host CPU, multithreaded like the JIT device, with bounds-checked code only. A launched
/// kernel is matched to its artifact by `Kernel::content_hash`, so a program whose kernel
/// changed after the build never runs the old code.
pub struct AotDevice {
    /// Best level per content hash.
    by_hash: HashMap<u64, &'static AotKernel>,
    /// Content hashes of the artifacts per kernel name (to tell stale from missing).
    names: HashMap<&'static str, Vec<u64>>,
    /// Kernels with artifacts none of whose levels this CPU has: name -> levels.
    unrunnable: HashMap<u64, Vec<&'static str>>,
    policy: Policy,
    #[cfg(feature = "compiler")]
    jit: Option<crate::CpuDevice>,
    /// Prepared launches by `Kernel::fingerprint`, confirmed with `==`.
    cache: Mutex<HashMap<u64, Arc<Compiled>>>,
    /// Kernels already reported as falling back.
    #[cfg(feature = "compiler")]
    reported: ReportOnce,
    options: CpuOptions,
    pool: launch::Pool,
}

impl std::fmt::Debug for AotDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AotDevice")
            .field("kernels", &self.by_hash.len())
            .field("policy", &self.policy)
            .finish()
    }
}

/// The feature levels from the baseline up (an unknown level ranks lowest).
const LEVELS: [&str; 5] = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64"];

/// How good a record this CPU can run is: higher level first, then more features, then LLVM
/// over Cranelift at the same level.
fn rank(k: &AotKernel) -> (usize, usize, bool) {
    let level = LEVELS
        .iter()
        .position(|l| *l == k.level)
        .map_or(0, |i| i + 1);
    (level, k.features.len(), k.backend == "llvm")
}

fn aot_error(message: String) -> Error {
    Error::Device {
        device: "cpu-aot".into(),
        message,
    }
}

impl AotDevice {
    /// A device running `kernels` (the `KERNELS` slice [`crate::include_kernels!`] defines)
    /// with [`CpuOptions::default`]. For each kernel it keeps the highest feature level whose
    /// features this CPU has.
    ///
    /// # Errors
    /// [`Error::Device`] when a record has another manifest version or was compiled without
    /// bounds checks, or `policy` needs the JIT and the runtime was built without its
    /// `compiler` feature (or the JIT cannot start).
    pub fn new(kernels: &'static [&'static AotKernel], policy: Policy) -> Result<Self> {
        let mut by_hash: HashMap<u64, &'static AotKernel> = HashMap::new();
        let mut names: HashMap<&'static str, Vec<u64>> = HashMap::new();
        let mut unrunnable: HashMap<u64, Vec<&'static str>> = HashMap::new();
        for k in kernels {
            if k.manifest_version != MANIFEST_VERSION {
                return Err(aot_error(format!(
                    "artifact of kernel '{}' ({}) has manifest version {}, this runtime reads {}",
                    k.name, k.level, k.manifest_version, MANIFEST_VERSION
                )));
            }
            if !k.bounds_checks {
                return Err(aot_error(format!(
                    "artifact of kernel '{}' ({}) was compiled without bounds checks",
                    k.name, k.level
                )));
            }
            names.entry(k.name).or_default().push(k.content_hash);
            if !k.runs_here() {
                unrunnable.entry(k.content_hash).or_default().push(k.level);
                continue;
            }
            let better = by_hash
                .get(&k.content_hash)
                .is_none_or(|c| rank(c) < rank(k));
            if better {
                by_hash.insert(k.content_hash, k);
            }
        }
        unrunnable.retain(|h, _| !by_hash.contains_key(h));
        #[cfg(feature = "compiler")]
        let jit = match policy {
            Policy::RequireAot => None,
            _ => Some(crate::CpuDevice::new()?),
        };
        #[cfg(not(feature = "compiler"))]
        if policy == Policy::JitOnly {
            return Err(aot_error(
                "policy JitOnly needs the JIT, and this program was built without qforge-runtime's \
                 `compiler` feature"
                    .into(),
            ));
        }
        Ok(AotDevice {
            by_hash,
            names,
            unrunnable,
            policy,
            #[cfg(feature = "compiler")]
            jit,
            cache: Mutex::new(HashMap::new()),
            #[cfg(feature = "compiler")]
            reported: ReportOnce::default(),
            options: CpuOptions::default(),
            pool: launch::Pool::default(),
        })
    }

    /// A device that runs only the records of feature level `level` (e.g. to check each level
    /// this CPU has against the interpreter).
    ///
    /// # Errors
    /// As [`AotDevice::new`], and [`Error::Device`] when no record has that level or this CPU
    /// lacks its features.
    pub fn for_level(
        kernels: &'static [&'static AotKernel],
        policy: Policy,
        level: &str,
    ) -> Result<Self> {
        let Some(first) = kernels.iter().find(|k| k.level == level) else {
            return Err(aot_error(format!("no artifact of feature level '{level}'")));
        };
        if !first.runs_here() {
            return Err(aot_error(format!(
                "this CPU lacks features of level '{level}' ({})",
                first.features.join(", ")
            )));
        }
        let mut dev = Self::new(kernels, policy)?;
        dev.by_hash.clear();
        for k in kernels.iter().filter(|k| k.level == level) {
            let better = dev
                .by_hash
                .get(&k.content_hash)
                .is_none_or(|c| rank(c) < rank(k));
            if better {
                dev.by_hash.insert(k.content_hash, k);
            }
        }
        dev.unrunnable.clear();
        Ok(dev)
    }

    /// The feature level of the artifact this device runs for `kernel`, if it has one.
    pub fn level_of(&self, kernel: &Kernel) -> Option<&'static str> {
        self.by_hash.get(&kernel.content_hash()).map(|c| c.level)
    }

    /// The record (level, backend, ...) this device runs for `kernel`, if it has one.
    pub fn record_of(&self, kernel: &Kernel) -> Option<&'static AotKernel> {
        self.by_hash.get(&kernel.content_hash()).copied()
    }

    /// Why `kernel` has no artifact to run here (missing, stale or no level for this CPU).
    fn why_missing(&self, kernel: &Kernel, hash: u64) -> String {
        if let Some(levels) = self.unrunnable.get(&hash) {
            return format!(
                "kernel '{}': this CPU lacks the features of every level it was built for ({})",
                kernel.name,
                levels.join(", ")
            );
        }
        match self.names.get(kernel.name.as_str()) {
            Some(hashes) => format!(
                "kernel '{}' is stale: its artifacts were built from kernel hash {} and the \
                 program's kernel is {hash:016x} (rebuild to regenerate them)",
                kernel.name,
                hashes
                    .iter()
                    .map(|h| format!("{h:016x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None if self.names.is_empty() => format!(
                "kernel '{}' (hash {hash:016x}): this program has no ahead-of-time CPU kernels \
                 at all (its build script named none, or was run with QFORGE_AOT_LEVELS=none)",
                kernel.name
            ),
            None => format!(
                "kernel '{}' (hash {hash:016x}) was not compiled ahead of time (add it to the \
                 build script's qforge_build::Builder)",
                kernel.name
            ),
        }
    }

    /// The prepared launch of `kernel`'s artifact, or `None` when it has none usable; a shared
    /// kernel is found by its own fingerprint and `Arc`, without hashing or comparing.
    fn prepared(
        &self,
        kernel: KernelRef<'_>,
    ) -> Result<std::result::Result<Arc<Compiled>, String>> {
        let fingerprint = kernel.fingerprint();
        let lock_error = || aot_error("cache lock poisoned".into());
        if let Some(c) = self
            .cache
            .lock()
            .map_err(|_| lock_error())?
            .get(&fingerprint)
        {
            if kernel.is(&c.kernel) {
                return Ok(Ok(Arc::clone(c)));
            }
        }
        let to_keep = kernel.to_arc();
        let kernel = kernel.kernel();
        let hash = kernel.content_hash();
        let Some(chosen) = self.by_hash.get(&hash) else {
            return Ok(Err(self.why_missing(kernel, hash)));
        };
        let k = *chosen;
        if k.params != kernel.params.len() {
            return Ok(Err(format!(
                "kernel '{}': artifact has {} parameters, the kernel {}",
                kernel.name,
                k.params,
                kernel.params.len()
            )));
        }
        let compiled = Arc::new(Compiled {
            kernel: to_keep,
            // SAFETY: the record was generated by qforge-build from the artifact compiled from
            // this very kernel text (equal content hash) with the kernel ABI, bounds checks on
            // (checked in `new`), for a level whose features this CPU has (checked in `new`).
            entry: unsafe { Entry::from_fn(k.entry) },
            layout: ArgLayout::from_counts(k.params, k.tables.len(), k.bounds_checks),
            tables: k.tables.iter().map(|t| t.to_vec()).collect(),
        });
        self.cache
            .lock()
            .map_err(|_| lock_error())?
            .insert(fingerprint, Arc::clone(&compiled));
        Ok(Ok(compiled))
    }

    /// [`Device::compile`] or [`Device::compile_shared`] of `kernel`.
    fn compile_ref(&self, kernel: KernelRef<'_>) -> Result<()> {
        qforge_ir::verify(kernel.kernel())?;
        #[cfg(feature = "compiler")]
        if let (Policy::JitOnly, Some(jit)) = (self.policy, &self.jit) {
            return kernel.compile_on(jit);
        }
        match self.prepared(kernel)? {
            Ok(_) => Ok(()),
            Err(why) => kernel.compile_on(self.fallback(kernel.kernel(), why)?),
        }
    }

    /// [`Device::launch`] or [`Device::launch_shared`] of `kernel`.
    fn launch_ref(&self, kernel: KernelRef<'_>, args: &mut [Arg<'_>]) -> Result<()> {
        #[cfg(feature = "compiler")]
        if let (Policy::JitOnly, Some(jit)) = (self.policy, &self.jit) {
            return kernel.launch_on(jit, args);
        }
        match self.prepared(kernel)? {
            Ok(compiled) => launch::launch(&compiled, &self.options, &self.pool, args),
            Err(why) => kernel.launch_on(self.fallback(kernel.kernel(), why)?, args),
        }
    }

    /// The JIT to fall back on for `kernel` (reported once), or the policy's error.
    #[cfg(feature = "compiler")]
    fn fallback(&self, kernel: &Kernel, why: String) -> Result<&crate::CpuDevice> {
        match (&self.jit, self.policy) {
            (Some(jit), Policy::PreferAot) => {
                self.reported
                    .report(&kernel.name, || format!("{why}; compiling it with the JIT"));
                Ok(jit)
            }
            _ => Err(aot_error(why)),
        }
    }

    #[cfg(not(feature = "compiler"))]
    fn fallback(&self, _kernel: &Kernel, why: String) -> Result<&dyn Device> {
        Err(aot_error(format!(
            "{why} (and this program has no JIT: qforge-runtime's `compiler` feature is off)"
        )))
    }
}

impl Device for AotDevice {
    fn name(&self) -> &str {
        "cpu-aot"
    }

    /// `llvm-aot` when any kernel runs an LLVM object, else `cranelift-aot`.
    fn backend(&self) -> &'static str {
        if self.by_hash.values().any(|c| c.backend == "llvm") {
            "llvm-aot"
        } else {
            "cranelift-aot"
        }
    }

    fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.compile_ref(KernelRef::Plain(kernel))
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        self.launch_ref(KernelRef::Plain(kernel), args)
    }

    fn compile_shared(&self, kernel: &SharedKernel) -> Result<()> {
        self.compile_ref(KernelRef::Shared(kernel))
    }

    fn launch_shared(&self, kernel: &SharedKernel, args: &mut [Arg<'_>]) -> Result<()> {
        self.launch_ref(KernelRef::Shared(kernel), args)
    }

    /// The most vector lanes of the chosen records (4 for Cranelift objects, up to 16 for
    /// LLVM objects at x86-64-v4; 4 without records), the launch threads of
    /// [`CpuOptions::default`]. Tile heuristics read it for speed only: every record runs
    /// every launch.
    fn caps(&self) -> Caps {
        Caps {
            kind: DeviceKind::Cpu,
            vector_lanes: self
                .by_hash
                .values()
                .map(|c| c.vector_lanes)
                .max()
                .unwrap_or(4),
            parallel_threads: launch::pool_threads(&self.options) as u32,
        }
    }
}
