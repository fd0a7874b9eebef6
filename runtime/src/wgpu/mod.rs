//! The wgpu device (cargo feature `wgpu`): kernels compiled by `qforge_codegen::compile` for
//! `Target::Wgsl` (the WGSL text of the artifact, launched as its `Launch::Wgsl` says), compiled
//! into compute pipelines on any wgpu adapter (a GPU, or Mesa's lavapipe CPU Vulkan driver),
//! cached by [`Kernel::fingerprint`], and dispatched with the binding layout of
//! [`WgslLayout`].
//!
//! Every wgpu call that can fail validation runs inside error scopes, and the device's
//! uncaptured-error handler only records the message, so a driver or validation error becomes
//! [`Error::Device`], never a panic.
//!
//! At start-up a probe kernel checks the driver's `fma`, `/` and `sqrt` against the host; each
//! one that is not exact is replaced in every kernel by the WGSL backend's exact integer routine
//! ([`WgslOptions`]). A second probe runs a loop of 70000 iterations: a driver that stops loops
//! early (Mesa's llvmpipe/lavapipe stops a loop after 65535 iterations) is recorded as a
//! deviation in [`WgpuDevice::conformance`] (not emulated yet). The environment variable
//! `QFORGE_WGSL_SOFT_MATH` forces the routines on a conformant driver too (`1` or `all`: all
//! three; or a comma list of `fma`, `div`, `sqrt`; `0` or empty: none), and so does
//! [`WgpuDevice::with_soft_math`].
//!
//! [`WgpuDevice::with_artifacts`] gives the device WGSL artifacts embedded by `qforge-build`
//! ([`crate::include_kernels!`]'s `TEXT`): a kernel whose artifact matches its content hash and
//! this device's soft-math settings runs that WGSL instead of compiling, under a [`Policy`].

#[cfg(test)]
mod artifact_tests;
mod launch;
mod probe;

pub use probe::Conformance;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use qforge_codegen::compile::{Launch, Manifest, Options, Target};
use qforge_codegen::wgsl::{WgslLayout, WgslOptions, WORKGROUP_SIZE};
use qforge_ir::{Arg, Kernel};

use crate::aot::{Policy, TextArtifact, TextStore};
use crate::device::{Caps, Device, DeviceKind};
use crate::error::{Error, Result};

/// A compiled kernel in the cache.
struct Compiled {
    /// The kernel it was compiled from (guards against hash collisions).
    kernel: Kernel,
    layout: WgslLayout,
    bind_group_layout: wgpu::BindGroupLayout,
    pipeline: wgpu::ComputePipeline,
}

