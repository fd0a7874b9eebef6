//! The exact sums across tensor-parallel shards: the order's partial chains continued from shard
//! to shard (`docs/distributed.md`, option 1 of "The order question"): the row-parallel forward
//! (`K_ORDER`'s 16 chains over `K`) and the column-parallel input gradient (`DX_ORDER`'s one
//! chain over `N`).
//!
//! [`K_ORDER`] (`Strided(16)`) fuses element `k` into partial `k % 16` in increasing `k`, then
//! combines the 16 partials by the halving tree. A row-parallel shard owns a contiguous range of
//! `K` starting at a multiple of 16 (a multiple of the blocksize), so its elements continue the
//! same 16 chains. The kernel here computes, for every output, the 16 chains over the shard's
//! columns **starting from given values**: chain `j` is a `Sequential` accumulate whose element
//! 0 is `(start_j, 1.0)` (`fma(start_j, 1.0, -0.0) == start_j` for every value, signed zeros
//! and NaN included) and whose element `t + 1` is column `16 t + j`. Rank 0 starts from `-0.0`
//! (the unsharded partials' start), each next rank from the previous rank's chains, and the
//! last rank's chains, combined by the halving tree in `f32`, plus the bias, are the unsharded
//! forward's sums bit for bit. The ranks run one after another: the memory is sharded, the
//! compute is serial.

use qforge_ir::{Access, Arg, DType, Dim, Kernel, KernelBuilder, ReduceOrder, Scalar, ScalarType};
use qforge_runtime::{Communicator, Device, Error, HostTensor, Result};

use crate::QuantType;

/// Which product the chains are of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainOf {
    /// `y = x @ dequant(W).T`: outputs `(row, n)`, reduced over the shard's `k` in
    /// [`super::K_ORDER`]'s 16 chains.
    Forward,
    /// `dX = dY @ dequant(W)`: outputs `(row, k)`, reduced over the shard's `n` in
    /// [`super::DX_ORDER`]'s one chain.
    InputGradient,
}

impl ChainOf {
    /// The number of partial chains: the order's ways.
    pub(crate) const fn chains(self) -> usize {
        match self {
            ChainOf::Forward => super::K_ORDER.ways() as usize,
            ChainOf::InputGradient => super::DX_ORDER.ways() as usize,
        }
    }
}

