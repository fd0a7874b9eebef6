//! Row-parallel shards of a 4-bit linear (Megatron's `RowParallelLinear`): the weight `[N, K]`
//! split by input features, shard `r` of `D` owning the columns `r K/D .. (r+1) K/D`
//! (`docs/distributed.md`).
//!
//! * The input gradient is exact and needs no sum across shards: `dX[:, cols_r]` is the whole
//!   `N` reduction (`DX_ORDER`) for those columns, the same in the shard as in the layer, so the
//!   gathered columns are the unsharded `dX` bit for bit.
//! * The forward needs a sum across shards, and `K_ORDER`'s partial chains run through the
//!   whole `K`: no combination of the shards' finished sums gives the unsharded bits. The exact
//!   forward ([`Linear4bit::forward_row_parallel`]) continues the chains from rank to rank
//!   (`chain.rs`; serial compute, sharded memory); the parallel one is an explicitly relaxed
//!   mode ([`Linear4bit::forward_row_parallel_relaxed`]) with its bound.
//! * A plain absmax is the corresponding bytes. A double-quantized absmax groups 256 blocks of
//!   the flattened weight, which a column range of each row does not keep whole, so the shard
//!   carries the decoded `f32` absmax of its blocks (the values the kernel decodes, two `f32`
//!   roundings each: `decompress_absmax`), not the checkpoint's bytes.

use std::ops::Range;

use qforge_runtime::{agree, Communicator, Device, Error, HostTensor, Result};

use super::chain::{activations, continued_chains, tree, ChainOf, ChainWeight};
use super::host::{matmul_4bit, weight_dtype, Linear4bit};
use super::shard::gather_last_dim;
use crate::ops::{decompress_absmax, Absmax4, QuantState4};

/// The input-feature columns of each of `shards` row-parallel shards of a 4-bit weight
/// `[N, K]` quantized with `state`: `K / shards` columns each, in rank order.
///
/// # Errors
/// [`Error::Invalid`] naming the shape and the shard count when `state` is not a 2-D weight,
/// `shards` is 0 or does not divide `K`, or the blocksize does not divide `K / shards` (a
/// block would straddle two shards, or cross a row).
pub fn row_cols(state: &QuantState4, shards: usize) -> Result<Vec<Range<usize>>> {
    let [n, k] = state.shape[..] else {
        return Err(Error::Invalid(format!(
            "row-parallel shards: the weight must be 2-D [N, K], got shape {:?}",
            state.shape
        )));
    };
    if shards == 0 || !k.is_multiple_of(shards) {
        return Err(Error::Invalid(format!(
            "row-parallel shards: {shards} shards do not divide the weight's K = {k} input \
             features (shape [{n}, {k}])"
        )));
    }
    let cols = k / shards;
    if !cols.is_multiple_of(state.blocksize) {
        return Err(Error::Invalid(format!(
            "row-parallel shards: {shards} shards of the weight [{n}, {k}] have {cols} columns \
             each, not a multiple of the blocksize {}: a quantization block would straddle two \
             shards",
            state.blocksize
        )));
    }
    Ok((0..shards).map(|r| r * cols..(r + 1) * cols).collect())
}

