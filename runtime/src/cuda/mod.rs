//! The CUDA device (cargo feature `cuda`): kernels compiled by `qforge_codegen::compile` for
//! `Target::Ptx` of the GPU's architecture (`sm_90` from compute capability 9.0, `sm_80` from
//! 8.0), loaded as driver modules (the driver's JIT turns the PTX into machine code), cached by
//! [`Kernel::fingerprint`], and launched as the artifact's `Launch::Ptx` says: its entry,
//! [`THREADS_PER_BLOCK`] threads per block, `ceil(grid / THREADS_PER_BLOCK)` blocks.
//!
//! The driver library (`libcuda`) is opened at run time through cudarc's dynamic loader, so a
//! build with the feature runs on machines without CUDA: [`CudaDevice::new`] then returns
//! [`Error::Device`] saying the driver was not found. The library is probed before cudarc's
//! loader runs (that loader panics when it is missing), and every call into cudarc runs under
//! a guard that turns a panic into an error: no driver problem ever aborts the process.
//!
//! Buffers are copied to device memory before each launch (`Read` and `Write` buffers alike,
//! so elements a kernel does not store keep their values, as on every other device) and the
//! writable ones are copied back after it. Launches are serialized on one stream.
//!
//! Out-of-range buffer indices: the PTX backend emits no bounds checks (it has no status-word
//! convention like the CPU device's), so this device cannot report which work item indexed out
//! of range. An access outside every allocation surfaces as the driver's
//! `CUDA_ERROR_ILLEGAL_ADDRESS`, reported as [`Error::Device`] naming the kernel; that error is
//! sticky, so the device refuses every later launch too. An access that lands in another live
//! allocation is not detected. Library kernels never index out of range on arguments that pass
//! [`qforge_ir::bind`].
//!
//! [`CudaDevice::with_artifacts`] gives the device PTX artifacts embedded by `qforge-build`
//! ([`crate::include_kernels!`]'s `TEXT`): a kernel whose artifact matches its content hash and
//! this GPU's [`SmTarget`] loads that PTX instead of compiling, under a [`Policy`].
//!
//! [`THREADS_PER_BLOCK`]: qforge_codegen::ptx::THREADS_PER_BLOCK

pub(crate) mod driver;
mod launch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use qforge_codegen::compile::{Launch, Manifest, Options, Target};
use qforge_codegen::ptx::{self, PtxParam, SmTarget};
use qforge_ir::{Arg, Kernel, ParamKind};

use crate::aot::{Policy, TextArtifact, TextStore};
use crate::device::{Caps, Device};
use crate::error::{Error, Result};

/// The device name in messages and in `--device`.
const NAME: &str = "cuda";

/// A kernel loaded on the GPU.
struct Compiled {
    /// The kernel it was lowered from (guards against hash collisions).
    kernel: Kernel,
    /// How each parameter is passed, in parameter order.
    params: Vec<PtxParam>,
    /// Threads per block (the artifact's `Launch::Ptx`).
    threads_per_block: u32,
    /// The module's entry (keeps the driver module loaded).
    function: CudaFunction,
}