/// Builds `matmul_4bit_chains[_dx]_{qt}_bs{B}_w{weight dtype}`: `(m, outs, red, n_items: u32,
/// n_packed, n_blocks: u32, act: f32[m, red] read, packed: u8[n_packed] read, absmax:
/// f32[n_blocks] read, start: f32[m, outs, C] read, chains: f32[m, outs, C] write)`, grid
/// `n_items = m * outs`, `C` = [`ChainOf::chains`]. Work item `(r, o)` writes chain `j` of
/// output `(r, o)`: `start[r, o, j]` continued by `fma` with `act[r, C t + j] * w(C t + j)` for
/// `t` in `0..red / C` (`red` a multiple of `C`), where `w(i)` is the decoded weight of element
/// `o * red + i` (forward: `W` is `[outs, red]`) or `i * outs + o` (input gradient: `W` is
/// `[red, outs]`): `code[nibble] * absmax[e / blocksize]` rounded to `weight_dtype`, the plain
/// (or host-decoded) absmax.
pub(crate) fn chain_kernel(
    of: ChainOf,
    qt: QuantType,
    blocksize: u32,
    weight_dtype: DType,
) -> Kernel {
    let c = of.chains() as u32;
    let dx = if of == ChainOf::InputGradient {
        "_dx"
    } else {
        ""
    };
    let name = format!(
        "matmul_4bit_chains{dx}_{}_bs{blocksize}_w{weight_dtype}",
        qt.name()
    );
    let mut b = KernelBuilder::new(&name);
    let [m, outs, red, n_items, n_packed, n_blocks] =
        ["m", "outs", "red", "n_items", "n_packed", "n_blocks"]
            .map(|p| b.scalar_param(p, ScalarType::U32));
    let chains = Dim::Const(c);
    let act = b.buffer_param(
        "act",
        DType::F32,
        &[Dim::Param(m), Dim::Param(red)],
        Access::Read,
    );
    let packed = b.buffer_param("packed", DType::U8, &[Dim::Param(n_packed)], Access::Read);
    let absmax = b.buffer_param("absmax", DType::F32, &[Dim::Param(n_blocks)], Access::Read);
    let start = b.buffer_param(
        "start",
        DType::F32,
        &[Dim::Param(m), Dim::Param(outs), chains],
        Access::Read,
    );
    let out = b.buffer_param(
        "chains",
        DType::F32,
        &[Dim::Param(m), Dim::Param(outs), chains],
        Access::Write,
    );
    b.set_grid(Dim::Param(n_items));
    let code = b.table_f32("code", &qt.dequant_table());
    let item = b.work_item();
    let (ov, rv) = (b.param(outs), b.param(red));
    let row = b.div(item, ov);
    let o = b.rem(item, ov);
    let act_row = b.mul(row, rv);
    let [zero, one, two, fifteen, cv] = [0, 1, 2, 15, c].map(|v| b.const_u32(v));
    let f_one = b.const_f32(1.0);
    let chain_len = b.div(rv, cv);
    let len = b.add(chain_len, one);
    let shift = b.const_u32(blocksize.trailing_zeros());
    for j in 0..c {
        let acc = b.var(&format!("chain{j}"), ScalarType::F32);
        let jv = b.const_u32(j);
        let slot = b.mul(item, cv);
        let slot = b.add(slot, jv);
        b.accumulate(len, ReduceOrder::Sequential, &[acc], |b, i| {
            let first = b.cmp(qforge_ir::CmpOp::Eq, i, zero);
            let s = b.load(start, slot);
            // Element t + 1 is reduction index C t + j (element 0 reads index j, unused).
            let t = b.max(i, one);
            let t = b.sub(t, one);
            let tc = b.mul(t, cv);
            let idx = b.add(tc, jv);
            let aa = b.add(act_row, idx);
            let av = b.load(act, aa);
            let e = match of {
                ChainOf::Forward => {
                    let base = b.mul(o, rv);
                    b.add(base, idx)
                }
                ChainOf::InputGradient => {
                    let base = b.mul(idx, ov);
                    b.add(base, o)
                }
            };
            let byte_at = b.shr(e, one);
            let byte = b.load(packed, byte_at);
            // Even elements sit in the high nibble.
            let odd = b.and(e, one);
            let flip = b.binary(qforge_ir::BinaryOp::Xor, odd, one);
            let sh = b.shl(flip, two);
            let nib = b.shr(byte, sh);
            let nib = b.and(nib, fifteen);
            let cd = b.lookup(code, nib);
            let block = b.shr(e, shift);
            let a = b.load(absmax, block);
            let w = b.mul(cd, a);
            let w = qforge_ir::routines::round::round_to(b, w, weight_dtype);
            let fa = b.select(first, s, av);
            let fb = b.select(first, f_one, w);
            vec![(fa, fb)]
        });
        let v = b.read_var(acc);
        b.store(out, slot, v);
    }
    b.finish()
}

/// A 4-bit weight as the chains kernel reads it: packed codes and one `f32` absmax per block.
pub(crate) struct ChainWeight<'a> {
    pub packed: &'a [u8],
    pub absmax: &'a [f32],
    pub quant_type: QuantType,
    pub blocksize: usize,
    pub weight_dtype: DType,
}

impl ChainWeight<'_> {
    /// Checks the weight as `[rows, cols]` (row-major, bitsandbytes' packing) against its
    /// buffers and blocksize.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `op` for an empty shape, a blocksize outside 32..=4096 (powers
    /// of two), or packed codes / absmax of the wrong length.
    pub(crate) fn check(&self, op: &str, rows: usize, cols: usize) -> Result<()> {
        let elems = rows * cols;
        let bad = |what: String| Err(Error::Invalid(format!("{op}: {what}")));
        if elems == 0 {
            return bad(format!("the weight [{rows}, {cols}] is empty"));
        }
        if !u32::try_from(self.blocksize).is_ok_and(|b| crate::BLOCKSIZES_4BIT.contains(&b)) {
            return bad(format!("unsupported blocksize {}", self.blocksize));
        }
        if self.packed.len() != elems.div_ceil(2)
            || self.absmax.len() != elems.div_ceil(self.blocksize)
        {
            return bad(format!(
                "the weight [{rows}, {cols}] needs {} packed bytes and {} absmax, got {} and {}",
                elems.div_ceil(2),
                elems.div_ceil(self.blocksize),
                self.packed.len(),
                self.absmax.len()
            ));
        }
        Ok(())
    }
}