/// Runs kernels on a wgpu adapter through the WGSL backend; thread-safe (launches are
/// serialized).
///
/// ```no_run
/// use qforge_runtime::{Device, WgpuDevice};
/// let device = WgpuDevice::new().expect("no wgpu adapter");
/// println!("{}", device.name());
/// ```
pub struct WgpuDevice {
    name: String,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    cache: Mutex<HashMap<u64, Arc<Compiled>>>,
    /// Launches hold this lock: they share the queue, and a launch's errors could otherwise be
    /// reported through the uncaptured-error handler to another launch's scope check.
    launch_lock: Mutex<()>,
    /// Errors that escaped every error scope (recorded by the uncaptured-error handler).
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// What the start-up probe found.
    conformance: Conformance,
    /// The software routines every kernel is lowered with.
    soft_math: WgslOptions,
    /// Embedded WGSL artifacts and the policy for them ([`WgpuDevice::with_artifacts`]).
    artifacts: TextStore,
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl WgpuDevice {
    /// Opens the first adapter wgpu finds (Vulkan, Metal or DX12, or what `WGPU_BACKEND`
    /// names; a high-performance adapter first, then a fallback/software one such as Mesa's
    /// lavapipe) with the adapter's own limits, and runs the conformance probe on it.
    ///
    /// Kernels use the exact software `fma`, `/` or `sqrt` where the probe finds the driver's
    /// inexact, and where `QFORGE_WGSL_SOFT_MATH` asks for them (see the module docs).
    ///
    /// # Errors
    /// [`Error::Device`] when no adapter is found, the device cannot be created, or
    /// `QFORGE_WGSL_SOFT_MATH` holds something other than the values listed in the module docs.
    pub fn new() -> Result<Self> {
        Self::with_soft_math(WgslOptions::HARDWARE)
    }

    /// [`WgpuDevice::new`], with the software routines named by `force` used even where the
    /// driver passes the probe (for tests and CI on conformant drivers).
    ///
    /// # Errors
    /// As [`WgpuDevice::new`].
    pub fn with_soft_math(force: WgslOptions) -> Result<Self> {
        let from_env = soft_math_from_env()?;
        // Vulkan, Metal and DX12 (the GL backend's compute support is too narrow, and probing
        // it prints EGL noise); `WGPU_BACKEND` overrides.
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::PRIMARY;
        let instance = wgpu::Instance::new(desc.with_env());
        let adapter = [false, true]
            .into_iter()
            .find_map(|fallback| {
                pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::HighPerformance,
                    force_fallback_adapter: fallback,
                    ..Default::default()
                }))
                .ok()
            })
            .ok_or_else(|| device_error("wgpu", "no wgpu adapter found".into()))?;
        let info = adapter.get_info();
        let name = format!("wgpu ({}, {:?})", info.name, info.backend);
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("qforge"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| device_error(&name, format!("cannot create the device: {e}")))?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let mut dev = WgpuDevice {
            name,
            device,
            queue,
            limits,
            cache: Mutex::new(HashMap::new()),
            launch_lock: Mutex::new(()),
            uncaptured,
            conformance: Conformance::default(),
            // The probe tests the builtins themselves.
            soft_math: WgslOptions::HARDWARE,
            artifacts: TextStore::jit_only("wgpu"),
        };
        dev.conformance = probe::run(&dev)?;
        dev.soft_math = dev.conformance.soft_math().union(force).union(from_env);
        // Drop what the probe compiled with the builtins.
        dev.cache
            .lock()
            .map_err(|_| dev.err("cache lock poisoned".into()))?
            .clear();
        Ok(dev)
    }

    /// The device, launching the WGSL artifacts of `text` (the `TEXT` slice of
    /// [`crate::include_kernels!`]) under `policy` instead of compiling: a kernel runs the
    /// artifact of its name and `Kernel::content_hash` whose settings are this device's
    /// [`WgpuDevice::soft_math`] (`soft_fma`, `soft_div`, `soft_sqrt`), whose code hash and
    /// manifest version check, and whose manifest launches it as the compiler would (entry
    /// point, workgroup size). Other targets' artifacts are ignored. Kernels compiled before
    /// are dropped from the cache.
    ///
    /// With [`Policy::PreferAot`] a kernel without such an artifact is compiled, said once per
    /// kernel on standard error with the reason; with [`Policy::RequireAot`] its launch (and
    /// [`Device::compile`]) fails with [`Error::Device`] naming the kernel and what was wrong
    /// (missing, stale, wrong settings, corrupted); [`Policy::JitOnly`] ignores `text`.
    pub fn with_artifacts(
        mut self,
        text: &'static [&'static TextArtifact],
        policy: Policy,
    ) -> Self {
        self.artifacts = TextStore::new(self.name.clone(), text, policy);
        self.cache
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self
    }

    /// What the conformance probe found when the device started: the contract rules WGSL does
    /// not promise, checked on this driver. Where the driver's `fma`, f32 division or `sqrt`
    /// is not exact, kernels use the backend's exact software routine instead
    /// ([`WgpuDevice::soft_math`]).
    pub fn conformance(&self) -> &Conformance {
        &self.conformance
    }

    /// The software routines every kernel on this device is lowered with: those the probe
    /// required, plus those forced by [`WgpuDevice::with_soft_math`] or `QFORGE_WGSL_SOFT_MATH`.
    pub fn soft_math(&self) -> WgslOptions {
        self.soft_math
    }

    /// Compiles (if needed) and runs `kernel`.
    fn launch_compiled(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        let binding = qforge_ir::bind(kernel, args)?;
        let compiled = self.compiled(kernel)?;
        let _guard = self
            .launch_lock
            .lock()
            .map_err(|_| self.err("launch lock poisoned".into()))?;
        launch::launch(self, &compiled, &binding, args)
    }

    /// The device's limits (as granted: the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    fn err(&self, message: String) -> Error {
        device_error(&self.name, message)
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns the
    /// first error caught (or one the uncaptured handler saw meanwhile) into [`Error::Device`].
    fn scoped<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let scopes = [
            self.device.push_error_scope(wgpu::ErrorFilter::Internal),
            self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            self.device.push_error_scope(wgpu::ErrorFilter::Validation),
        ];
        let out = f();
        let mut first = None;
        for scope in scopes.into_iter().rev() {
            if let Some(e) = pollster::block_on(scope.pop()) {
                first.get_or_insert(e.to_string());
            }
        }
        if first.is_none() {
            if let Ok(mut v) = self.uncaptured.lock() {
                first = v.drain(..).next();
            }
        }
        match first {
            Some(e) => Err(self.err(format!("{what}: {e}"))),
            None => out,
        }
    }

    /// The compiled form of `kernel`, from the cache or freshly built.
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
        let target = Target::Wgsl(self.soft_math);
        // The binding layout follows the parameters, which no pass changes.
        let layout = WgslLayout::new(kernel);
        let launch_check = |m: &Manifest| wgsl_entry(m, &layout);
        let (wgsl, entry_point) = match self.artifacts.select(kernel, &target, launch_check)? {
            Some((embedded, entry_point)) => (embedded.code.to_string(), entry_point),
            None => {
                let artifact = qforge_codegen::compile(kernel, &target, &Options::default())?;
                let entry_point = wgsl_entry(&artifact.manifest, &layout).map_err(|why| {
                    self.err(format!("'{}': the wgsl artifact {why}", kernel.name))
                })?;
                let wgsl = artifact.code.text().ok_or_else(|| {
                    self.err(format!("'{}': the wgsl artifact has no text", kernel.name))
                })?;
                (wgsl.to_string(), entry_point)
            }
        };
        // No lock: error scopes are per thread in wgpu (its `std` feature), so concurrent
        // compiles (each in its own scopes) run in parallel on drivers that allow it.
        let compiled = self.scoped(&format!("compiling '{}'", kernel.name), || {
            let module = self
                .device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(&kernel.name),
                    source: wgpu::ShaderSource::Wgsl(wgsl.as_str().into()),
                });
            let mut entries: Vec<wgpu::BindGroupLayoutEntry> = layout
                .buffers
                .iter()
                .map(|b| wgpu::BindGroupLayoutEntry {
                    binding: b.binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: b.read_only,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: layout.params_binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
            let bind_group_layout =
                self.device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some(&kernel.name),
                        entries: &entries,
                    });
            let pipeline_layout =
                self.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(&kernel.name),
                        bind_group_layouts: &[Some(&bind_group_layout)],
                        immediate_size: 0,
                    });
            let pipeline = self
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&kernel.name),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(&entry_point),
                    compilation_options: Default::default(),
                    cache: None,
                });
            Ok(Compiled {
                kernel: kernel.clone(),
                layout,
                bind_group_layout,
                pipeline,
            })
        })?;
        let compiled = Arc::new(compiled);
        let mut cache = self
            .cache
            .lock()
            .map_err(|_| self.err("cache lock poisoned".into()))?;
        cache.insert(hash, Arc::clone(&compiled));
        Ok(compiled)
    }
}