impl Linear4bit {
    /// Shard `rank` of `shards` row-parallel shards ([`row_cols`]): its columns of every row's
    /// packed codes, its blocks' absmax (decoded to `f32` when double-quantized; `dev` runs
    /// the decoding), and the whole bias (added once, after the sum over shards).
    ///
    /// # Errors
    /// As [`row_cols`], plus `rank >= shards`, buffers that do not match the state, or a
    /// device error decoding a nested absmax.
    pub fn row_shard(&self, dev: &dyn Device, rank: usize, shards: usize) -> Result<Linear4bit> {
        let all = row_cols(&self.state, shards)?;
        let cols = all.get(rank).cloned().ok_or_else(|| {
            Error::Invalid(format!(
                "row-parallel shards: rank {rank} is not one of {shards} shards"
            ))
        })?;
        let (n, k, bs) = (
            self.out_features(),
            self.in_features(),
            self.state.blocksize,
        );
        let short = || {
            Error::Invalid(format!(
                "row-parallel shards: the weight's buffers are shorter than its shape {:?} needs",
                self.state.shape
            ))
        };
        let mut packed = Vec::with_capacity(n * cols.len() / 2);
        for row in 0..n {
            let bytes = (row * k + cols.start) / 2..(row * k + cols.end) / 2;
            packed.extend_from_slice(self.packed.get(bytes).ok_or_else(short)?);
        }
        let absmax = match &self.state.absmax {
            Absmax4::Plain(a) => a.clone(),
            nested @ Absmax4::Nested { .. } => decompress_absmax(dev, nested)?,
        };
        let mut blocks = Vec::with_capacity(n * cols.len() / bs);
        for row in 0..n {
            let b = (row * k + cols.start) / bs..(row * k + cols.end) / bs;
            blocks.extend_from_slice(absmax.get(b).ok_or_else(short)?);
        }
        Ok(Linear4bit {
            packed,
            state: QuantState4 {
                shape: vec![n, cols.len()],
                absmax: Absmax4::Plain(blocks),
                ..self.state.clone()
            },
            bias: self.bias.clone(),
        })
    }

    /// The row-parallel input gradient of this shard on `comm`'s rank: its columns of
    /// `dX = dY @ dequant(W)` locally ([`Linear4bit::backward_input`]), then one all-gather,
    /// giving every rank the whole `dX` (`[..., K]`), equal bit for bit to the unsharded layer's.
    /// Every rank passes the same `dY` (`[..., N]`); `self` is shard `comm.rank()` of
    /// `comm.size()` ([`Linear4bit::row_shard`]).
    ///
    /// # Errors
    /// As [`Linear4bit::backward_input`]; the all-gather's errors.
    pub fn backward_input_row_parallel(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        dy: &HostTensor,
    ) -> Result<HostTensor> {
        gather_last_dim(comm, &agree(comm, self.backward_input(dev, dy))?)
    }

    /// The exact row-parallel forward of this shard on `comm`'s rank, `x_r` being this rank's
    /// columns of the input (`[..., K / D]`, f32, f16 or bf16): equal bit for bit to the
    /// unsharded layer's `x @ dequant(W).T + b` on every rank. Rank `r` continues `K_ORDER`'s 16
    /// partial chains from rank `r - 1` (`chain.rs`), so the ranks compute one after another:
    /// `D` all-gathers of `16 * M * N` floats per rank each, the last of which gives every rank the
    /// chains it combines (halving tree, then the bias in `x`'s dtype, in `f32`) and rounds to
    /// `x`'s dtype. Every rank passes its own columns of the same `x`.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `self` is not a row-parallel shard (its absmax is not plain),
    /// `x_r` is not a float tensor whose last dim is the shard's `K / D`, a 16-bit weight meets
    /// activations of another 16-bit dtype, or a count exceeds `u32`; device errors; the
    /// all-gathers' errors.
    pub fn forward_row_parallel(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        x_r: &HostTensor,
    ) -> Result<HostTensor> {
        const OP: &str = "row-parallel forward";
        let (n, k) = (self.out_features(), self.in_features());
        let dtype = x_r.dtype;
        // Checked on every rank and agreed on, so that a rank with bad input stops them all.
        let checked = (|| {
            let Absmax4::Plain(absmax) = &self.state.absmax else {
                return Err(Error::Invalid(format!(
                    "{OP}: the weight is not a row-parallel shard (make it with row_shard)"
                )));
            };
            if !k.is_multiple_of(ChainOf::Forward.chains()) {
                return Err(Error::Invalid(format!(
                    "{OP}: the shard's {k} columns are not a multiple of 16"
                )));
            }
            let (x, m) = activations(OP, "x_r (this rank's columns)", x_r, k)?;
            if let Some(b) = &self.bias {
                if b.shape != [n] || !b.dtype.is_float() {
                    return Err(Error::Invalid(format!(
                        "{OP}: the bias must be a float [{n}], got {} {:?}",
                        b.dtype, b.shape
                    )));
                }
            }
            let weight = ChainWeight {
                packed: &self.packed,
                absmax,
                quant_type: self.state.quant_type,
                blocksize: self.state.blocksize,
                weight_dtype: weight_dtype(OP, self.state.dtype, dtype)?,
            };
            weight.check(OP, n, k)?;
            Ok((weight, x, m))
        })();
        let (weight, x, m) = agree(comm, checked)?;
        let chains = continued_chains(dev, comm, ChainOf::Forward, &weight, &x, (m, n, k))?;
        self.forward_from_chains(chains, x_r)
    }

