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
//! `stablehlo` device (`QFORGE_STABLEHLO_PYTHON`, or `target/stablehlo-venv/bin/python`), in
//! processes kept for the next run, one per rank count and concurrent run (no time limit: a
//! program that hangs in XLA hangs the caller). XLA is not a
//! conformant executor: it flushes subnormal results to zero, and it contracts a multiply and
//! an add into an FMA where the CPU has one, so the runner caps its instruction set at AVX (no
//! FMA; an x86 flag, other CPUs would contract). Results are bit-identical to the unsharded
//! kernel's for inputs whose computation meets no subnormal (`docs/distributed.md`).

use std::sync::Mutex;

pub use qforge_codegen::stablehlo::spmd::Combine;
use qforge_codegen::stablehlo::spmd::{self, Place, Plan};
use qforge_codegen::stablehlo::Shapes;
use qforge_ir::{Access, Arg, DType, Kernel, ParamKind, Scalar};

use crate::device::{Caps, Device};
use crate::error::{Error, Result};
use crate::python_runner::Runner;
use crate::tensor::HostTensor;

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

impl RankLaunch {
    /// Runs the launch on `dev` and returns its writable buffers' bytes afterwards, in
    /// parameter order (what one rank of the engine computes, on another device).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the arguments do not fit the kernel; `dev`'s errors.
    pub fn run_on(&self, dev: &dyn Device) -> Result<Vec<Vec<u8>>> {
        let mut bytes = buffer_bytes(&self.args);
        let mut args = launch_args(&self.kernel, &self.args, &mut bytes)?;
        dev.launch(&self.kernel, &mut args)?;
        drop(args);
        Ok(writable(&self.kernel)
            .map(|i| std::mem::take(&mut bytes[i]))
            .collect())
    }
}

/// The indices of `kernel`'s `Write` and `ReadWrite` buffers, in parameter order.
pub fn writable(kernel: &Kernel) -> impl Iterator<Item = usize> + '_ {
    kernel
        .params
        .iter()
        .enumerate()
        .filter_map(|(i, (_, p))| match &p.kind {
            ParamKind::Buffer { access, .. } if *access != Access::Read => Some(i),
            _ => None,
        })
}

/// A copy of each recorded buffer's bytes (empty for scalars).
fn buffer_bytes(recorded: &[RecordedArg]) -> Vec<Vec<u8>> {
    recorded
        .iter()
        .map(|a| match a {
            RecordedArg::Buffer(b) => b.clone(),
            RecordedArg::Scalar(_) => Vec::new(),
        })
        .collect()
}

/// The arguments of a recorded launch over `bytes` (one per parameter; empty for scalars).
fn launch_args<'a>(
    kernel: &Kernel,
    recorded: &[RecordedArg],
    bytes: &'a mut [Vec<u8>],
) -> Result<Vec<Arg<'a>>> {
    if recorded.len() != kernel.params.len() {
        return Err(Error::Invalid(format!(
            "{NAME}: `{}` takes {} arguments, the launch has {}",
            kernel.name,
            kernel.params.len(),
            recorded.len()
        )));
    }
    Ok(recorded
        .iter()
        .zip(bytes.iter_mut())
        .zip(kernel.params.iter())
        .map(|((a, b), (_, p))| match (a, &p.kind) {
            (RecordedArg::Scalar(s), _) => Arg::Scalar(*s),
            (_, ParamKind::Buffer { access, .. }) if *access == Access::Read => Arg::Read(b),
            _ => Arg::Write(b),
        })
        .collect())
}

/// A device that gives each launch the results an engine computed for it, in order: launch
/// `l` must be the kernel recorded at `l` with the bytes it was recorded with in every buffer
/// (a launch that reads what an earlier launch wrote, which a [`Capture`] never computed,
/// differs there: an error), and its writable buffers are set to `results[l]`. Capabilities
/// as [`Capture`], so host code takes the path it took when recorded.
#[derive(Debug)]
pub struct Replay {
    rank: usize,
    expected: Mutex<std::collections::VecDeque<(RankLaunch, Vec<Vec<u8>>)>>,
}

impl Replay {
    /// Rank `rank`'s recorded `launches`, each with its writable buffers' results (in
    /// parameter order).
    pub fn new(rank: usize, launches: Vec<RankLaunch>, results: Vec<Vec<Vec<u8>>>) -> Replay {
        Replay {
            rank,
            expected: Mutex::new(launches.into_iter().zip(results).collect()),
        }
    }

