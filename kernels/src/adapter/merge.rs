//! Merging a linear adapter into the layer before it.
//!
//! With `beta = 0`, `act_beta(z) = z`, so after a layer `h = W x + b` (`W: [d, K]`, `b: [d]`)
//! the adapter gives `y = h + U (D h + b_d) + b_u = (I + U D) h + U b_d + b_u`, hence
//! `y = W' x + b'` with
//! * `W' = (I + U D) W = W + U (D W)`,
//! * `b' = (I + U D) b + U b_d + b_u = b + U (D b + b_d) + b_u`.
//!
//! (An additive merge `W + D^T U^T`-style, as for a parallel LoRA branch, is wrong here: the
//! adapter acts on the layer's output, so its product multiplies `W` and `b`.) Each product is a
//! qforge [`gemm`] kernel, in this order: `DW = D @ W` (`[r, K]`), `W' = W + U @ DW` (one
//! residual add), `t = D b + b_d` (`[r]`), `b' = (U t + b_u) + b`.
//!
//! Sharded (a column-parallel `W` split by output rows, `W_s: [d_s, K]`, with the matching
//! columns `D_s = D[:, rows_s]` and rows `U_s = U[rows_s, :]`): each shard computes its partial
//! `D_s W_s` (`[r, K]`) and `D_s b_s` (`[r]`); one all-reduce sums them (here in shard order, one
//! `f32` add per shard after the first); then every shard computes its own rows
//! `W'_s = W_s + U_s (D W)` and `b'_s = (U_s t + b_u[rows_s]) + b_s` locally. The sums over `d`
//! are split differently, so the result agrees with the unsharded merge within rounding (and
//! is bitwise equal for one shard). [`BottleneckAdapter::merge_column_parallel_relaxed`] runs it
//! on real ranks (one all-gather of the partials, summed in rank order), bit-identical to
//! [`BottleneckAdapter::merge_sharded`] over the same shards. The exact merge on real ranks,
//! [`BottleneckAdapter::merge_column_parallel`], all-gathers the layer's columns chunk by chunk
//! instead and computes `D W` as the unsharded merge does.

use qforge_ir::DType;

use super::BottleneckAdapter;
use crate::ops::{gemm, Layout};
use qforge_runtime::HostTensor;
use qforge_runtime::{agree, Communicator, Device};
use qforge_runtime::{Error, Result};
use std::ops::Range;

use Layout::{RowMajor as N, Transposed as T};

/// The `f32` values of `t` as a tensor of another shape with the same count.
fn reshaped(t: &HostTensor, shape: Vec<usize>) -> Result<HostTensor> {
    HostTensor::new(t.dtype, shape, t.data.clone())
}

/// Columns `cols` of the `f32` matrix `m: [rows, n]`.
fn columns(m: &HostTensor, cols: std::ops::Range<usize>) -> Result<HostTensor> {
    let (rows, n) = (m.shape[0], m.shape[1]);
    let v = m.to_f32()?;
    let out: Vec<f32> = (0..rows)
        .flat_map(|r| v[r * n + cols.start..r * n + cols.end].to_vec())
        .collect();
    HostTensor::from_f32_as(DType::F32, vec![rows, cols.len()], &out)
}

/// Rows `rows` of the `f32` tensor `m: [n, ...]` (a vector when `m` is 1-D).
fn rows_of(m: &HostTensor, rows: std::ops::Range<usize>) -> Result<HostTensor> {
    let width: usize = m.shape[1..].iter().product();
    let v = m.to_f32()?;
    let mut shape = m.shape.clone();
    shape[0] = rows.len();
    HostTensor::from_f32_as(DType::F32, shape, &v[rows.start * width..rows.end * width])
}

