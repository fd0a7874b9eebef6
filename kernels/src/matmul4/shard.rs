//! Column-parallel shards of a 4-bit linear (Megatron's `ColumnParallelLinear`), bit-identical
//! to the unsharded layer (`docs/distributed.md`).
//!
//! A weight `[N, K]` over `D` shards: shard `r` owns the output rows `r N/D .. (r+1) N/D`. Its
//! bytes are the corresponding bytes of the unsharded quantization, nothing requantized: the
//! packed codes of its rows, the absmax of their blocks and, for a double-quantized absmax, the
//! 8-bit codes of those blocks and the nested absmax of their nested blocks, with the global
//! `offset` and nested code replicated. So every shard boundary must fall on a quantization
//! block (and, double-quantized, on a 256-block nested block) of the flattened weight, and a
//! checkpoint can be resharded `D -> D'` by concatenating and splitting bytes.
//!
//! Forward needs no communication in the sum: each output `y[m, n]` is the same `K` reduction
//! (`K_ORDER`) in the shard as in the whole layer, so the shards' columns of `y`, gathered, are
//! the unsharded `y` bit for bit.

use std::ops::Range;

use qforge_runtime::{agree, Communicator, Device, Error, HostTensor, Result};

use super::chain::{activations, continued_chains, tree, ChainOf, ChainWeight};
use super::host::{weight_dtype, Linear4bit};
use crate::ops::{decompress_absmax, Absmax4, QuantState4};
use crate::NESTED_BLOCKSIZE;

/// The output rows of each of `shards` column-parallel shards of a 4-bit weight `[N, K]`
/// quantized with `state`: `N / shards` rows each, in rank order.
///
/// # Errors
/// [`Error::Invalid`] naming the shape, the shard count and the offending boundary when
/// `shards` is 0 or does not divide `N`, or a boundary (row `n0`, flattened element `n0 K`) is
/// not on a quantization block (`blocksize`), not on a nested block (`256` blocks, for a
/// double-quantized absmax), or `state` is not a 2-D weight.
pub fn column_rows(state: &QuantState4, shards: usize) -> Result<Vec<Range<usize>>> {
    let [n, k] = state.shape[..] else {
        return Err(Error::Invalid(format!(
            "column-parallel shards: the weight must be 2-D [N, K], got shape {:?}",
            state.shape
        )));
    };
    if shards == 0 || n % shards != 0 {
        return Err(Error::Invalid(format!(
            "column-parallel shards: {shards} shards do not divide the weight's N = {n} output \
             rows (shape [{n}, {k}])"
        )));
    }
    let rows = n / shards;
    let bs = state.blocksize;
    let nested = matches!(state.absmax, Absmax4::Nested { .. });
    for n0 in (1..shards).map(|r| r * rows) {
        let e0 = n0 * k;
        let what = if e0 % bs != 0 {
            Some(format!("a {bs}-element quantization block"))
        } else if nested && !(e0 / bs).is_multiple_of(NESTED_BLOCKSIZE as usize) {
            Some(format!(
                "a nested block ({NESTED_BLOCKSIZE} blocks of {bs} elements: the double-quantized \
                 absmax)"
            ))
        } else {
            None
        };
        if let Some(what) = what {
            return Err(Error::Invalid(format!(
                "column-parallel shards: {shards} shards of the weight [{n}, {k}] put a boundary \
                 at row {n0} (flattened element {e0}), which is not on {what}; choose a shard \
                 count whose boundaries fall on blocks"
            )));
        }
    }
    Ok((0..shards).map(|r| r * rows..(r + 1) * rows).collect())
}

/// The slice `range` of a per-row tensor (a bias `[N]`).
fn bias_rows(bias: &HostTensor, rows: Range<usize>) -> Result<HostTensor> {
    let size = bias.dtype.size_bytes();
    let bytes = bias
        .data
        .get(rows.start * size..rows.end * size)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "column-parallel shards: the bias {:?} does not cover rows {rows:?}",
                bias.shape
            ))
        })?;
    HostTensor::new(bias.dtype, vec![rows.len()], bytes.to_vec())
}

