//! Sharded programs for XLA SPMD: one kernel launch per rank, as one StableHLO module that XLA
//! partitions over `ranks` devices, with the communication written out (Shardy, as jax emits
//! `shard_map`).
//!
//! The module declares a one-axis mesh (`sdy.mesh @mesh = <["ranks"=D]>`) and a public `main`
//! over the *global* arguments. Its body is one `sdy.manual_computation` over the mesh axis:
//! each device gets its local arguments (its slice of a split argument, the whole of a
//! replicated one), calls the kernel (a private function, the backend's lowering of the kernel
//! at the per-rank shapes, see the backend's module docs), and combines each result as its
//! [`Combine`] says, with explicit `stablehlo.all_gather`s. There is no `all_reduce`: an
//! engine's reduction order is its own, so sums over ranks are all-gathers followed by additions
//! in rank order, the order `docs/distributed.md` defines for every engine.

use std::fmt::Write as _;

use qforge_ir::{DType, Kernel, ParamKind};

use super::emit::function;
use super::{Shapes, BACKEND};
use crate::error::{Error, Result};

/// How a kernel argument reaches the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Every rank gets the whole argument (scalars always are).
    Replicated,
    /// The global argument is the ranks' local arguments concatenated in rank order; rank `r`
    /// gets the `r`-th equal part.
    Split,
    /// A scalar with a value of its own on each rank (a shard's first element index, say): the
    /// global argument is the ranks' values in rank order (`tensor<D x ui32>`), rank `r` gets
    /// the `r`-th. With one rank the module is the kernel's own, which takes the scalar
    /// itself (`tensor<ui32>`).
    PerRank,
}

/// What the program returns for one of the kernel's results (a `Write` or `ReadWrite` buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Each rank's own result: the global result is their concatenation in rank order (split
    /// over the devices; no communication).
    Local,
    /// The ranks' results, each a row-major `[rows, c]`, all-gathered along the last dimension
    /// in rank order: `[rows, D c]` on every rank (a column-parallel output).
    GatherLastDim {
        /// The rows of each rank's result.
        rows: usize,
    },
    /// The ranks' `f32` results all-gathered and summed elementwise in rank order,
    /// `((r_0 + r_1) + r_2) + ...`, in `f32` with round to nearest even, on every rank.
    SumF32InRankOrder,
    /// The ranks run one after another, each continuing from the one before: at step `s`
    /// every rank calls the kernel with argument `arg` (of this result's type) set to the
    /// value carried so far (at step 0, its own argument), and rank `s`'s result, shared by an
    /// all-gather, is the value carried on. The program's result is rank `D - 1`'s, on every
    /// rank (a chained sum: `chain.rs` of the kernels). It must be the kernel's only writable
    /// buffer. Every rank computes every step (the same time as the ranks waiting for each
    /// other, `D` times the work).
    ContinuedInto {
        /// The kernel argument the value is carried in.
        arg: usize,
    },
}

/// The sharded program of [`module`]: the ranks, and where each argument and result goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The number of ranks (XLA devices, the mesh axis' size), at least 1.
    pub ranks: usize,
    /// One per kernel parameter, in parameter order ([`Place::Split`] for buffers only,
    /// [`Place::PerRank`] for scalars only).
    pub args: Vec<Place>,
    /// One per `Write`/`ReadWrite` buffer, in parameter order.
    pub results: Vec<Combine>,
}

/// The mesh axis' name.
const AXIS: &str = "ranks";