/// Checks one layer (or shard) `(W: f32 [d_out, K], b: f32 [d_out])`; returns `(d_out, K)`.
fn layer(what: &str, w: &HostTensor, b: &HostTensor) -> Result<(usize, usize)> {
    let [d, k] = w.shape[..] else {
        return Err(Error::Invalid(format!(
            "adapter merge: {what} weight must be f32 [d, K], got {} {:?}",
            w.dtype, w.shape
        )));
    };
    if w.dtype != DType::F32 || b.dtype != DType::F32 || b.shape != [d] {
        return Err(Error::Invalid(format!(
            "adapter merge: {what} must be an f32 weight [d, K] and an f32 bias [d], got {} {:?} \
             and {} {:?}",
            w.dtype, w.shape, b.dtype, b.shape
        )));
    }
    Ok((d, k))
}

/// Elementwise `a + b` of two `f32` tensors of one shape, in `f32` (the simulated all-reduce).
fn add(a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
    let (x, y) = (a.to_f32()?, b.to_f32()?);
    let s: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    HostTensor::from_f32_as(DType::F32, a.shape.clone(), &s)
}

impl BottleneckAdapter {
    /// The merged layer `(W', b')` of the layer `(weight: f32 [d, K], bias: f32 [d])` followed by
    /// this adapter with `beta = 0` (see the module docs for the formulas and their order).
    ///
    /// # Errors
    /// [`Error::Invalid`] for an inconsistent adapter, or a weight or bias that is not `f32` of
    /// shape `[d, K]` / `[d]` for the adapter's `d`; any device error.
    pub fn merge_into(
        &self,
        dev: &dyn Device,
        weight: &HostTensor,
        bias: &HostTensor,
    ) -> Result<(HostTensor, HostTensor)> {
        let mut out = self.merge_sharded(dev, &[(weight.clone(), bias.clone())])?;
        out.pop()
            .ok_or_else(|| Error::Invalid("adapter merge: no shard".into()))
    }

    /// The shard-aware merge of a layer split by output rows into `shards` (`(W_s: f32 [d_s, K],
    /// b_s: f32 [d_s])` in row order, `sum d_s = d`): one all-reduce of the `r x K` partials
    /// `D_s W_s` (and of `D_s b_s`), then each shard's rows of `(W', b')` locally (see the
    /// module docs). Returns the merged shards in order.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an inconsistent adapter, no shards, a shard that is not an `f32`
    /// `[d_s, K]` weight with an `f32` `[d_s]` bias, shards of different `K`, or row counts that
    /// do not add up to the adapter's `d`; any device error.
    pub fn merge_sharded(
        &self,
        dev: &dyn Device,
        shards: &[(HostTensor, HostTensor)],
    ) -> Result<Vec<(HostTensor, HostTensor)>> {
        let (starts, _) = self.shard_spans(shards)?;
        // The all-reduce of the partials D_s W_s ([r, K]) and D_s b_s ([1, r]), in shard order.
        let mut dw: Option<HostTensor> = None;
        let mut db: Option<HostTensor> = None;
        for ((w, b), span) in shards.iter().zip(&starts) {
            let (p, q) = self.partials(dev, w, b, span.clone())?;
            dw = Some(match dw {
                Some(acc) => add(&acc, &p)?,
                None => p,
            });
            db = Some(match db {
                Some(acc) => add(&acc, &q)?,
                None => q,
            });
        }
        let (Some(dw), Some(db)) = (dw, db) else {
            return Err(Error::Invalid("adapter merge: no shard".into()));
        };
        shards
            .iter()
            .zip(&starts)
            .map(|((w, b), span)| self.merged_rows(dev, (&dw, &db), w, b, span.clone()))
            .collect()
    }