/// Every output's chains after the last rank: rank 0 starts them at `-0.0` and each rank
/// continues them over its part of the reduction (`act: f32 [m, red]`, its weight `w`), one
/// after another. Each of the `comm.size()` all-gathers carries every rank's status byte and
/// `m * outs * C` floats (the computing rank's chains, zeros from the others), so a rank whose
/// step fails (a device error) stops every rank with an error instead of leaving them waiting.
/// Returns the chains on every rank (`[m, outs, C]`), to be combined by the order's halving
/// tree ([`tree`]). The caller has checked the shapes on every rank (through
/// `qforge_runtime::agree`).
///
/// # Errors
/// [`Error::Invalid`] when an index (`m * outs * C`, `m * red`) exceeds `u32`, or a rank's
/// step failed (naming it); device errors; the all-gathers' errors.
pub(crate) fn continued_chains(
    dev: &dyn Device,
    comm: &dyn Communicator,
    of: ChainOf,
    w: &ChainWeight<'_>,
    act: &[f32],
    (m, outs, red): (usize, usize, usize),
) -> Result<Vec<f32>> {
    let count = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| Error::Invalid(format!("chained sum: {what} {v} exceeds u32")))
    };
    let len = m * outs * of.chains();
    // Every index the kernel forms fits in u32 (the same on every rank: shapes were agreed).
    let scalars = [
        count(m, "M")?,
        count(outs, "outputs per row")?,
        count(red, "reduction length")?,
        count(m * outs, "outputs")?,
        count(w.packed.len(), "packed bytes")?,
        count(w.absmax.len(), "blocks")?,
    ];
    count(len, "chain values")?;
    count(m * red, "activation elements")?;
    // The weight element index `o * red + idx` (or `idx * outs + o`) reaches `outs * red - 1`.
    count(outs * red, "weight elements")?;
    let kernel = chain_kernel(
        of,
        w.quant_type,
        count(w.blocksize, "blocksize")?,
        w.weight_dtype,
    );
    let mut start = vec![-0.0f32; len];
    for step in 0..comm.size() {
        let mut mine = vec![0u8; 1 + len * 4];
        mine[0] = 1;
        let mut failed = None;
        if step == comm.rank() && len > 0 {
            let mut args: Vec<Arg<'_>> = scalars
                .iter()
                .map(|v| Arg::Scalar(Scalar::U32(*v)))
                .collect();
            let (act, absmax, starts) = (
                qforge_runtime::f32_bytes(act),
                qforge_runtime::f32_bytes(w.absmax),
                qforge_runtime::f32_bytes(&start),
            );
            let (status, out) = mine.split_at_mut(1);
            args.extend([
                Arg::Read(&act),
                Arg::Read(w.packed),
                Arg::Read(&absmax),
                Arg::Read(&starts),
                Arg::Write(out),
            ]);
            if let Err(e) = dev.launch(&kernel, &mut args) {
                status[0] = 0;
                failed = Some(e);
            }
        }
        let all = comm.all_gather(&mine)?;
        let part = &all[step * (1 + len * 4)..(step + 1) * (1 + len * 4)];
        if part[0] == 0 {
            return Err(failed.unwrap_or_else(|| {
                Error::Invalid(format!(
                    "chained sum: rank {step} of {} failed its step (its error is its own)",
                    comm.size()
                ))
            }));
        }
        start = qforge_runtime::bytes_f32(&part[1..]);
    }
    Ok(start)
}

/// Each output's chains (`C` consecutive values) combined by the `Strided(C)` halving tree
/// (`w = C; while w > 1 { w /= 2; p[j] += p[j + w] for j < w }`), one `f32` per output.
pub(crate) fn tree(chains: &mut [f32], c: usize) -> Vec<f32> {
    chains
        .chunks_exact_mut(c)
        .map(|p| {
            let mut w = c;
            while w > 1 {
                w /= 2;
                for j in 0..w {
                    p[j] += p[j + w];
                }
            }
            p[0]
        })
        .collect()
}

/// `t` in `f32` and its row count, checked as `[..., last]`: a float tensor (f32, f16, bf16)
/// whose last dim is `last` and whose bytes match its shape.
///
/// # Errors
/// [`Error::Invalid`] naming `op` and `what` otherwise.
pub(crate) fn activations(
    op: &str,
    what: &str,
    t: &HostTensor,
    last: usize,
) -> Result<(Vec<f32>, usize)> {
    let numel: usize = t.shape.iter().product();
    if !t.dtype.is_float()
        || t.shape.last() != Some(&last)
        || t.data.len() != numel * t.dtype.size_bytes()
    {
        return Err(Error::Invalid(format!(
            "{op}: {what} must be a float tensor [..., {last}] whose bytes match its shape, got \
             {} {:?} with {} bytes",
            t.dtype,
            t.shape,
            t.data.len()
        )));
    }
    Ok((t.to_f32()?, numel / last.max(1)))
}