/// The entry point of a WGSL artifact's manifest, when it launches as this device does: the
/// entry point of `layout`, in workgroups of [`WORKGROUP_SIZE`]; else what it launches as.
fn wgsl_entry(manifest: &Manifest, layout: &WgslLayout) -> std::result::Result<String, String> {
    match &manifest.launch {
        Launch::Wgsl {
            entry_point,
            workgroup_size,
        } if *workgroup_size == WORKGROUP_SIZE && entry_point == layout.entry_point => {
            Ok(entry_point.clone())
        }
        other => Err(format!(
            "launches as {other:?}, expected entry point '{}' in workgroups of {WORKGROUP_SIZE}",
            layout.entry_point
        )),
    }
}

/// The software routines `QFORGE_WGSL_SOFT_MATH` asks for (none when it is unset).
fn soft_math_from_env() -> Result<WgslOptions> {
    const VAR: &str = "QFORGE_WGSL_SOFT_MATH";
    match std::env::var(VAR) {
        Ok(v) => parse_soft_math(&v).ok_or_else(|| {
            device_error(
                "wgpu",
                format!("{VAR}={v:?}: expected 1, all, 0, or a comma list of fma, div, sqrt"),
            )
        }),
        Err(std::env::VarError::NotPresent) => Ok(WgslOptions::HARDWARE),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(device_error("wgpu", format!("{VAR} is not valid unicode")))
        }
    }
}

/// `1`/`all` -> all routines, `0`/empty -> none, else a comma list of `fma`, `div`, `sqrt`.
fn parse_soft_math(v: &str) -> Option<WgslOptions> {
    match v.trim() {
        "1" | "all" => return Some(WgslOptions::SOFTWARE),
        "0" | "" => return Some(WgslOptions::HARDWARE),
        _ => {}
    }
    let mut o = WgslOptions::HARDWARE;
    for item in v.split(',') {
        match item.trim() {
            "fma" => o.soft_fma = true,
            "div" => o.soft_div = true,
            "sqrt" => o.soft_sqrt = true,
            _ => return None,
        }
    }
    Some(o)
}

fn device_error(device: &str, message: String) -> Error {
    Error::Device {
        device: device.to_string(),
        message,
    }
}

impl Device for WgpuDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn backend(&self) -> &'static str {
        qforge_codegen::wgsl::BACKEND
    }
    fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.compiled(kernel).map(|_| ())
    }
    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        self.launch_compiled(kernel, args)
    }
    fn caps(&self) -> Caps {
        Caps {
            kind: DeviceKind::Gpu,
            vector_lanes: 1,
            parallel_threads: Caps::GPU_THREADS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_math_values_parse() {
        assert_eq!(parse_soft_math("1"), Some(WgslOptions::SOFTWARE));
        assert_eq!(parse_soft_math(" all "), Some(WgslOptions::SOFTWARE));
        assert_eq!(parse_soft_math("0"), Some(WgslOptions::HARDWARE));
        assert_eq!(parse_soft_math(""), Some(WgslOptions::HARDWARE));
        let d = parse_soft_math("div, sqrt").unwrap();
        assert!(d.soft_div && d.soft_sqrt && !d.soft_fma);
        assert_eq!(parse_soft_math("fast"), None);
        assert_eq!(parse_soft_math("fma,"), None);
    }
}