    /// Checks the adapter and `shards` (as [`BottleneckAdapter::merge_sharded`] takes them) and
    /// returns each shard's rows of the layer, and `K`.
    fn shard_spans(
        &self,
        shards: &[(HostTensor, HostTensor)],
    ) -> Result<(Vec<Range<usize>>, usize)> {
        let (d, _) = self.dims()?;
        let mut starts = Vec::with_capacity(shards.len());
        let (mut rows, mut k) = (0usize, None);
        for (s, (w, b)) in shards.iter().enumerate() {
            let (ds, ks) = layer(&format!("shard {s}"), w, b)?;
            if *k.get_or_insert(ks) != ks {
                return Err(Error::Invalid(format!(
                    "adapter merge: shard {s} has K = {ks}, shard 0 has K = {}",
                    k.unwrap_or(0)
                )));
            }
            starts.push(rows..rows + ds);
            rows += ds;
        }
        if shards.is_empty() || rows != d {
            return Err(Error::Invalid(format!(
                "adapter merge: the shards have {rows} output rows in all, the adapter has d = {d}"
            )));
        }
        Ok((starts, k.unwrap_or(0)))
    }

    /// One shard's partials of the all-reduce: `D_s W_s` (`[r, K]`) and `D_s b_s` (`[1, r]`),
    /// `D_s` the columns `span` of `D`.
    fn partials(
        &self,
        dev: &dyn Device,
        w: &HostTensor,
        b: &HostTensor,
        span: Range<usize>,
    ) -> Result<(HostTensor, HostTensor)> {
        let d_s = columns(&self.down_weight, span.clone())?;
        let p = gemm(dev, (&d_s, N), (w, T), None, None)?;
        let b_row = reshaped(b, vec![1, span.len()])?;
        let q = gemm(dev, (&b_row, N), (&d_s, N), None, None)?;
        Ok((p, q))
    }

    /// One shard's merged rows `span` from the all-reduced `(D W, D b)`:
    /// `W'_s = W_s + U_s (D W)` and `b'_s = (U_s t + b_u[span]) + b_s` with `t = D b + b_d`.
    fn merged_rows(
        &self,
        dev: &dyn Device,
        (dw, db): (&HostTensor, &HostTensor),
        w: &HostTensor,
        b: &HostTensor,
        span: Range<usize>,
    ) -> Result<(HostTensor, HostTensor)> {
        let (_, r) = self.dims()?;
        // t = D b + b_d, one f32 add per element (as the kernel's bias add).
        let t = add(db, &reshaped(&self.down_bias, vec![1, r])?)?;
        let u_s = rows_of(&self.up_weight, span.clone())?;
        let bu_s = rows_of(&self.up_bias, span.clone())?;
        let w2 = gemm(dev, (&u_s, N), (dw, T), None, Some(w))?;
        let b_row = reshaped(b, vec![1, span.len()])?;
        let b2 = gemm(dev, (&t, N), (&u_s, N), Some(&bu_s), Some(&b_row))?;
        Ok((w2, reshaped(&b2, vec![span.len()])?))
    }

    /// The merge of a column-parallel layer on real ranks, **bit-identical to the unsharded
    /// [`BottleneckAdapter::merge_into`]**: this rank holds the shard `(weight: f32 [d_s, K],
    /// bias: f32 [d_s])`, the ranks' shards being the layer's rows in rank order, and gets its
    /// rows of `(W', b')`. `D W` sums over all `d` rows in the unsharded order, so the layer's
    /// columns are all-gathered in chunks of at most 64 MiB of the whole layer (every rank
    /// computes `D W` chunk by chunk, then its own rows locally). It moves the whole weight to
    /// every rank once; [`BottleneckAdapter::merge_column_parallel_relaxed`] moves `r x K`
    /// floats per rank instead, with other bits. A collective call: every rank makes it.
    ///
    /// # Errors
    /// As [`BottleneckAdapter::merge_sharded`], checked across the ranks (row counts that do
    /// not add up to `d`, ranks with another `K`, `d` or `r`: the same error on every rank);
    /// the all-gather's errors.
    pub fn merge_column_parallel(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        weight: &HostTensor,
        bias: &HostTensor,
    ) -> Result<(HostTensor, HostTensor)> {
        self.merge_column_parallel_in_chunks(dev, comm, weight, bias, 64 << 20)
    }

