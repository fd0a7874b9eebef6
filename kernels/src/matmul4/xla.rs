//! Tensor-parallel 4-bit linears on the XLA SPMD engine ([`XlaSpmd`], feature `stablehlo`):
//! the shards' kernels and the collectives between them run as one sharded StableHLO program
//! that XLA partitions over its devices. The layouts are those of `shard.rs` and
//! `row_shard.rs`; results are bit-identical to the unsharded layer where they are on the other
//! engines, for inputs whose computation meets no subnormal (XLA's CPU code flushes them).

use qforge_ir::DType;
use qforge_runtime::xla_spmd::{Capture, Combine, XlaSpmd};
use qforge_runtime::{Device, Error, HostTensor, Result};

use super::host::matmul_4bit;
use super::host::Linear4bit;
use crate::blockwise8::host::decompress_absmax;
use crate::ops::Absmax4;
use crate::spmd_capture::{record, Recorded, Rehearsal};

/// Runs `one` (a host op on one shard, launching one kernel) for every shard (see
/// [`record`]), then the ranks' launches on `engine`, combining its one result as
/// `combine(rows, kernel)` says, `rows` being the local result's rows (all dimensions but the
/// last). Returns the global result's bytes with rank `D - 1`'s local result (its dtype and
/// shape), or no bytes and that local result when no rank launched (no rows).
fn sharded(
    op: &str,
    engine: &XlaSpmd,
    shards: &[Linear4bit],
    combine: impl Fn(usize, &qforge_ir::Kernel) -> Result<Combine>,
    one: impl Fn(usize, &Linear4bit, &Capture, &Rehearsal) -> Result<HostTensor>,
) -> Result<(Vec<u8>, HostTensor)> {
    if shards.len() != engine.ranks() {
        return Err(Error::Invalid(format!(
            "{op}: {} shards on {} ranks (one shard per rank)",
            shards.len(),
            engine.ranks()
        )));
    }
    let Recorded {
        launches,
        mut results,
    } = record(op, engine, Some(1), |r, dev, comm| {
        one(r, &shards[r], dev, comm)
    })?;
    let Some(local) = results.pop() else {
        return Err(Error::Invalid(format!("{op}: no shards")));
    };
    let Some(launches) = launches.first() else {
        return Ok((Vec::new(), local));
    };
    let last = local.shape.last().copied().unwrap_or(1).max(1);
    let rows = local.data.len() / local.dtype.size_bytes() / last;
    let combine = combine(rows, &launches[0].kernel)?;
    let mut results = engine.run(launches, &[combine])?;
    Ok((results.remove(0), local))
}

impl Linear4bit {
    /// The column-parallel forward on `engine`: shard `r` of `shards`
    /// ([`Linear4bit::column_shard`] of `engine.ranks()`) computes `x @ dequant(W_r).T (+ b_r)`
    /// on XLA device `r`, and one all-gather along the last dimension gives `y` (`[..., N]`),
    /// equal bit for bit to the unsharded [`Linear4bit::forward`] for inputs without
    /// subnormals. Every rank gets the same `x` (`[..., K]`).
    ///
    /// # Errors
    /// [`Error::Invalid`] when there is not one shard per rank or the shards differ in shape
    /// (SPMD runs one program); as [`Linear4bit::forward`]; the engine's errors.
    pub fn forward_column_parallel_xla(
        shards: &[Linear4bit],
        engine: &XlaSpmd,
        x: &HostTensor,
    ) -> Result<HostTensor> {
        let (bytes, local) = sharded(
            "column-parallel forward (xla)",
            engine,
            shards,
            |rows, _| Ok(Combine::GatherLastDim { rows }),
            |_, shard, dev, _| shard.forward(dev, x),
        )?;
        gathered(bytes, local, engine.ranks())
    }

