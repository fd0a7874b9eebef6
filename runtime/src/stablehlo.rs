//! The `stablehlo` device: runs the StableHLO backend's modules with the StableHLO reference
//! interpreter (`stablehlo.eval_module` of jaxlib's MLIR bindings) in Python processes that every
//! device of the process shares: a pool of runners, one per core by default
//! (`QFORGE_STABLEHLO_RUNNERS` sets the number), so launches from several threads run at once.
//!
//! Each launch binds the arguments, compiles the kernel for exactly those shapes
//! (`qforge_codegen::compile` for `Target::StableHloShapes`: StableHLO shapes are static, and a
//! kernel's dimension parameters may differ from each other), writes the module and the raw
//! argument bytes to a fresh temporary folder, asks the runner (`scripts/stablehlo_runner.py`)
//! to evaluate it, and copies the results into the writable arguments. The reference
//! interpreter computes with IEEE semantics and keeps subnormals, so this device is bit-exact;
//! it is slow (an interpreter), meant for conformance, not speed.
//!
//! The Python interpreter is `QFORGE_STABLEHLO_PYTHON` when set, else
//! `target/stablehlo-venv/bin/python` of this workspace, which `scripts/install-stablehlo.sh`
//! creates (jax and jaxlib from PyPI).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use qforge_codegen::compile::{Launch, Options, Target};
use qforge_codegen::stablehlo::{Shapes, BACKEND};
use qforge_ir::{Arg, Kernel, ParamKind};

use crate::device::{Caps, Device, DeviceKind};
use crate::error::{Error, Result};
use crate::python_runner::Runner;

const NAME: &str = "stablehlo";
const RUNNER: &str = include_str!("../../scripts/stablehlo_runner.py");

/// The device (see the module docs). Every device of a process shares the pool of runners.
pub struct StableHloDevice {
    _shared: (),
}

/// The runners of this process, one per slot. A launch takes the first free slot (or waits for
/// one) and starts its runner when it has none or it has stopped; [`StableHloDevice::new`]
/// starts the first one, so a missing Python is reported at once.
static RUNNERS: OnceLock<Vec<Mutex<Option<Runner>>>> = OnceLock::new();

/// Numbers the launches, to spread waiting threads over the slots.
static NEXT_LAUNCH: AtomicU64 = AtomicU64::new(0);

/// The pool's slots: `QFORGE_STABLEHLO_RUNNERS`, else the number of cores, at most 16.
fn slots() -> &'static [Mutex<Option<Runner>>] {
    RUNNERS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = std::env::var("QFORGE_STABLEHLO_RUNNERS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(cores)
            .clamp(1, 16);
        (0..n).map(|_| Mutex::new(None)).collect()
    })
}