    /// [`BottleneckAdapter::merge_column_parallel`] gathering at most `chunk_bytes` of the whole
    /// layer at a time (at least one column; every rank must pass the same value): less memory
    /// per gather, more gathers. The same bits for every `chunk_bytes`.
    ///
    /// # Errors
    /// As [`BottleneckAdapter::merge_column_parallel`].
    pub fn merge_column_parallel_in_chunks(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        weight: &HostTensor,
        bias: &HostTensor,
        chunk_bytes: usize,
    ) -> Result<(HostTensor, HostTensor)> {
        let (counts, span, k) = self.rank_rows(comm, weight, bias)?;
        let d: usize = counts.iter().sum();
        let r = self.dims()?.1;
        let most = counts.iter().copied().max().unwrap_or(0);
        // Every rank passes `most` rows per chunk (zero rows after its own).
        let chunk = (chunk_bytes / (4 * d.max(1))).clamp(1, k.max(1));
        let gathered_rows = |local: &HostTensor, cols: usize| -> Result<HostTensor> {
            let mut bytes = local.data.clone();
            bytes.resize(most * cols * 4, 0);
            let all = comm.all_gather(&bytes)?;
            let per = most * cols * 4;
            let whole: Vec<u8> = counts
                .iter()
                .enumerate()
                .flat_map(|(rank, n)| all[rank * per..rank * per + n * cols * 4].to_vec())
                .collect();
            HostTensor::new(DType::F32, vec![d, cols], whole)
        };
        let b_all = gathered_rows(&reshaped(bias, vec![span.len(), 1])?, 1)?;
        let b_all = reshaped(&b_all, vec![d])?;
        let mut dw = vec![0u8; r * k * 4];
        let mut db = None;
        let mut c0 = 0;
        loop {
            let c1 = (c0 + chunk).min(k);
            let w_chunk = gathered_rows(&columns(weight, c0..c1)?, c1 - c0)?;
            let (p, q) = agree(comm, self.partials(dev, &w_chunk, &b_all, 0..d))?;
            // Columns c0..c1 of D W.
            let width = (c1 - c0) * 4;
            for (i, row) in p.data.chunks_exact(width.max(1)).take(r).enumerate() {
                dw[(i * k + c0) * 4..(i * k + c0) * 4 + width].copy_from_slice(&row[..width]);
            }
            db.get_or_insert(q);
            c0 = c1;
            if c0 >= k {
                break;
            }
        }
        let dw = HostTensor::new(DType::F32, vec![r, k], dw)?;
        let db = db.ok_or_else(|| Error::Invalid("adapter merge: no chunk".into()))?;
        self.merged_rows(dev, (&dw, &db), weight, bias, span)
    }