    /// The row-parallel input gradient on `engine`: shard `r` of `shards`
    /// ([`Linear4bit::row_shard`] of `engine.ranks()`) computes its columns of
    /// `dX = dY @ dequant(W)` on XLA device `r`, and one all-gather along the last dimension
    /// gives `dX` (`[..., K]`), equal bit for bit to the unsharded
    /// [`Linear4bit::backward_input`] for inputs without subnormals.
    ///
    /// # Errors
    /// As [`Linear4bit::forward_column_parallel_xla`], with [`Linear4bit::backward_input`].
    pub fn backward_input_row_parallel_xla(
        shards: &[Linear4bit],
        engine: &XlaSpmd,
        dy: &HostTensor,
    ) -> Result<HostTensor> {
        let (bytes, local) = sharded(
            "row-parallel dX (xla)",
            engine,
            shards,
            |rows, _| Ok(Combine::GatherLastDim { rows }),
            |_, shard, dev, _| shard.backward_input(dev, dy),
        )?;
        gathered(bytes, local, engine.ranks())
    }

    /// **Relaxed, not bit-identical to the unsharded layer**: the row-parallel forward on
    /// `engine` with `f32` activations, `x_r[r]` being rank `r`'s columns of `x`
    /// (`[..., K / D]`). Rank `r` computes `x_r @ dequant(W_r).T`; the program all-gathers the
    /// partial outputs and every rank sums them in rank order in `f32`; the bias is added
    /// after (one `f32` addition). The same bits as
    /// [`Linear4bit::forward_row_parallel_relaxed`] on any other engine, with its error bound.
    ///
    /// # Errors
    /// [`Error::Invalid`] for activations that are not `f32`, one `x_r` per shard missing, or
    /// as [`Linear4bit::forward_column_parallel_xla`] with [`matmul_4bit`].
    pub fn forward_row_parallel_relaxed_xla(
        shards: &[Linear4bit],
        engine: &XlaSpmd,
        x_r: &[HostTensor],
    ) -> Result<HostTensor> {
        const OP: &str = "row-parallel forward, relaxed (xla)";
        one_per_shard(OP, x_r, shards)?;
        if let Some(x) = x_r.iter().find(|x| x.dtype != DType::F32) {
            return Err(Error::Invalid(format!(
                "{OP}: the engine sums f32 partial outputs; got {} activations",
                x.dtype
            )));
        }
        let n = shards[0].out_features();
        let bias = &shards[0].bias;
        if shards.iter().any(|s| s.bias != *bias) || bias.as_ref().is_some_and(|b| b.shape != [n]) {
            return Err(Error::Invalid(format!(
                "{OP}: the bias must be one [{n}] tensor that every shard holds (or none), got \
                 {:?} on shard 0",
                bias.as_ref().map(|b| &b.shape)
            )));
        }
        let (bytes, local) = sharded(
            OP,
            engine,
            shards,
            |_, _| Ok(Combine::SumF32InRankOrder),
            |r, shard, dev, _| matmul_4bit(dev, &x_r[r], &shard.packed, &shard.state, None, None),
        )?;
        if local.data.is_empty() {
            return Ok(local);
        }
        let mut sum = qforge_runtime::bytes_f32(&bytes);
        // The bias (as `forward_row_parallel_relaxed`): one f32 addition.
        if let Some(bias) = bias {
            for (s, b) in sum.iter_mut().zip(bias.to_f32()?.iter().cycle()) {
                *s += b;
            }
        }
        HostTensor::from_f32_as(local.dtype, local.shape, &sum)
    }
}