impl Linear4bit {
    /// Shard `rank` of `shards` column-parallel shards ([`column_rows`]): the rows it owns,
    /// with the corresponding bytes of the packed codes, absmax and bias.
    ///
    /// # Errors
    /// As [`column_rows`], plus `rank >= shards` or buffers that do not match the state.
    pub fn column_shard(&self, rank: usize, shards: usize) -> Result<Linear4bit> {
        let all = column_rows(&self.state, shards)?;
        let rows = all.get(rank).cloned().ok_or_else(|| {
            Error::Invalid(format!(
                "column-parallel shards: rank {rank} is not one of {shards} shards"
            ))
        })?;
        let (k, bs) = (self.in_features(), self.state.blocksize);
        let elems = rows.start * k..rows.end * k;
        let blocks = elems.start / bs..elems.end.div_ceil(bs);
        let short = |what: &str| {
            Error::Invalid(format!(
                "column-parallel shards: the weight's {what} is shorter than its shape {:?} \
                 needs",
                self.state.shape
            ))
        };
        let packed = self
            .packed
            .get(elems.start / 2..elems.end.div_ceil(2))
            .ok_or_else(|| short("packed codes"))?
            .to_vec();
        let absmax = match &self.state.absmax {
            Absmax4::Plain(a) => Absmax4::Plain(
                a.get(blocks.clone())
                    .ok_or_else(|| short("absmax"))?
                    .to_vec(),
            ),
            Absmax4::Nested {
                qabsmax,
                nested_absmax,
                nested_code,
                offset,
                nested_blocksize,
            } => {
                let nb = *nested_blocksize;
                let nested = blocks.start / nb..blocks.end.div_ceil(nb);
                Absmax4::Nested {
                    qabsmax: qabsmax
                        .get(blocks)
                        .ok_or_else(|| short("qabsmax"))?
                        .to_vec(),
                    nested_absmax: nested_absmax
                        .get(nested)
                        .ok_or_else(|| short("nested absmax"))?
                        .to_vec(),
                    nested_code: nested_code.clone(),
                    offset: *offset,
                    nested_blocksize: nb,
                }
            }
        };
        let bias = self
            .bias
            .as_ref()
            .map(|b| bias_rows(b, rows.clone()))
            .transpose()?;
        Ok(Linear4bit {
            packed,
            state: QuantState4 {
                shape: vec![rows.len(), k],
                absmax,
                ..self.state.clone()
            },
            bias,
        })
    }

    /// The unsharded layer from its column-parallel shards in rank order (the inverse of
    /// [`Linear4bit::column_shard`]): bytes concatenated, so resharding `D -> D'` is
    /// `from_column_shards` then `column_shard`.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `shards` is empty, or the shards do not come from one
    /// quantization: different `K`, quant type, blocksize, dtype, absmax kind, double-quant
    /// offset or nested code, bias presence or dtype, a shard whose rows end inside a block,
    /// or row counts that differ.
    pub fn from_column_shards(shards: &[Linear4bit]) -> Result<Linear4bit> {
        let first = shards.first().ok_or_else(|| {
            Error::Invalid("column-parallel shards: no shards to join".to_string())
        })?;
        let mismatch = |r: usize, what: &str| {
            Error::Invalid(format!(
                "column-parallel shards: shard {r} differs from shard 0 in its {what}; the \
                 shards must come from one quantization"
            ))
        };
        let (k, bs) = (first.in_features(), first.state.blocksize);
        let rows = first.out_features();
        if shards.len() > 1 && ((rows * k) % bs != 0 || !(rows * k).is_multiple_of(2)) {
            return Err(Error::Invalid(format!(
                "column-parallel shards: a shard of {rows} rows x {k} ends inside a \
                 {bs}-element block; it cannot be joined"
            )));
        }
        let mut joined = first.clone();
        for (r, s) in shards.iter().enumerate().skip(1) {
            let st = &s.state;
            if st.shape != first.state.shape {
                return Err(mismatch(r, &format!("shape ({:?})", st.shape)));
            }
            if (st.quant_type, st.blocksize, st.dtype)
                != (first.state.quant_type, bs, first.state.dtype)
            {
                return Err(mismatch(r, "quant_type, blocksize or dtype"));
            }
            joined.packed.extend_from_slice(&s.packed);
            match (&mut joined.state.absmax, &st.absmax) {
                (Absmax4::Plain(a), Absmax4::Plain(b)) => a.extend_from_slice(b),
                (
                    Absmax4::Nested {
                        qabsmax,
                        nested_absmax,
                        nested_code,
                        offset,
                        nested_blocksize,
                    },
                    Absmax4::Nested {
                        qabsmax: q2,
                        nested_absmax: n2,
                        nested_code: c2,
                        offset: o2,
                        nested_blocksize: b2,
                    },
                ) => {
                    if offset.to_bits() != o2.to_bits()
                        || nested_code != c2
                        || nested_blocksize != b2
                    {
                        return Err(mismatch(r, "double-quant offset or nested code"));
                    }
                    if qabsmax.len() % *nested_blocksize != 0 {
                        return Err(Error::Invalid(format!(
                            "column-parallel shards: shard {} ends inside a nested block; it \
                             cannot be joined",
                            r - 1
                        )));
                    }
                    qabsmax.extend_from_slice(q2);
                    nested_absmax.extend_from_slice(n2);
                }
                _ => return Err(mismatch(r, "absmax kind (plain or double-quantized)")),
            }
            match (&mut joined.bias, &s.bias) {
                (Some(a), Some(b)) if a.dtype == b.dtype => {
                    a.data.extend_from_slice(&b.data);
                    a.shape[0] += b.shape[0];
                }
                (None, None) => {}
                _ => return Err(mismatch(r, "bias (presence or dtype)")),
            }
        }
        joined.state.shape = vec![rows * shards.len(), k];
        Ok(joined)
    }