    /// Checks this rank's adapter and shard on every rank (agreed on: a rank with a bad adapter
    /// or shard stops them all) and gathers the ranks' row counts: returns them, this rank's
    /// rows of the layer and `K`.
    fn rank_rows(
        &self,
        comm: &dyn Communicator,
        weight: &HostTensor,
        bias: &HostTensor,
    ) -> Result<(Vec<usize>, Range<usize>, usize)> {
        let (d, r) = agree(comm, self.dims())?;
        let (rows, k) = agree(
            comm,
            layer(&format!("rank {}'s shard", comm.rank()), weight, bias),
        )?;
        // Every rank's (rows, K, d, r): every rank checks them all alike, so that ranks that
        // disagree all return the error (none goes on into a gather the others skip).
        let mine: Vec<u8> = [rows, k, d, r]
            .iter()
            .flat_map(|v| (*v as u64).to_le_bytes())
            .collect();
        let all: Vec<[usize; 4]> = comm
            .all_gather(&mine)?
            .chunks_exact(32)
            .map(|c| {
                let v = |i: usize| {
                    u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().expect("8 bytes")) as usize
                };
                [v(0), v(1), v(2), v(3)]
            })
            .collect();
        let counts: Vec<usize> = all.iter().map(|a| a[0]).collect();
        if let Some((other, a)) = all.iter().enumerate().find(|(_, a)| a[1..] != all[0][1..]) {
            return Err(Error::Invalid(format!(
                "adapter merge: rank {other} has K = {}, d = {}, r = {}; rank 0 has K = {}, \
                 d = {}, r = {} (every rank merges the same adapter into shards of one layer)",
                a[1], a[2], a[3], all[0][1], all[0][2], all[0][3]
            )));
        }
        let start: usize = counts[..comm.rank()].iter().sum();
        if counts.iter().sum::<usize>() != d {
            return Err(Error::Invalid(format!(
                "adapter merge: the ranks' shards have {counts:?} output rows, {} in all; the \
                 adapter has d = {d}",
                counts.iter().sum::<usize>()
            )));
        }
        Ok((counts, start..start + rows, k))
    }

    /// **Relaxed, not bit-identical to the unsharded merge** (within rounding):
    /// [`BottleneckAdapter::merge_sharded`] on real ranks. This rank holds the column-parallel
    /// shard `(weight: f32 [d_s, K], bias: f32 [d_s])`, the ranks' shards being the layer's rows
    /// in rank order. One all-gather of the partials (`r x K + r` floats per rank), summed on
    /// every rank in rank order, then this rank's merged rows: bit-identical to
    /// `merge_sharded` over the same shards. A collective call: every rank makes it.
    ///
    /// # Errors
    /// As [`BottleneckAdapter::merge_column_parallel`].
    pub fn merge_column_parallel_relaxed(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        weight: &HostTensor,
        bias: &HostTensor,
    ) -> Result<(HostTensor, HostTensor)> {
        let (_, span, k) = self.rank_rows(comm, weight, bias)?;
        let r = self.dims()?.1;
        let (p, q) = agree(comm, self.partials(dev, weight, bias, span.clone()))?;
        let mut local = p.data.clone();
        local.extend_from_slice(&q.data);
        let gathered = comm.all_gather(&local)?;
        let part = |rank: usize| -> Result<(HostTensor, HostTensor)> {
            let bytes = &gathered[rank * local.len()..(rank + 1) * local.len()];
            let (pw, pb) = bytes.split_at(p.data.len());
            Ok((
                HostTensor::new(DType::F32, vec![r, k], pw.to_vec())?,
                HostTensor::new(DType::F32, vec![1, r], pb.to_vec())?,
            ))
        };
        let (mut dw, mut db) = part(0)?;
        for rank in 1..comm.size() {
            let (pw, pb) = part(rank)?;
            dw = add(&dw, &pw)?;
            db = add(&db, &pb)?;
        }
        self.merged_rows(dev, (&dw, &db), weight, bias, span)
    }
}