impl Linear4bit {
    /// The exact row-parallel forward on `engine`, `x_r[r]` being rank `r`'s columns of `x`
    /// (`[..., K / D]`, f32, f16 or bf16): equal bit for bit to the unsharded
    /// [`Linear4bit::forward`] for inputs without subnormals. As
    /// [`Linear4bit::forward_row_parallel`] on the other engines, rank `r` continues
    /// `K_ORDER`'s 16 partial chains from rank `r - 1` ([`Combine::ContinuedInto`]: one
    /// program of `D` steps); the chains' tree, the bias and the rounding follow on the host.
    ///
    /// # Errors
    /// As [`Linear4bit::forward_row_parallel`]; one input per shard missing; as
    /// [`Linear4bit::forward_column_parallel_xla`].
    pub fn forward_row_parallel_xla(
        shards: &[Linear4bit],
        engine: &XlaSpmd,
        x_r: &[HostTensor],
    ) -> Result<HostTensor> {
        const OP: &str = "row-parallel forward (xla)";
        one_per_shard(OP, x_r, shards)?;
        let (chains, _) = sharded(OP, engine, shards, continue_start, |r, shard, dev, comm| {
            shard.forward_row_parallel(dev, comm, &x_r[r])
        })?;
        let last = shards.len() - 1;
        shards[last].forward_from_chains(qforge_runtime::bytes_f32(&chains), &x_r[last])
    }

    /// The exact column-parallel input gradient on `engine`, `dy_r[r]` being rank `r`'s
    /// columns of `dY` (`[..., N / D]`): equal bit for bit to the unsharded
    /// [`Linear4bit::backward_input`] for inputs without subnormals. As
    /// [`Linear4bit::backward_input_column_parallel`], rank `r` continues `DX_ORDER`'s
    /// running sums from rank `r - 1`. A double-quantized absmax is decoded on `dev` first.
    ///
    /// # Errors
    /// As [`Linear4bit::backward_input_column_parallel`]; one input per shard missing; as
    /// [`Linear4bit::forward_column_parallel_xla`].
    pub fn backward_input_column_parallel_xla(
        dev: &dyn Device,
        shards: &[Linear4bit],
        engine: &XlaSpmd,
        dy_r: &[HostTensor],
    ) -> Result<HostTensor> {
        const OP: &str = "column-parallel dX (xla)";
        one_per_shard(OP, dy_r, shards)?;
        if shards.len() != engine.ranks() {
            return Err(Error::Invalid(format!(
                "{OP}: {} shards on {} ranks (one shard per rank)",
                shards.len(),
                engine.ranks()
            )));
        }
        // The chains kernel reads a decoded absmax; decode it here, where a device runs.
        let decoded = shards
            .iter()
            .map(|s| {
                let mut plain = s.clone();
                plain.state.absmax = Absmax4::Plain(decompress_absmax(dev, &s.state.absmax)?);
                Ok(plain)
            })
            .collect::<Result<Vec<_>>>()?;
        let (chains, _) = sharded(
            OP,
            engine,
            &decoded,
            continue_start,
            |r, shard, dev, comm| shard.backward_input_column_parallel(dev, comm, &dy_r[r]),
        )?;
        let last = shards.len() - 1;
        shards[last].dx_from_chains(qforge_runtime::bytes_f32(&chains), &dy_r[last])
    }
}

/// Checks that there is one input per shard.
fn one_per_shard(op: &str, inputs: &[HostTensor], shards: &[Linear4bit]) -> Result<()> {
    if inputs.len() != shards.len() || shards.is_empty() {
        return Err(Error::Invalid(format!(
            "{op}: {} inputs for {} shards (one per rank, at least one)",
            inputs.len(),
            shards.len()
        )));
    }
    Ok(())
}

/// The chains kernel's result continued into its `start` argument.
fn continue_start(_rows: usize, kernel: &qforge_ir::Kernel) -> Result<Combine> {
    kernel
        .params
        .iter()
        .position(|(_, p)| p.name == "start")
        .map(|arg| Combine::ContinuedInto { arg })
        .ok_or_else(|| Error::Invalid(format!("`{}` has no `start` to continue", kernel.name)))
}

/// The all-gathered `bytes` as a tensor of `local`'s dtype whose last dimension is `ranks`
/// times `local`'s.
fn gathered(bytes: Vec<u8>, local: HostTensor, ranks: usize) -> Result<HostTensor> {
    let mut shape = local.shape;
    if let Some(last) = shape.last_mut() {
        *last *= ranks;
    }
    HostTensor::new(local.dtype, shape, bytes)
}
