//! The XLA SPMD engine (feature `stablehlo`): one kernel launch per rank, run as one sharded
//! StableHLO program that XLA's CPU compiler partitions over `D` host devices
//! (`--xla_force_host_platform_device_count`), the communication written into the program
//! ([`qforge_codegen::stablehlo::spmd`]).
//!
//! The ranks' launches are taken from the host code that would run them one rank at a time:
//! that code runs on a [`Capture`] device, which records each launch (kernel and argument
//! bytes) instead of running it. [`XlaSpmd::run`] checks that the ranks' launches are one
//! program (the same kernel and shapes and scalars), passes each buffer that every rank gives
//! the same bytes as a replicated argument and the others split, and returns the combined
//! results.
//!
//! The program is compiled and run by `scripts/xla_spmd_runner.py` with the Python of the
//! `stablehlo` device (`QFORGE_STABLEHLO_PYTHON`, or `target/stablehlo-venv/bin/python`), one
//! process per run (no time limit: a program that hangs in XLA hangs the caller). XLA is not a
//! conformant executor: it flushes subnormal results to zero, and it contracts a multiply and
//! an add into an FMA where the CPU has one, so the runner caps its instruction set at AVX (no
//! FMA; an x86 flag, other CPUs would contract). Results are bit-identical to the unsharded
//! kernel's for inputs whose computation meets no subnormal (`docs/distributed.md`).

use std::process::Command;
use std::sync::Mutex;

pub use qforge_codegen::stablehlo::spmd::Combine;
use qforge_codegen::stablehlo::spmd::{self, Place, Plan};
use qforge_codegen::stablehlo::Shapes;
use qforge_ir::{Access, Arg, Kernel, ParamKind, Scalar};

use crate::device::{Caps, Device};
use crate::error::{Error, Result};

const NAME: &str = "xla-spmd";
const RUNNER: &str = include_str!("../../scripts/xla_spmd_runner.py");

/// One argument of a recorded launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedArg {
    /// A buffer's bytes when the launch was made (for a `Write` buffer, its initial contents).
    Buffer(Vec<u8>),
    /// A scalar.
    Scalar(Scalar),
}

/// One rank's launch, as a [`Capture`] device recorded it.
#[derive(Clone, Debug)]
pub struct RankLaunch {
    /// The kernel.
    pub kernel: Kernel,
    /// Its arguments, in parameter order.
    pub args: Vec<RecordedArg>,
}

/// A device that records launches instead of running them: the writable buffers are left as
/// they are. Its capabilities are a GPU's, so host ops launch their kernels for the
/// activation dtype as it is (no host-side widening).
#[derive(Debug, Default)]
pub struct Capture {
    launches: Mutex<Vec<RankLaunch>>,
}

impl Capture {
    /// A device that has recorded nothing.
    pub fn new() -> Capture {
        Capture::default()
    }

    /// The launches recorded so far, in order, leaving none.
    pub fn take(&self) -> Vec<RankLaunch> {
        self.launches
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }
}

impl Device for Capture {
    fn name(&self) -> &str {
        "capture"
    }

    fn backend(&self) -> &'static str {
        "capture"
    }

    fn caps(&self) -> Caps {
        Caps::GPU
    }

    fn compile(&self, kernel: &Kernel) -> Result<()> {
        Ok(qforge_ir::verify(kernel)?)
    }

    fn launch(&self, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<()> {
        qforge_ir::verify(kernel)?;
        qforge_ir::bind(kernel, args)?;
        let args = args
            .iter()
            .map(|a| match a {
                Arg::Read(b) => RecordedArg::Buffer(b.to_vec()),
                Arg::Write(b) => RecordedArg::Buffer(b.to_vec()),
                Arg::Scalar(s) => RecordedArg::Scalar(*s),
            })
            .collect();
        self.launches
            .lock()
            .map_err(|_| engine_error("the capture lock is poisoned".into()))?
            .push(RankLaunch {
                kernel: kernel.clone(),
                args,
            });
        Ok(())
    }
}