#[cfg(feature = "stablehlo")]
impl BottleneckAdapter {
    /// The exact merge of a column-parallel layer on the XLA SPMD engine, **bit-identical to
    /// the unsharded [`BottleneckAdapter::merge_into`]** for inputs without subnormals (XLA's CPU
    /// code flushes them): `shards[r]` is rank `r`'s shard `(weight: f32 [d_s, K], bias: f32
    /// [d_s])`, in row order. `D W` is split by columns instead: device `r` computes columns
    /// `r K / D ..` of it from those columns of the whole layer (a GEMM's columns do not depend
    /// on the others), and one all-gather gives every device `D W`; `D b` is computed alike on
    /// every device. The merged rows follow on `dev`. Returns every rank's merged rows.
    ///
    /// # Errors
    /// As [`BottleneckAdapter::merge_sharded`]; [`Error::Invalid`] when there is not one shard
    /// per rank or `D` does not divide `K`; the engine's errors.
    pub fn merge_column_parallel_xla(
        &self,
        dev: &dyn Device,
        engine: &qforge_runtime::xla_spmd::XlaSpmd,
        shards: &[(HostTensor, HostTensor)],
    ) -> Result<Vec<(HostTensor, HostTensor)>> {
        use qforge_runtime::xla_spmd::Combine;
        const OP: &str = "exact adapter merge (xla)";
        let ranks = engine.ranks();
        if shards.len() != ranks {
            return Err(Error::Invalid(format!(
                "{OP}: {} shards on {ranks} ranks (one shard per rank)",
                shards.len()
            )));
        }
        let (spans, k) = self.shard_spans(shards)?;
        if k % ranks != 0 {
            return Err(Error::Invalid(format!(
                "{OP}: {ranks} ranks do not divide K = {k} (each device computes K / D columns \
                 of D W)"
            )));
        }
        let (d, r) = self.dims()?;
        // The whole layer, from the shards in row order.
        let w_all: Vec<u8> = shards.iter().flat_map(|(w, _)| w.data.clone()).collect();
        let b_all: Vec<u8> = shards.iter().flat_map(|(_, b)| b.data.clone()).collect();
        let w_all = HostTensor::new(DType::F32, vec![d, k], w_all)?;
        let b_all = HostTensor::new(DType::F32, vec![d], b_all)?;
        let c = k / ranks;
        let recorded = crate::spmd_capture::record(OP, engine, Some(2), |rank, capture, _| {
            let cols = columns(&w_all, rank * c..(rank + 1) * c)?;
            self.partials(capture, &cols, &b_all, 0..d)
        })?;
        let (dw, db) = match &recorded.launches[..] {
            [p_all, q_all] => {
                let dw = engine
                    .run(p_all, &[Combine::GatherLastDim { rows: r }])?
                    .remove(0);
                // Every rank computed the same `D b`: its copies, concatenated.
                let db = engine.run(q_all, &[Combine::Local])?.remove(0);
                let one = db.len() / ranks;
                (
                    HostTensor::new(DType::F32, vec![r, k], dw)?,
                    HostTensor::new(DType::F32, vec![1, r], db[..one].to_vec())?,
                )
            }
            [] => self.partials(dev, &w_all, &b_all, 0..d)?,
            other => {
                return Err(Error::Invalid(format!(
                    "{OP}: {} recorded launches per rank, 2 expected",
                    other.len()
                )))
            }
        };
        shards
            .iter()
            .zip(spans)
            .map(|((w, b), span)| self.merged_rows(dev, (&dw, &db), w, b, span))
            .collect()
    }