    /// Checks that every recorded launch was replayed.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the launches left.
    pub fn finish(&self) -> Result<()> {
        let left = self.expected.lock().map_or(0, |q| q.len());
        if left > 0 {
            return Err(Error::Invalid(format!(
                "{NAME}: rank {}: {left} recorded launches were not made again (the host code \
                 must launch the same kernels when replayed)",
                self.rank
            )));
        }
        Ok(())
    }
}

impl Device for Replay {
    fn name(&self) -> &str {
        "replay"
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
        let rank = self.rank;
        let (recorded, results) = self
            .expected
            .lock()
            .map_err(|_| engine_error("the replay lock is poisoned".into()))?
            .pop_front()
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{NAME}: rank {rank} launches `{}` after its recorded launches",
                    kernel.name
                ))
            })?;
        if recorded.kernel != *kernel {
            return Err(Error::Invalid(format!(
                "{NAME}: rank {rank} launches `{}` where `{}` was recorded",
                kernel.name, recorded.kernel.name
            )));
        }
        let same = recorded.args.len() == args.len()
            && recorded
                .args
                .iter()
                .zip(args.iter())
                .all(|(r, a)| match (r, a) {
                    (RecordedArg::Buffer(r), Arg::Read(b)) => r.as_slice() == &**b,
                    (RecordedArg::Buffer(r), Arg::Write(b)) => r.as_slice() == &**b,
                    (RecordedArg::Scalar(r), Arg::Scalar(s)) => r == s,
                    _ => false,
                });
        if !same {
            return Err(Error::Invalid(format!(
                "{NAME}: rank {rank}'s `{}` gets other arguments than when it was recorded: it \
                 reads what an earlier launch wrote, and a recording runs no launch (run such \
                 host code step by step)",
                kernel.name
            )));
        }
        let mut results = results.into_iter();
        for i in writable(kernel).collect::<Vec<_>>() {
            if let (Arg::Write(b), Some(r)) = (&mut args[i], results.next()) {
                if r.len() != b.len() {
                    return Err(engine_error(format!(
                        "rank {rank}'s `{}`: {} result bytes for a buffer of {}",
                        kernel.name,
                        r.len(),
                        b.len()
                    )));
                }
                b.copy_from_slice(&r);
            }
        }
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

    /// The ranks' `f32` tensors (`parts[r]` from rank `r`, all of one shape) summed
    /// elementwise in rank order, `((p_0 + p_1) + p_2) + ...` in `f32` with round to nearest
    /// even, by one sharded program (an all-gather, then the additions on every device): the
    /// fixed-order all-reduce of a data-parallel gradient (`docs/distributed.md`). Sums that
    /// meet a subnormal are flushed to zero there (XLA's CPU code).
    ///
    /// # Errors
    /// [`Error::Invalid`] when there is not one part per rank, a part is not `f32`, or the
    /// parts' shapes differ; the engine's errors.
    pub fn sum_f32_in_rank_order(&self, parts: &[HostTensor]) -> Result<HostTensor> {
        const KERNEL: &str = "kernel rank_part(x: f32[n] read, y: f32[n] write, n: u32)
grid n
{
  %0: u32 = work_item
  %1: f32 = load x[%0]
  store y[%0] = %1
}";
        let what = "the rank-order sum";
        if parts.len() != self.ranks {
            return Err(Error::Invalid(format!(
                "{NAME}: {what}: {} parts for {} ranks (one per rank)",
                parts.len(),
                self.ranks
            )));
        }
        for (r, p) in parts.iter().enumerate() {
            if p.dtype != DType::F32 || p.shape != parts[0].shape {
                return Err(Error::Invalid(format!(
                    "{NAME}: {what}: rank {r}'s part is {} {:?}, rank 0's {} {:?} (f32 parts \
                     of one shape)",
                    p.dtype, p.shape, parts[0].dtype, parts[0].shape
                )));
            }
        }
        let kernel = qforge_ir::text::parse(KERNEL)?;
        let n = parts[0].numel();
        if n == 0 {
            return Ok(parts[0].clone());
        }
        let n = u32::try_from(n).map_err(|_| {
            Error::Invalid(format!(
                "{NAME}: {what}: {n} elements per part (at most 2^32 - 1)"
            ))
        })?;
        let launches: Vec<RankLaunch> = parts
            .iter()
            .map(|p| RankLaunch {
                kernel: kernel.clone(),
                args: vec![
                    RecordedArg::Buffer(p.data.clone()),
                    RecordedArg::Buffer(vec![0; p.data.len()]),
                    RecordedArg::Scalar(Scalar::U32(n)),
                ],
            })
            .collect();
        let mut sum = self.run(&launches, &[Combine::SumF32InRankOrder])?;
        HostTensor::new(DType::F32, parts[0].shape.clone(), sum.remove(0))
    }

    /// Runs `launches` (one per rank, in rank order) as one sharded program and returns one
    /// global result per writable buffer of the kernel, combined as `combine` says (raw bytes,
    /// see [`spmd::module`]).
    ///
    /// A scalar that differs between ranks reaches each rank with its own value
    /// ([`Place::PerRank`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] when there is not one launch per rank, or the launches are not one
    /// program: another kernel or other shapes, each named;
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
                    (RecordedArg::Scalar(s), _) if same => {
                        places.push(Place::Replicated);
                        request_args.push(serde_json::json!({ "value": s.bits() }));
                    }
                    (RecordedArg::Scalar(_), _) => {
                        // A value per rank (a shard's first element index, say).
                        let file = format!("in{i}.bin");
                        let bytes: Vec<u8> = per_rank
                            .iter()
                            .flat_map(|a| match a {
                                RecordedArg::Scalar(s) => s.bits().to_le_bytes(),
                                RecordedArg::Buffer(_) => [0; 4],
                            })
                            .collect();
                        std::fs::write(dir.join(&file), bytes).map_err(io)?;
                        places.push(Place::PerRank);
                        request_args.push(
                            serde_json::json!({ "file": file, "dtype": "uint32", "split": true }),
                        );
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
            run_runner(&kernel.name, d, &dir)?;
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
    let mut bytes = buffer_bytes(&l.args);
    let args = launch_args(&l.kernel, &l.args, &mut bytes)?;
    let b = qforge_ir::bind(&l.kernel, &args)?;
    Ok(Shapes {
        grid: b.grid,
        elements: b.elements,
    })
}