    /// The end of the exact row-parallel forward: the last rank's `K_ORDER` chains
    /// (`16 * M * N` floats) combined by the halving tree, the bias added in `x`'s dtype (as
    /// `matmul_4bit`, one `f32` addition), rounded to `x_r`'s dtype, shaped `[..., N]`.
    pub(crate) fn forward_from_chains(
        &self,
        mut chains: Vec<f32>,
        x_r: &HostTensor,
    ) -> Result<HostTensor> {
        let dtype = x_r.dtype;
        let mut y = tree(&mut chains, ChainOf::Forward.chains());
        if let Some(b) = &self.bias {
            let b = HostTensor::from_f32_as(dtype, b.shape.clone(), &b.to_f32()?)?.to_f32()?;
            for (v, b) in y.iter_mut().zip(b.iter().cycle()) {
                *v += b;
            }
        }
        let mut shape = x_r.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = self.out_features();
        }
        HostTensor::from_f32_as(dtype, shape, &y)
    }

    /// **Relaxed, not bit-identical to the unsharded layer.** The row-parallel forward of this
    /// shard on `comm`'s rank, `x_r` being this rank's columns of the input (`[..., K / D]`):
    /// each rank computes `x_r @ dequant(W_r).T` in `K_ORDER` over its columns (rounded to
    /// `x`'s dtype), one all-gather shares the partial outputs, and every rank sums them in
    /// `f32` in rank order, adds the bias (rounded to `x`'s dtype; one addition) and rounds
    /// once to `x`'s dtype. For `f32` it differs from the unsharded forward by the rounding of the `D` split
    /// chains plus `D - 1` additions: with `n = K / (16 D) + 4 + (D - 1)` and `u = 2^-24`, the
    /// error against the exact sum is at most `n u / (1 - n u) * sum_k |x_k w_k|` (numeric
    /// contract rule 7; the unsharded kernel's bound has `n = K / 16 + 4`, `docs/semantics.md`).
    ///
    /// # Errors
    /// As [`matmul_4bit`]; the all-gather's errors.
    pub fn forward_row_parallel_relaxed(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        x_r: &HostTensor,
    ) -> Result<HostTensor> {
        let local = agree(
            comm,
            matmul_4bit(dev, x_r, &self.packed, &self.state, None, None),
        )?;
        let f32s = local.to_f32()?;
        let gathered = comm.all_gather(&qforge_runtime::f32_bytes(&f32s))?;
        let parts: Vec<f32> = qforge_runtime::bytes_f32(&gathered);
        let len = f32s.len();
        let mut sum = parts[..len].to_vec();
        for r in 1..comm.size() {
            for (s, p) in sum.iter_mut().zip(&parts[r * len..(r + 1) * len]) {
                *s += p;
            }
        }
        // The bias rounded to x's dtype (as `Linear4bit::forward`), one f32 addition.
        if let Some(bias) = &self.bias {
            let b = HostTensor::from_f32_as(local.dtype, bias.shape.clone(), &bias.to_f32()?)?
                .to_f32()?;
            for (s, b) in sum.iter_mut().zip(b.iter().cycle()) {
                *s += b;
            }
        }
        HostTensor::from_f32_as(local.dtype, local.shape, &sum)
    }
}