    /// **Relaxed, not bit-identical to the unsharded merge** (within rounding):
    /// [`BottleneckAdapter::merge_column_parallel_relaxed`] on the XLA SPMD engine: `shards[r]` is rank
    /// `r`'s column-parallel shard `(weight: f32 [d_s, K], bias: f32 [d_s])` (equal row counts:
    /// one program runs on every rank). Each rank's partials (`r x K` and `r` floats) are
    /// computed on XLA device `r`, all-gathered and summed in rank order in the program (one
    /// program per partial); the merged rows follow on `dev`. Returns every rank's merged rows,
    /// bit-identical to [`BottleneckAdapter::merge_sharded`] over the same shards for inputs
    /// without subnormals (XLA's CPU code flushes them).
    ///
    /// # Errors
    /// As [`BottleneckAdapter::merge_column_parallel_relaxed`]; [`Error::Invalid`] when there is not
    /// one shard per rank or the shards' row counts or `K` differ; the engine's errors.
    pub fn merge_column_parallel_relaxed_xla(
        &self,
        dev: &dyn Device,
        engine: &qforge_runtime::xla_spmd::XlaSpmd,
        shards: &[(HostTensor, HostTensor)],
    ) -> Result<Vec<(HostTensor, HostTensor)>> {
        use qforge_runtime::xla_spmd::Combine;
        const OP: &str = "adapter merge (xla)";
        if shards.len() != engine.ranks() {
            return Err(Error::Invalid(format!(
                "{OP}: {} shards on {} ranks (one shard per rank)",
                shards.len(),
                engine.ranks()
            )));
        }
        let (d, _) = self.dims()?;
        let mut spans = Vec::new();
        let mut sizes = Vec::new();
        for (rank, (w, b)) in shards.iter().enumerate() {
            let (rows, k) = layer(&format!("rank {rank}'s shard"), w, b)?;
            let start = spans.last().map_or(0, |s: &Range<usize>| s.end);
            spans.push(start..start + rows);
            sizes.push((rows, k));
        }
        if sizes.iter().any(|s| *s != sizes[0]) {
            return Err(Error::Invalid(format!(
                "{OP}: the shards' (rows, K) are {sizes:?}: one program runs on every rank, so \
                 every shard must have the same rows and K"
            )));
        }
        let total = spans.last().map_or(0, |s| s.end);
        if total != d {
            return Err(Error::Invalid(format!(
                "{OP}: the shards have {total} output rows in all; the adapter has d = {d}"
            )));
        }
        let recorded = crate::spmd_capture::record(OP, engine, Some(2), |rank, capture, _| {
            let (w, b) = &shards[rank];
            self.partials(capture, w, b, spans[rank].clone())
        })?;
        // The host results give the partials' shapes only (the launches were recorded).
        let Some((p, q)) = recorded.results.first() else {
            return Err(Error::Invalid(format!("{OP}: no shards")));
        };
        let (dw, db) = match &recorded.launches[..] {
            [p_all, q_all] => {
                let sum = |launches| -> Result<Vec<u8>> {
                    Ok(engine
                        .run(launches, &[Combine::SumF32InRankOrder])?
                        .remove(0))
                };
                (
                    HostTensor::new(DType::F32, p.shape.clone(), sum(p_all)?)?,
                    HostTensor::new(DType::F32, q.shape.clone(), sum(q_all)?)?,
                )
            }
            [] if p.data.is_empty() && q.data.is_empty() => (p.clone(), q.clone()),
            other => {
                return Err(Error::Invalid(format!(
                    "{OP}: {} recorded launches per rank for non-empty partials",
                    other.len()
                )))
            }
        };
        shards
            .iter()
            .zip(spans)
            .map(|((w, b), span)| self.merged_rows(dev, (&dw, &db), w, b, span))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qforge_runtime::{InterpreterDevice, SingleRank};

    #[test]
    fn the_exact_merge_in_column_chunks_is_the_unsharded_merge() {
        let (d, k) = (10, 24);
        let mut a = BottleneckAdapter::new(d, 4, 7).unwrap();
        let vals = |n: usize, s: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.731 + s).sin() * 3.0).collect()
        };
        a.up_weight = HostTensor::from_f32(vec![d, 4], &vals(d * 4, 0.9)).unwrap();
        a.up_bias = HostTensor::from_f32(vec![d], &vals(d, 1.1)).unwrap();
        let w = HostTensor::from_f32(vec![d, k], &vals(d * k, 3.3)).unwrap();
        let b = HostTensor::from_f32(vec![d], &vals(d, 4.4)).unwrap();
        let dev = InterpreterDevice;
        let whole = a.merge_into(&dev, &w, &b).unwrap();
        // 5 columns (200 bytes of the layer) at a time: chunks of 5, 5, 5, 5 and 4 columns.
        for bytes in [1, 200, 64 << 20] {
            let got = a
                .merge_column_parallel_in_chunks(&dev, &SingleRank, &w, &b, bytes)
                .unwrap();
            assert!(got == whole, "chunks of {bytes} bytes");
        }
    }
}