/// Runs kernels on an NVIDIA GPU (compute capability 8.0 or later) through the PTX backend and
/// the CUDA driver; thread-safe (launches are serialized).
///
/// ```no_run
/// use qforge_runtime::{CudaDevice, Device};
/// let device = CudaDevice::new().expect("no CUDA GPU");
/// println!("{} on {}", device.name(), device.gpu_name());
/// ```
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    gpu: String,
    capability: (i32, i32),
    driver_version: i32,
    target: SmTarget,
    cache: Mutex<HashMap<u64, Arc<Compiled>>>,
    /// Held by every launch and module load, so launches do not interleave on the stream.
    launch_lock: Mutex<()>,
    /// Embedded PTX artifacts and the policy for them ([`CudaDevice::with_artifacts`]).
    artifacts: TextStore,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("gpu", &self.gpu)
            .field("capability", &self.capability)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens GPU 0 (see [`CudaDevice::with_ordinal`]).
    ///
    /// # Errors
    /// As [`CudaDevice::with_ordinal`].
    pub fn new() -> Result<Self> {
        Self::with_ordinal(0)
    }

    /// Loads the CUDA driver, opens GPU `ordinal` (its primary context) and picks the PTX target
    /// from its compute capability.
    ///
    /// # Errors
    /// [`Error::Device`] when the driver library is not found ("CUDA driver not found
    /// (libcuda.so): ..."), is older than CUDA 12.0 (the PTX backend writes ISA 8.0), or cannot
    /// open the GPU (no GPU, bad ordinal); [`Error::Codegen`] (`Unsupported`) naming the compute
    /// capability when it is below 8.0 (see [`CudaDevice::target_for_capability`]).
    pub fn with_ordinal(ordinal: usize) -> Result<Self> {
        let fail = |message: String| device_error(NAME, message);
        driver::probe_library().map_err(fail)?;
        let version = driver::driver_version().map_err(fail)?;
        driver::check_driver_version(version).map_err(fail)?;
        let (ctx, gpu, capability) = driver::guard(|| {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| format!("cannot open GPU {ordinal}: {}", driver::describe(&e)))?;
            let gpu = ctx.name().map_err(|e| {
                format!("GPU {ordinal}: reading its name: {}", driver::describe(&e))
            })?;
            let capability = ctx.compute_capability().map_err(|e| {
                format!(
                    "GPU {ordinal}: reading its compute capability: {}",
                    driver::describe(&e)
                )
            })?;
            // SAFETY: this device uses the context's one default stream only, and every buffer
            // is allocated, used and freed on it, so no cross-stream event tracking is needed.
            unsafe { ctx.disable_event_tracking() };
            Ok((ctx, gpu, capability))
        })
        .map_err(fail)?;
        let target = Self::target_for_capability(capability.0, capability.1)?;
        let stream = ctx.default_stream();
        Ok(CudaDevice {
            ctx,
            stream,
            ordinal,
            gpu,
            capability,
            driver_version: version,
            target,
            cache: Mutex::new(HashMap::new()),
            launch_lock: Mutex::new(()),
            artifacts: TextStore::jit_only(NAME),
        })
    }

    /// The device, loading the PTX artifacts of `text` (the `TEXT` slice of
    /// [`crate::include_kernels!`]) under `policy` instead of compiling: a kernel runs the
    /// artifact of its name and `Kernel::content_hash` built for this GPU's
    /// [`CudaDevice::target`] (setting `sm`), whose code hash and manifest version check, and
    /// whose manifest gives a PTX entry and threads per block. Other targets' artifacts are
    /// ignored. Kernels loaded before are dropped from the cache.
    ///
    /// With [`Policy::PreferAot`] a kernel without such an artifact is compiled, said once per
    /// kernel on standard error with the reason; with [`Policy::RequireAot`] its launch (and
    /// [`Device::compile`]) fails with [`Error::Device`] naming the kernel and what was wrong
    /// (missing, stale, another `sm`, corrupted); [`Policy::JitOnly`] ignores `text`.
    pub fn with_artifacts(
        mut self,
        text: &'static [&'static TextArtifact],
        policy: Policy,
    ) -> Self {
        self.artifacts = TextStore::new(NAME, text, policy);
        self.cache
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self
    }

    /// The PTX target for a GPU of compute capability `major.minor`: `sm_90` from 9.0 (Hopper
    /// and later: the driver JIT-compiles `sm_90` PTX for newer GPUs), `sm_80` from 8.0.
    ///
    /// # Errors
    /// [`Error::Codegen`] (`Unsupported`) naming the capability when it is below 8.0.
    pub fn target_for_capability(major: i32, minor: i32) -> Result<SmTarget> {
        if major >= 9 {
            Ok(SmTarget::Sm90)
        } else if major == 8 {
            Ok(SmTarget::Sm80)
        } else {
            Err(Error::Codegen(qforge_codegen::Error::Unsupported {
                backend: ptx::BACKEND,
                op: format!(
                    "GPUs of compute capability {major}.{minor} (sm_{major}{minor}): it emits \
                     sm_80 and sm_90 code, which needs compute capability 8.0 or later"
                ),
            }))
        }
    }

    /// The GPU's name as the driver reports it (`NVIDIA H100 80GB HBM3`).
    pub fn gpu_name(&self) -> &str {
        &self.gpu
    }

    /// The GPU's ordinal (0 for [`CudaDevice::new`]).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The GPU's compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.capability
    }

    /// The driver's CUDA version as `cuDriverGetVersion` reports it (`12090` for 12.9).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// The PTX target kernels are lowered for on this GPU.
    pub fn target(&self) -> SmTarget {
        self.target
    }

    fn err(&self, message: String) -> Error {
        device_error(NAME, message)
    }

    /// The loaded form of `kernel`, from the cache or freshly lowered and loaded.
    fn compiled(&self, kernel: &Kernel) -> Result<Arc<Compiled>> {
        let hash = kernel.fingerprint();
        {
            let cache = self
                .cache
                .lock()
                .map_err(|_| self.err("cache lock poisoned".into()))?;
            if let Some(c) = cache.get(&hash) {
                if c.kernel == *kernel {
                    return Ok(Arc::clone(c));
                }
            }
        }
        let target = Target::Ptx(self.target);
        let (text, (entry, threads_per_block)) =
            match self.artifacts.select(kernel, &target, ptx_entry)? {
                Some((embedded, launch)) => (embedded.code.to_string(), launch),
                None => {
                    let artifact = qforge_codegen::compile(kernel, &target, &Options::default())?;
                    let launch = ptx_entry(&artifact.manifest).map_err(|why| {
                        self.err(format!("'{}': the ptx artifact {why}", kernel.name))
                    })?;
                    let text = artifact.code.text().ok_or_else(|| {
                        self.err(format!("'{}': the ptx artifact has no text", kernel.name))
                    })?;
                    (text.to_string(), launch)
                }
            };
        let function = {
            let _guard = self
                .launch_lock
                .lock()
                .map_err(|_| self.err("launch lock poisoned".into()))?;
            driver::guard(|| self.load(&text, &entry))
                .map_err(|m| self.err(format!("'{}': {m}", kernel.name)))?
        };
        let compiled = Arc::new(Compiled {
            kernel: kernel.clone(),
            params: ptx_params(kernel),
            threads_per_block,
            function,
        });
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| self.err("cache lock poisoned".into()))?;
        cache.insert(hash, Arc::clone(&compiled));
        Ok(compiled)
    }

    /// Loads the PTX `text` into the context and finds its `entry`; a JIT failure carries the
    /// driver's error log.
    fn load(&self, text: &str, entry: &str) -> std::result::Result<CudaFunction, String> {
        let loaded = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(text.to_string()))
            .map_err(|e| {
                let log = driver::jit_error_log(text);
                let log = if log.is_empty() {
                    String::new()
                } else {
                    format!("; JIT log:\n{log}")
                };
                format!(
                    "loading the {} PTX module: {}{log}",
                    self.target.name(),
                    driver::describe(&e)
                )
            })?;
        loaded.load_function(entry).map_err(|e| {
            format!(
                "finding the entry '{entry}' in the loaded module: {}",
                driver::describe(&e)
            )
        })
    }
}