    /// The column-parallel forward of this shard on `comm`'s rank: `y_r = x @ dequant(W_r).T
    /// (+ b_r)` locally ([`Linear4bit::forward`]), then one all-gather of the shards' outputs,
    /// giving every rank the whole `y` (`[..., N]`, `N = shards * rows`), equal bit for bit to
    /// the unsharded layer's forward. Every rank passes the same `x` (`[..., K]`), and `self`
    /// must be shard `comm.rank()` of `comm.size()` ([`Linear4bit::column_shard`]): a shard of
    /// another count gathers equal byte counts and so cannot be told apart here.
    ///
    /// # Errors
    /// As [`Linear4bit::forward`]; the all-gather's errors (ranks whose shards or inputs differ
    /// in shape, so that their outputs differ in size).
    pub fn forward_column_parallel(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        x: &HostTensor,
    ) -> Result<HostTensor> {
        gather_last_dim(comm, &agree(comm, self.forward(dev, x))?)
    }
}

impl Linear4bit {
    /// The exact column-parallel input gradient of this shard on `comm`'s rank, `dy_r` being
    /// this rank's columns of `dY` (`[..., N / D]`, f32, f16 or bf16): equal bit for bit to the
    /// unsharded `dX = dY @ dequant(W)` (`[..., K]`) on every rank. The sum over `N` crosses the
    /// shards: rank `r` continues `DX_ORDER`'s running sums from rank `r - 1` (`chain.rs`), so
    /// the ranks compute one after another (`D` all-gathers of `M * K` floats per rank), and
    /// every rank rounds the last sums to `dY`'s dtype.
    /// `self` is shard `comm.rank()` of `comm.size()` ([`Linear4bit::column_shard`]).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the shard's row count is not a multiple of `DX_ORDER`'s chains
    /// (they would not continue; with its one chain every count is), `dy_r` is not a float
    /// tensor whose last dim is the shard's rows, a 16-bit weight meets activations of another
    /// 16-bit dtype, or a count exceeds `u32`; device errors (decoding a nested absmax, the
    /// chains kernel); the all-gathers' errors.
    pub fn backward_input_column_parallel(
        &self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        dy_r: &HostTensor,
    ) -> Result<HostTensor> {
        const OP: &str = "column-parallel dX";
        let (rows, k) = (self.out_features(), self.in_features());
        let of = ChainOf::InputGradient;
        let dtype = dy_r.dtype;
        // Checked on every rank and agreed on, so that a rank with bad input stops them all.
        let checked = (|| {
            if !rows.is_multiple_of(of.chains()) {
                return Err(Error::Invalid(format!(
                    "{OP}: the shard has {rows} rows, not a multiple of {}: DX_ORDER's chains \
                     would not continue across shards",
                    of.chains()
                )));
            }
            let (dy, m) = activations(OP, "dy_r (this rank's columns of dY)", dy_r, rows)?;
            let weight_dtype = weight_dtype(OP, self.state.dtype, dtype)?;
            let absmax = decompress_absmax(dev, &self.state.absmax)?;
            Ok((dy, m, weight_dtype, absmax))
        })();
        let (dy, m, weight_dtype, absmax) = agree(comm, checked)?;
        let weight = ChainWeight {
            packed: &self.packed,
            absmax: &absmax,
            quant_type: self.state.quant_type,
            blocksize: self.state.blocksize,
            weight_dtype,
        };
        agree(comm, weight.check(OP, rows, k))?;
        let chains = continued_chains(dev, comm, of, &weight, &dy, (m, k, rows))?;
        self.dx_from_chains(chains, dy_r)
    }

    /// The end of the exact column-parallel dX: the last rank's `DX_ORDER` chains (`M * K`
    /// floats per chain) combined by the halving tree (none for one chain), rounded to
    /// `dy_r`'s dtype, shaped `[..., K]`.
    pub(crate) fn dx_from_chains(
        &self,
        mut chains: Vec<f32>,
        dy_r: &HostTensor,
    ) -> Result<HostTensor> {
        let dx = tree(&mut chains, ChainOf::InputGradient.chains());
        let mut shape = dy_r.shape.clone();
        if let Some(last) = shape.last_mut() {
            *last = self.in_features();
        }
        HostTensor::from_f32_as(dy_r.dtype, shape, &dx)
    }
}

/// Every rank's `local` (`[..., c]`, the same shape on every rank) gathered along the last
/// dimension in rank order: `[..., size * c]`.
///
/// # Errors
/// The all-gather's errors.
pub(crate) fn gather_last_dim(comm: &dyn Communicator, local: &HostTensor) -> Result<HostTensor> {
    let gathered = comm.all_gather(&local.data)?;
    let row = local.shape.last().copied().unwrap_or(1) * local.dtype.size_bytes();
    let per_rank = local.data.len();
    let mut y = Vec::with_capacity(gathered.len());
    for m in 0..per_rank.checked_div(row).unwrap_or(0) {
        for r in 0..comm.size() {
            let at = r * per_rank + m * row;
            y.extend_from_slice(&gathered[at..at + row]);
        }
    }
    let mut shape = local.shape.clone();
    if let Some(last) = shape.last_mut() {
        *last *= comm.size();
    }
    HostTensor::new(local.dtype, shape, y)
}