/// The idle runners of this process, each with its rank count and the `XLA_FLAGS` it started
/// with (XLA reads both once, when a process starts). A run takes one of its count and flags,
/// or starts one, and puts it back after an answer (at most [`MAX_IDLE`] are kept); a runner
/// that stopped is dropped.
static IDLE: Mutex<Vec<(RunnerKey, Runner)>> = Mutex::new(Vec::new());

/// A runner's rank count and `XLA_FLAGS`.
type RunnerKey = (usize, Option<std::ffi::OsString>);

/// The most idle runners kept (each a Python process with jax loaded, about 160 MB).
const MAX_IDLE: usize = 4;

/// Runs the program in `dir` on a runner for `ranks` devices and reads its answer.
fn run_runner(kernel: &str, ranks: usize, dir: &std::path::Path) -> Result<()> {
    let key: RunnerKey = (ranks, std::env::var_os("XLA_FLAGS"));
    let taken = {
        let mut pool = IDLE
            .lock()
            .map_err(|_| engine_error("the runner pool's lock is poisoned".into()))?;
        let at = pool.iter().position(|(k, _)| *k == key);
        at.map(|at| pool.swap_remove(at).1)
    };
    let mut runner = match taken.and_then(|mut r| r.alive().then_some(r)) {
        Some(r) => r,
        None => {
            let py = crate::stablehlo::python();
            if !py.exists() {
                return Err(engine_error(format!(
                    "no Python at {} (run scripts/install-stablehlo.sh, or set \
                     QFORGE_STABLEHLO_PYTHON)",
                    py.display()
                )));
            }
            Runner::start(&py, RUNNER, &[ranks.to_string()]).map_err(engine_error)?
        }
    };
    let request = serde_json::json!({ "dir": dir.to_string_lossy() }).to_string();
    let answer = runner
        .ask(&request, 3)
        .map_err(|e| engine_error(format!("{kernel}: {e}")))?;
    if let Ok(mut pool) = IDLE.lock() {
        if pool.len() < MAX_IDLE {
            pool.push((key, runner));
        }
    }
    match answer.as_str() {
        "ok" => Ok(()),
        line => Err(engine_error(format!(
            "{kernel}: {}",
            line.trim_start_matches("error:").trim()
        ))),
    }
}