/// The entry and threads per block of a PTX artifact's manifest, when it launches as a PTX
/// entry with at least one thread per block; else what it launches as.
fn ptx_entry(manifest: &Manifest) -> std::result::Result<(String, u32), String> {
    match &manifest.launch {
        Launch::Ptx {
            entry,
            threads_per_block,
        } if *threads_per_block > 0 => Ok((entry.clone(), *threads_per_block)),
        other => Err(format!("launches as {other:?}, expected a PTX entry")),
    }
}

/// How each parameter of `kernel` is passed to its PTX entry: a buffer as its 64-bit device
/// address, a scalar by value (the PTX backend's convention).
fn ptx_params(kernel: &Kernel) -> Vec<PtxParam> {
    kernel
        .params
        .iter()
        .map(|(_, p)| match &p.kind {
            ParamKind::Buffer { .. } => PtxParam::Pointer,
            ParamKind::Scalar(ty) => PtxParam::Scalar(*ty),
        })
        .collect()
}

fn device_error(device: &str, message: String) -> Error {
    Error::Device {
        device: device.to_string(),
        message,
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        NAME
    }
    fn backend(&self) -> &'static str {
        ptx::BACKEND
    }
    fn caps(&self) -> Caps {
        Caps::GPU
    }
    fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.compiled(kernel).map(|_| ())
    }
    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        let binding = qforge_ir::bind(kernel, args)?;
        let compiled = self.compiled(kernel)?;
        let _guard = self
            .launch_lock
            .lock()
            .map_err(|_| self.err("launch lock poisoned".into()))?;
        launch::launch(self, &compiled, &binding, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_follows_the_compute_capability() {
        for (major, minor, want) in [
            (8, 0, SmTarget::Sm80),
            (8, 6, SmTarget::Sm80),
            (8, 9, SmTarget::Sm80),
            (9, 0, SmTarget::Sm90),
            (10, 0, SmTarget::Sm90),
            (12, 0, SmTarget::Sm90),
        ] {
            assert_eq!(
                CudaDevice::target_for_capability(major, minor).expect("supported"),
                want,
                "{major}.{minor}"
            );
        }
        for (major, minor) in [(7, 5), (7, 0), (6, 1)] {
            let e = CudaDevice::target_for_capability(major, minor).expect_err("too old");
            let text = e.to_string();
            assert!(
                text.contains(&format!("compute capability {major}.{minor}"))
                    && text.contains("8.0"),
                "{text}"
            );
        }
    }
}