/// The StableHLO module that runs `kernel`, lowered at the per-rank `shapes`, on `plan.ranks`
/// devices (see the module docs). For one rank it is the kernel's own module (the backend's
/// [`super::lower`]): XLA does not partition a one-device program, and every combine is the
/// identity there. Its `main` takes the global arguments in parameter order (a
/// split buffer of `n` elements per rank as `tensor<D n x ...>`, a per-rank scalar as
/// `tensor<D x ui32>`, raw bits as the backend's signature) and returns one global result per writable buffer: `D n` elements for
/// [`Combine::Local`] and [`Combine::GatherLastDim`], `n` for [`Combine::SumF32InRankOrder`]
/// and [`Combine::ContinuedInto`].
///
/// # Errors
/// [`Error::Unsupported`] when `plan` has no ranks, does not give one place per parameter and
/// one combine per writable buffer, splits a scalar, gives a buffer a value per rank, sums a buffer that is not `f32`, gathers
/// rows that do not divide the result (or a result with no elements), or continues a result
/// that is not the only one or into an argument of another type; the lowering's errors.
pub fn module(kernel: &Kernel, shapes: &Shapes, plan: &Plan) -> Result<String> {
    let bad = |what: String| Error::Unsupported {
        backend: BACKEND,
        op: format!("{} on {} ranks: {what}", kernel.name, plan.ranks),
    };
    let d = plan.ranks;
    if d == 0 {
        return Err(bad("a sharded program needs at least one rank".into()));
    }
    if plan.args.len() != kernel.params.len() {
        return Err(bad(format!(
            "{} argument places for {} parameters",
            plan.args.len(),
            kernel.params.len()
        )));
    }
    qforge_ir::verify(kernel)?;
    let prepared = crate::decompose::search(kernel, crate::decompose::SearchStrategy::Buckets)?;
    super::check_shapes(&prepared, shapes)?;
    let f = function(&prepared, shapes, "private @shard")?;
    if plan.results.len() != f.results.len() {
        return Err(bad(format!(
            "{} result combines for {} writable buffers",
            plan.results.len(),
            f.results.len()
        )));
    }
    // The global type and sharding of each argument.
    let mut global_args = Vec::new();
    let mut in_shardings = Vec::new();
    // The type of each argument inside the manual computation, and the value the kernel gets.
    let mut local_types = f.args.clone();
    let mut inputs: Vec<String> = (0..f.args.len()).map(|i| format!("%local{i}")).collect();
    let mut body = String::new();
    for (i, ((_, p), place)) in kernel.params.iter().zip(&plan.args).enumerate() {
        let local = &f.args[i];
        match (&p.kind, place) {
            (ParamKind::Scalar(_), Place::Split) => {
                return Err(bad(format!("the scalar `{}` cannot be split", p.name)))
            }
            (ParamKind::Buffer { .. }, Place::PerRank) => {
                return Err(bad(format!(
                    "the buffer `{}` cannot have a value per rank (split it)",
                    p.name
                )))
            }
            (ParamKind::Scalar(_), Place::PerRank) => {
                global_args.push(format!("tensor<{d}xui32>"));
                in_shardings.push(format!("<@mesh, [{{\"{AXIS}\"}}]>"));
                local_types[i] = "tensor<1xui32>".to_string();
                let _ = writeln!(
                    body,
                    "      %scalar{i} = stablehlo.reshape %local{i} : (tensor<1xui32>) -> tensor<ui32>"
                );
                inputs[i] = format!("%scalar{i}");
            }
            (ParamKind::Scalar(_), Place::Replicated) => {
                global_args.push(local.clone());
                in_shardings.push("<@mesh, []>".to_string());
            }
            (ParamKind::Buffer { .. }, Place::Replicated) => {
                global_args.push(local.clone());
                in_shardings.push("<@mesh, [{}]>".to_string());
            }
            (ParamKind::Buffer { dtype, .. }, Place::Split) => {
                global_args.push(raw_tensor(shapes.elements[i] * d, *dtype));
                in_shardings.push(format!("<@mesh, [{{\"{AXIS}\"}}]>"));
            }
        }
    }
    let writable: Vec<(usize, DType)> = kernel
        .params
        .iter()
        .enumerate()
        .filter_map(|(i, (_, p))| match &p.kind {
            ParamKind::Buffer { dtype, access, .. } if *access != qforge_ir::Access::Read => {
                Some((i, *dtype))
            }
            _ => None,
        })
        .collect();
    let mut next = 0usize;
    let mut fresh = || {
        next += 1;
        format!("%c{next}")
    };
    // A continued result: the ranks' steps one after another (see `Combine::ContinuedInto`).
    let continued: Vec<(usize, usize)> = plan
        .results
        .iter()
        .enumerate()
        .filter_map(|(j, c)| match c {
            Combine::ContinuedInto { arg } => Some((j, *arg)),
            _ => None,
        })
        .collect();
    if !continued.is_empty() && plan.results.len() > 1 {
        // The other results would be the last step's, computed from rank D - 2's carried
        // value: no engine's bits.
        return Err(bad(
            "a continued result must be the kernel's only writable buffer".into(),
        ));
    }
    if let Some(&(j, arg)) = continued.first() {
        if f.args.get(arg) != Some(&f.results[j]) {
            return Err(bad(format!(
                "result {j} ({}) cannot continue into argument {arg} ({})",
                f.results[j],
                f.args.get(arg).map_or("none", String::as_str)
            )));
        }
    }
    let steps = if continued.is_empty() { 1 } else { d };
    let n_results = f.results.len();
    let mut call = String::new();
    let mut carried = String::new();
    for step in 0..steps {
        call = format!("%shard{step}");
        let bind = if n_results == 0 {
            String::new()
        } else {
            format!("{call}:{n_results} = ")
        };
        let _ = writeln!(
            body,
            "      {bind}func.call @shard({}) : ({}) -> ({})",
            inputs.join(", "),
            f.args.join(", "),
            f.results.join(", ")
        );
        if let Some(&(j, arg)) = continued.first() {
            // Rank `step`'s result, all-gathered: every rank's input of the next step.
            let n = shapes.elements[writable[j].0];
            let raw = super::emit::raw_elt(writable[j].1);
            let (row, gathered, part, value) = (fresh(), fresh(), fresh(), fresh());
            let _ = writeln!(
                body,
                "      {row} = stablehlo.reshape {call}#{j} : (tensor<{n}x{raw}>) -> tensor<1x{n}x{raw}>\n      \
                 {gathered} = \"stablehlo.all_gather\"({row}) <{{all_gather_dim = 0 : i64, {}}}> : (tensor<1x{n}x{raw}>) -> tensor<{d}x{n}x{raw}>\n      \
                 {part} = stablehlo.slice {gathered} [{step}:{}, 0:{n}] : (tensor<{d}x{n}x{raw}>) -> tensor<1x{n}x{raw}>\n      \
                 {value} = stablehlo.reshape {part} : (tensor<1x{n}x{raw}>) -> tensor<{n}x{raw}>",
                group(d, n_results + step),
                step + 1
            );
            inputs[arg] = value.clone();
            carried = value;
        }
    }
    let mut names = Vec::new();
    let mut global_results = Vec::new();
    let mut out_shardings = Vec::new();
    for (j, ((i, dtype), combine)) in writable.iter().zip(&plan.results).enumerate() {
        let n = shapes.elements[*i];
        let raw = super::emit::raw_elt(*dtype);
        let value = format!("{call}#{j}");
        match combine {
            Combine::Local => {
                names.push(value);
                global_results.push(raw_tensor(n * d, *dtype));
                out_shardings.push(format!("<@mesh, [{{\"{AXIS}\"}}]>"));
            }
            Combine::GatherLastDim { rows } => {
                if n == 0 || *rows == 0 || !n.is_multiple_of(*rows) {
                    return Err(bad(format!(
                        "result {j} has {n} elements per rank, not a whole number of {rows} rows"
                    )));
                }
                let c = n / rows;
                let (shaped, gathered, flat) = (fresh(), fresh(), fresh());
                let _ = writeln!(
                    body,
                    "      {shaped} = stablehlo.reshape {value} : (tensor<{n}x{raw}>) -> tensor<{rows}x{c}x{raw}>\n      \
                     {gathered} = \"stablehlo.all_gather\"({shaped}) <{{all_gather_dim = 1 : i64, {}}}> : (tensor<{rows}x{c}x{raw}>) -> tensor<{rows}x{}x{raw}>\n      \
                     {flat} = stablehlo.reshape {gathered} : (tensor<{rows}x{}x{raw}>) -> tensor<{}x{raw}>",
                    group(d, j),
                    c * d,
                    c * d,
                    n * d
                );
                names.push(flat);
                global_results.push(raw_tensor(n * d, *dtype));
                out_shardings.push("<@mesh, [{}]>".to_string());
            }
            Combine::ContinuedInto { .. } => {
                names.push(carried.clone());
                global_results.push(raw_tensor(n, *dtype));
                out_shardings.push("<@mesh, [{}]>".to_string());
            }
            Combine::SumF32InRankOrder => {
                if *dtype != DType::F32 {
                    return Err(bad(format!(
                        "result {j} is {dtype}: only f32 results are summed"
                    )));
                }
                let (row, gathered) = (fresh(), fresh());
                let _ = writeln!(
                    body,
                    "      {row} = stablehlo.reshape {value} : (tensor<{n}xui32>) -> tensor<1x{n}xui32>\n      \
                     {gathered} = \"stablehlo.all_gather\"({row}) <{{all_gather_dim = 0 : i64, {}}}> : (tensor<1x{n}xui32>) -> tensor<{d}x{n}xui32>",
                    group(d, j)
                );
                let mut sum = String::new();
                for r in 0..d {
                    let (part, flat, float) = (fresh(), fresh(), fresh());
                    let _ = writeln!(
                        body,
                        "      {part} = stablehlo.slice {gathered} [{r}:{}, 0:{n}] : (tensor<{d}x{n}xui32>) -> tensor<1x{n}xui32>\n      \
                         {flat} = stablehlo.reshape {part} : (tensor<1x{n}xui32>) -> tensor<{n}xui32>\n      \
                         {float} = stablehlo.bitcast_convert {flat} : (tensor<{n}xui32>) -> tensor<{n}xf32>",
                        r + 1
                    );
                    sum = if r == 0 {
                        float
                    } else {
                        let s = fresh();
                        let _ = writeln!(
                            body,
                            "      {s} = stablehlo.add {sum}, {float} : tensor<{n}xf32>"
                        );
                        s
                    };
                }
                let bits = fresh();
                let _ = writeln!(
                    body,
                    "      {bits} = stablehlo.bitcast_convert {sum} : (tensor<{n}xf32>) -> tensor<{n}xui32>"
                );
                names.push(bits);
                global_results.push(raw_tensor(n, *dtype));
                out_shardings.push("<@mesh, [{}]>".to_string());
            }
        }
    }
    let mut text = format!(
        "// qforge sharded kernel {} on {d} ranks (grid {} per rank)\n\
         module @{} attributes {{mhlo.num_partitions = {d} : i32, mhlo.num_replicas = 1 : i32}} {{\n  \
         sdy.mesh @mesh = <[\"{AXIS}\"={d}]>\n",
        kernel.name,
        shapes.grid,
        super::emit::module_name(&format!("spmd_{}", kernel.name)),
    );
    let params: Vec<String> = global_args
        .iter()
        .zip(&in_shardings)
        .enumerate()
        .map(|(i, (t, s))| format!("%arg{i}: {t} {{sdy.sharding = #sdy.sharding{s}}}"))
        .collect();
    let rets: Vec<String> = global_results
        .iter()
        .zip(&out_shardings)
        .map(|(t, s)| format!("{t} {{sdy.sharding = #sdy.sharding{s}}}"))
        .collect();
    let _ = writeln!(
        text,
        "  func.func public @main({}) -> ({}) {{",
        params.join(", "),
        rets.join(", ")
    );
    let arg_names: Vec<String> = (0..global_args.len()).map(|i| format!("%arg{i}")).collect();
    let manual_params: Vec<String> = local_types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%local{i}: {t}"))
        .collect();
    let result_count = if names.is_empty() {
        String::new()
    } else {
        format!("%out:{} = ", names.len())
    };
    let _ = writeln!(
        text,
        "    {result_count}sdy.manual_computation({}) in_shardings=[{}] out_shardings=[{}] manual_axes={{\"{AXIS}\"}} ({}) {{",
        arg_names.join(", "),
        in_shardings.join(", "),
        out_shardings.join(", "),
        manual_params.join(", ")
    );
    text.push_str(&body);
    let local_results: Vec<String> = writable
        .iter()
        .zip(&plan.results)
        .map(|((i, dtype), c)| match c {
            Combine::Local => raw_tensor(shapes.elements[*i], *dtype),
            Combine::GatherLastDim { .. } => raw_tensor(shapes.elements[*i] * d, *dtype),
            Combine::SumF32InRankOrder | Combine::ContinuedInto { .. } => {
                raw_tensor(shapes.elements[*i], *dtype)
            }
        })
        .collect();
    let sdy_return = if names.is_empty() {
        "sdy.return".to_string()
    } else {
        format!(
            "sdy.return {} : {}",
            names.join(", "),
            local_results.join(", ")
        )
    };
    let _ = writeln!(
        text,
        "      {sdy_return}\n    }} : ({}) -> ({})",
        global_args.join(", "),
        global_results.join(", ")
    );
    let ret = if names.is_empty() {
        "return".to_string()
    } else {
        let outs: Vec<String> = (0..names.len()).map(|k| format!("%out#{k}")).collect();
        format!("return {} : {}", outs.join(", "), global_results.join(", "))
    };
    let _ = writeln!(text, "    {ret}\n  }}");
    text.push_str(&f.text);
    text.push_str("}\n");
    if d == 1 {
        // XLA does not partition a program for one device, so Shardy's ops would stay
        // unlowered: one rank runs the kernel's own module (every combine is the identity).
        return super::emit::module(&prepared, shapes);
    }
    Ok(text)
}