/// Locks `slot` (waiting for it).
fn lock(slot: &'static Mutex<Option<Runner>>) -> Result<MutexGuard<'static, Option<Runner>>> {
    slot.lock()
        .map_err(|_| device_error("a runner lock is poisoned".into()))
}

/// Puts a live runner in a locked slot: starts one when it has none or its runner stopped.
fn make_live(runner: &mut Option<Runner>) -> Result<()> {
    if !runner.as_mut().is_some_and(Runner::alive) {
        let py = python();
        if !py.exists() {
            return Err(device_error(format!(
                "no Python at {} (run scripts/install-stablehlo.sh, or set QFORGE_STABLEHLO_PYTHON)",
                py.display()
            )));
        }
        *runner = Some(Runner::start(&py, RUNNER, &[]).map_err(device_error)?);
    }
    Ok(())
}

/// Numbers the launch folders of every device in this process.
static NEXT_FOLDER: AtomicU64 = AtomicU64::new(0);

/// A new, empty folder `<prefix>-<pid>-<n>` in the temporary folder, for one run's files: a
/// name that exists already (another process's, or a stale one) is skipped, never reused.
pub(crate) fn fresh_folder(prefix: &str) -> std::result::Result<PathBuf, String> {
    loop {
        let n = NEXT_FOLDER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
}

fn device_error(message: String) -> Error {
    Error::Device {
        device: NAME.into(),
        message,
    }
}

/// The Python that runs the runner: `QFORGE_STABLEHLO_PYTHON`, or the workspace's venv.
pub(crate) fn python() -> PathBuf {
    match std::env::var_os("QFORGE_STABLEHLO_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/stablehlo-venv/bin/python"),
    }
}

impl StableHloDevice {
    /// A device on the process's pool of runners; starts the first runner (again) when it is
    /// not running, the others start at the first launches that need them.
    ///
    /// # Errors
    /// [`Error::Device`] when the Python interpreter is missing or cannot import jax's MLIR
    /// bindings (run `scripts/install-stablehlo.sh`), with its message.
    pub fn new() -> Result<StableHloDevice> {
        make_live(&mut *lock(&slots()[0])?)?;
        Ok(StableHloDevice { _shared: () })
    }

    fn folder(&self) -> Result<PathBuf> {
        fresh_folder("qforge-stablehlo").map_err(device_error)
    }

    fn request(&self, name: &str, dir: &Path, args: Vec<serde_json::Value>) -> Result<()> {
        let req = serde_json::json!({ "dir": dir.to_string_lossy(), "args": args }).to_string();
        // The first free slot, else wait for one (spread over the slots by launch number).
        let slots = slots();
        let mut slot = match slots.iter().find_map(|s| s.try_lock().ok()) {
            Some(free) => free,
            None => {
                lock(&slots[NEXT_LAUNCH.fetch_add(1, Ordering::Relaxed) as usize % slots.len()])?
            }
        };
        make_live(&mut slot)?;
        let Some(runner) = slot.as_mut() else {
            return Err(device_error("the runner is not running".into()));
        };
        let answer = runner.ask(&req, 3);
        match answer {
            Ok(a) if a == "ok" => Ok(()),
            Ok(other) => Err(device_error(format!("{name}: {other}"))),
            Err(e) => {
                *slot = None;
                Err(device_error(format!(
                    "{name}: {e} (the next launch starts it again)"
                )))
            }
        }
    }
}

impl StableHloDevice {
    /// Evaluates the StableHLO module `text` (its `main` taking no arguments) with the
    /// reference interpreter and returns its results' raw bytes; `name` names it in errors.
    /// The runner refuses modules with collectives (`all_gather`, `all_reduce`, ...,
    /// `sdy.manual_computation`): the interpreter cannot run them (it would abort the runner);
    /// sharded programs run on the XLA SPMD engine ([`crate::xla_spmd`]).
    ///
    /// # Errors
    /// [`Error::Device`] with the runner's message (a module that does not parse or verify,
    /// collectives, an evaluation error).
    pub fn run_module(&self, name: &str, text: &str) -> Result<Vec<Vec<u8>>> {
        let dir = self.folder()?;
        let result = (|| {
            let io = |e: std::io::Error| device_error(format!("{}: {e}", dir.display()));
            std::fs::write(dir.join("module.mlir"), text).map_err(io)?;
            self.request(name, &dir, Vec::new())?;
            let mut outs = Vec::new();
            while let Ok(b) = std::fs::read(dir.join(format!("out{}.bin", outs.len()))) {
                outs.push(b);
            }
            Ok(outs)
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

impl Device for StableHloDevice {
    fn name(&self) -> &str {
        NAME
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn caps(&self) -> Caps {
        Caps {
            kind: DeviceKind::Xla,
            ..Caps::SEQUENTIAL
        }
    }

    fn compile(&self, kernel: &Kernel) -> Result<()> {
        Ok(qforge_ir::verify(kernel)?)
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        let Some(shapes) = launch_shapes(kernel, args)? else {
            return Ok(());
        };
        let artifact = qforge_codegen::compile(
            kernel,
            &Target::StableHloShapes(shapes.clone()),
            &Options::default(),
        )?;
        match &artifact.manifest.launch {
            Launch::StableHloShapes { grid, elements }
                if *grid == shapes.grid && *elements == shapes.elements => {}
            other => {
                return Err(device_error(format!(
                    "{}: the stablehlo artifact launches as {other:?}, expected grid {} and \
                     elements {:?}",
                    kernel.name, shapes.grid, shapes.elements
                )))
            }
        }
        let module = artifact.code.text().ok_or_else(|| {
            device_error(format!(
                "{}: the stablehlo artifact has no text",
                kernel.name
            ))
        })?;
        self.run_launch(kernel, module, args)
    }
}

impl StableHloDevice {
    /// Runs `module` (a StableHLO module with the StableHLO backend's signature: each
    /// parameter of `kernel` as raw bits, results the final contents of the writable
    /// buffers in parameter order) on the launch arguments `args` of `kernel`, and copies the
    /// results into the writable arguments. The Mosaic twin device runs its twins with it.
    ///
    /// # Errors
    /// [`Error::Device`] with the runner's message, or when a result's size differs from
    /// its argument's.
    pub fn run_launch(&self, kernel: &Kernel, module: &str, args: &mut [Arg<'_>]) -> Result<()> {
        let dir = self.folder()?;
        let result = (|| {
            let io = |e: std::io::Error| device_error(format!("{}: {e}", dir.display()));
            std::fs::write(dir.join("module.mlir"), module).map_err(io)?;
            let mut list = Vec::new();
            for (i, ((_, p), arg)) in kernel.params.iter().zip(args.iter()).enumerate() {
                match (&p.kind, arg) {
                    (ParamKind::Buffer { dtype, .. }, Arg::Read(b)) => {
                        std::fs::write(dir.join(format!("in{i}.bin")), b).map_err(io)?;
                        list.push(buffer_arg(i, dtype.size_bytes()));
                    }
                    (ParamKind::Buffer { dtype, .. }, Arg::Write(b)) => {
                        std::fs::write(dir.join(format!("in{i}.bin")), &**b).map_err(io)?;
                        list.push(buffer_arg(i, dtype.size_bytes()));
                    }
                    (_, Arg::Scalar(s)) => list.push(serde_json::json!({ "value": s.bits() })),
                    _ => return Err(device_error(format!("{}: argument {i}", kernel.name))),
                }
            }
            self.request(&kernel.name, &dir, list)?;
            let mut k = 0;
            for arg in args.iter_mut() {
                if let Arg::Write(b) = arg {
                    let out = std::fs::read(dir.join(format!("out{k}.bin"))).map_err(io)?;
                    if out.len() != b.len() {
                        return Err(device_error(format!(
                            "{}: result {k} has {} bytes, expected {}",
                            kernel.name,
                            out.len(),
                            b.len()
                        )));
                    }
                    b.copy_from_slice(&out);
                    k += 1;
                }
            }
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

/// The shapes a module for this launch is specialized to, after verifying `kernel` and binding
/// `args`; `None` for an empty grid (nothing to run).
///
/// # Errors
/// A kernel that does not verify, or arguments that do not bind.
pub(crate) fn launch_shapes(kernel: &Kernel, args: &[Arg<'_>]) -> Result<Option<Shapes>> {
    qforge_ir::verify(kernel)?;
    let binding = qforge_ir::bind(kernel, args)?;
    Ok((binding.grid != 0).then(|| Shapes {
        grid: binding.grid,
        elements: binding.elements.clone(),
    }))
}

/// A buffer argument of the runner's request: its file and numpy dtype (raw bits).
fn buffer_arg(i: usize, size: usize) -> serde_json::Value {
    let dtype = match size {
        1 => "uint8",
        2 => "uint16",
        _ => "uint32",
    };
    serde_json::json!({ "file": format!("in{i}.bin"), "dtype": dtype })
}