/// The engine: `ranks` XLA CPU devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XlaSpmd {
    ranks: usize,
}

fn engine_error(message: String) -> Error {
    Error::Device {
        device: NAME.into(),
        message,
    }
}

impl XlaSpmd {
    /// The engine on `ranks` devices.
    ///
    /// # Errors
    /// [`Error::Invalid`] for zero ranks.
    pub fn new(ranks: usize) -> Result<XlaSpmd> {
        if ranks == 0 {
            return Err(Error::Invalid(format!(
                "{NAME}: at least one rank is needed"
            )));
        }
        Ok(XlaSpmd { ranks })
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Runs `launches` (one per rank, in rank order) as one sharded program and returns one
    /// global result per writable buffer of the kernel, combined as `combine` says (raw bytes,
    /// see [`spmd::module`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] when there is not one launch per rank, or the launches are not one
    /// program: another kernel, other shapes, or a scalar that differs, each named;
    /// code generation errors ([`spmd::module`]); [`Error::Device`] when the runner's Python
    /// is missing or XLA rejects or fails the program, with its message.
    pub fn run(&self, launches: &[RankLaunch], combine: &[Combine]) -> Result<Vec<Vec<u8>>> {
        let d = self.ranks;
        if launches.len() != d {
            return Err(Error::Invalid(format!(
                "{NAME}: {} launches for {d} ranks (one per rank)",
                launches.len()
            )));
        }
        let first = &launches[0];
        let kernel = &first.kernel;
        let shapes = shapes_of(first)?;
        for (r, l) in launches.iter().enumerate().skip(1) {
            if l.kernel != *kernel {
                return Err(Error::Invalid(format!(
                    "{NAME}: rank {r} launches `{}`, rank 0 `{}`: the ranks must run one program",
                    l.kernel.name, kernel.name
                )));
            }
            let s = shapes_of(l)?;
            if s != shapes {
                return Err(Error::Invalid(format!(
                    "{NAME}: `{}` on rank {r} has grid {} and element counts {:?}, on rank 0 \
                     grid {} and {:?}: SPMD needs equal shapes on every rank",
                    kernel.name, s.grid, s.elements, shapes.grid, shapes.elements
                )));
            }
        }
        // Where each argument goes: replicated when every rank passes the same bytes.
        let mut places = Vec::new();
        let mut request_args = Vec::new();
        let dir = crate::stablehlo::fresh_folder("qforge-xla-spmd").map_err(engine_error)?;
        let result = (|| {
            let io = |e: std::io::Error| engine_error(format!("{}: {e}", dir.display()));
            for (i, (_, p)) in kernel.params.iter().enumerate() {
                let per_rank: Vec<&RecordedArg> = launches.iter().map(|l| &l.args[i]).collect();
                let same = per_rank.iter().all(|a| *a == per_rank[0]);
                match (per_rank[0], &p.kind) {
                    (RecordedArg::Scalar(s), _) => {
                        if !same {
                            return Err(Error::Invalid(format!(
                                "{NAME}: the scalar `{}` of `{}` differs between ranks: SPMD \
                                 needs one program",
                                p.name, kernel.name
                            )));
                        }
                        places.push(Place::Replicated);
                        request_args.push(serde_json::json!({ "value": s.bits() }));
                    }
                    (RecordedArg::Buffer(b), ParamKind::Buffer { dtype, .. }) => {
                        let file = format!("in{i}.bin");
                        let bytes: Vec<u8> = if same {
                            b.clone()
                        } else {
                            per_rank
                                .iter()
                                .flat_map(|a| match a {
                                    RecordedArg::Buffer(b) => b.as_slice(),
                                    RecordedArg::Scalar(_) => &[],
                                })
                                .copied()
                                .collect()
                        };
                        std::fs::write(dir.join(&file), bytes).map_err(io)?;
                        places.push(if same {
                            Place::Replicated
                        } else {
                            Place::Split
                        });
                        let numpy = match dtype.size_bytes() {
                            1 => "uint8",
                            2 => "uint16",
                            _ => "uint32",
                        };
                        request_args.push(
                            serde_json::json!({ "file": file, "dtype": numpy, "split": !same }),
                        );
                    }
                    (RecordedArg::Buffer(_), ParamKind::Scalar(_)) => {
                        return Err(engine_error(format!(
                            "`{}`: a buffer recorded for the scalar `{}`",
                            kernel.name, p.name
                        )))
                    }
                }
            }
            let plan = Plan {
                ranks: d,
                args: places,
                results: combine.to_vec(),
            };
            let module = spmd::module(kernel, &shapes, &plan)?;
            std::fs::write(dir.join("module.mlir"), &module).map_err(io)?;
            let results: Vec<&str> = combine
                .iter()
                .map(|c| match c {
                    Combine::Local => "split",
                    _ => "replicated",
                })
                .collect();
            let request =
                serde_json::json!({ "ranks": d, "args": request_args, "results": results });
            std::fs::write(dir.join("request.json"), request.to_string()).map_err(io)?;
            run_runner(&kernel.name, &dir)?;
            (0..combine.len())
                .map(|k| std::fs::read(dir.join(format!("out{k}.bin"))).map_err(io))
                .collect()
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result
    }
}

/// The grid and element counts of a recorded launch ([`qforge_ir::bind`]).
fn shapes_of(l: &RankLaunch) -> Result<Shapes> {
    if l.args.len() != l.kernel.params.len() {
        return Err(Error::Invalid(format!(
            "{NAME}: `{}` takes {} arguments, the launch has {}",
            l.kernel.name,
            l.kernel.params.len(),
            l.args.len()
        )));
    }
    let mut bytes: Vec<Vec<u8>> = l
        .args
        .iter()
        .map(|a| match a {
            RecordedArg::Buffer(b) => b.clone(),
            RecordedArg::Scalar(_) => Vec::new(),
        })
        .collect();
    let args: Vec<Arg<'_>> = l
        .args
        .iter()
        .zip(bytes.iter_mut())
        .zip(l.kernel.params.iter())
        .map(|((a, b), (_, p))| match (a, &p.kind) {
            (RecordedArg::Scalar(s), _) => Arg::Scalar(*s),
            (_, ParamKind::Buffer { access, .. }) if *access == Access::Read => Arg::Read(b),
            _ => Arg::Write(b),
        })
        .collect();
    let b = qforge_ir::bind(&l.kernel, &args)?;
    Ok(Shapes {
        grid: b.grid,
        elements: b.elements,
    })
}

/// Runs the runner on `dir` and reads its verdict (the last line of its stdout).
fn run_runner(kernel: &str, dir: &std::path::Path) -> Result<()> {
    let py = crate::stablehlo::python();
    if !py.exists() {
        return Err(engine_error(format!(
            "no Python at {} (run scripts/install-stablehlo.sh, or set QFORGE_STABLEHLO_PYTHON)",
            py.display()
        )));
    }
    let out = Command::new(&py)
        .arg("-c")
        .arg(RUNNER)
        .arg(dir)
        .output()
        .map_err(|e| engine_error(format!("cannot start {}: {e}", py.display())))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().map(str::trim);
    match last {
        Some("ok") => Ok(()),
        Some(line) if line.starts_with("error:") => Err(engine_error(format!(
            "{kernel}: {}",
            line.trim_start_matches("error:").trim()
        ))),
        _ => {
            // A crash in XLA: its check message, else the last lines of stderr.
            let stderr = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = stderr.lines().collect();
            let told: Vec<&str> = match lines.iter().position(|l| l.contains("Check failed")) {
                Some(at) => lines[at..].iter().take(3).copied().collect(),
                None => lines[lines.len().saturating_sub(6)..].to_vec(),
            };
            Err(engine_error(format!(
                "{kernel}: the runner stopped ({}): {}",
                out.status,
                told.join(" | ")
            )))
        }
    }
}