/// `tensor<n x raw>` for `n` elements of `dtype` carried as raw bits.
fn raw_tensor(n: usize, dtype: DType) -> String {
    format!("tensor<{n}x{}>", super::emit::raw_elt(dtype))
}

/// The attributes every all-gather shares: all ranks in one group, a channel of its own.
fn group(d: usize, channel: usize) -> String {
    let ids: Vec<String> = (0..d).map(|r| r.to_string()).collect();
    format!(
        "channel_handle = #stablehlo.channel_handle<handle = {}, type = 1>, replica_groups = dense<[[{}]]> : tensor<1x{d}xi64>, use_global_device_ids",
        channel + 1,
        ids.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const COPY: &str = "kernel copy(a: u8[n] read, y: u8[n] write, n: u32)
grid n
{
  %0: u32 = work_item
  %1: u32 = load a[%0]
  store y[%0] = %1
}";

    fn plan(ranks: usize, args: Vec<Place>, results: Vec<Combine>) -> Plan {
        Plan {
            ranks,
            args,
            results,
        }
    }

    #[test]
    fn bad_plans_are_named_errors() {
        let k = qforge_ir::text::parse(COPY).unwrap();
        let shapes = Shapes {
            grid: 6,
            elements: vec![6, 6, 0],
        };
        let (split, rep) = (Place::Split, Place::Replicated);
        let cases = [
            (
                plan(0, vec![rep; 3], vec![Combine::Local]),
                "at least one rank",
            ),
            (
                plan(2, vec![rep; 2], vec![Combine::Local]),
                "2 argument places for 3",
            ),
            (
                plan(2, vec![rep, rep, split], vec![Combine::Local]),
                "scalar `n` cannot be split",
            ),
            (
                plan(2, vec![Place::PerRank, rep, rep], vec![Combine::Local]),
                "buffer `a` cannot have a value per rank",
            ),
            (
                plan(2, vec![split, rep, rep], vec![]),
                "0 result combines for 1",
            ),
            (
                plan(2, vec![split, rep, rep], vec![Combine::SumF32InRankOrder]),
                "only f32 results are summed",
            ),
            (
                plan(
                    2,
                    vec![split, rep, rep],
                    vec![Combine::GatherLastDim { rows: 4 }],
                ),
                "not a whole number of 4 rows",
            ),
        ];
        let continued = |arg| Combine::ContinuedInto { arg };
        let more = [
            (
                plan(2, vec![split, rep, rep], vec![continued(2)]),
                "cannot continue into argument 2",
            ),
            (
                plan(2, vec![split, rep, rep], vec![continued(7)]),
                "cannot continue into argument 7 (none)",
            ),
        ];
        for (p, expected) in cases.into_iter().chain(more) {
            let err = module(&k, &shapes, &p).unwrap_err().to_string();
            assert!(err.contains(expected), "{p:?}: {err}");
        }
        let ok = plan(
            3,
            vec![split, rep, rep],
            vec![Combine::GatherLastDim { rows: 3 }],
        );
        let text = module(&k, &shapes, &ok).unwrap();
        assert!(
            text.contains("tensor<18xui8> {sdy.sharding = #sdy.sharding<@mesh, [{\"ranks\"}]>}")
        );
        assert!(text.contains("replica_groups = dense<[[0, 1, 2]]> : tensor<1x3xi64>"));
        // A scalar with a value per rank: three values in, one per rank to the kernel.
        let per_rank = plan(3, vec![split, rep, Place::PerRank], vec![Combine::Local]);
        let text = module(&k, &shapes, &per_rank).unwrap();
        assert!(
            text.contains(
                "%arg2: tensor<3xui32> {sdy.sharding = #sdy.sharding<@mesh, [{\"ranks\"}]>}"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "%scalar2 = stablehlo.reshape %local2 : (tensor<1xui32>) -> tensor<ui32>"
            ),
            "{text}"
        );
        assert!(
            text.contains("func.call @shard(%local0, %local1, %scalar2)"),
            "{text}"
        );
        // A continued result must be the only one (the others would be no engine's bits).
        let two = qforge_ir::text::parse(
            "kernel two(a: u8[n] read, y: u8[n] write, z: u8[n] write, n: u32)
grid n
{
  %0: u32 = work_item
  %1: u32 = load a[%0]
  store y[%0] = %1
  store z[%0] = %1
}",
        )
        .unwrap();
        let shapes2 = Shapes {
            grid: 6,
            elements: vec![6, 6, 6, 0],
        };
        let p = plan(
            2,
            vec![split, rep, rep, rep],
            vec![continued(0), Combine::Local],
        );
        let err = module(&two, &shapes2, &p).unwrap_err().to_string();
        assert!(err.contains("the kernel's only writable buffer"), "{err}");
        // A continued result: three steps, each a call and an all-gather of its rank's result.
        let chained = plan(3, vec![split, rep, rep], vec![continued(0)]);
        let text = module(&k, &shapes, &chained).unwrap();
        assert_eq!(text.matches("func.call @shard(").count(), 3);
        assert!(text.contains("[2:3, 0:6]"), "{text}");
    }
}
