//! Sharded optimizer state (FSDP / ZeRO style, `docs/distributed.md`): each of `D` ranks owns
//! whole 256-element blocks of every parameter ([`owned_elements`]), keeps the state of those
//! elements only, updates them, and the updated parameters are all-gathered.
//!
//! The update kernels have no dependency across blocks, and the stochastic rounding of
//! quantized AdamW is keyed by the element's index in the whole parameter, so a sharded step
//! is bit-identical to [`Optimizer::step`] on one rank. The state layout (8-bit or 32-bit, the
//! 4-bit small-tensor rule) is chosen from the whole parameter's size, never the shard's
//! (bitsandbytes #2080, torchao #4912: the threshold applied to the local shard). The state
//! file is always the unsharded one: [`Optimizer::gather_state`] makes every rank's state whole
//! (bytes equal to the unsharded optimizer's `state_dict`), and an optimizer that loaded a whole
//! state keeps only its shard at its next sharded step, so a state saved with `D` ranks resumes
//! with any `D'`.

use std::ops::Range;

use qforge_runtime::{Communicator, Device, Error, HostTensor, Result};

use super::state::Layout;
use super::{Optimizer, OptimizerKind};
use crate::ops::GradOptions;
use crate::OPTIM_BLOCKSIZE;

const BLOCK: usize = OPTIM_BLOCKSIZE as usize;

/// The elements of a parameter of `numel` elements that rank `rank` of `ranks` owns: blocks
/// `rank * B / ranks .. (rank + 1) * B / ranks` of its `B = ceil(numel / 256)` blocks (so
/// shards differ by at most one block, and a rank may own none of a small parameter).
pub fn owned_elements(numel: usize, rank: usize, ranks: usize) -> Range<usize> {
    let blocks = numel.div_ceil(BLOCK);
    let ranks = ranks.max(1);
    let at = |r: usize| (r * blocks / ranks * BLOCK).min(numel);
    at(rank)..at(rank + 1)
}

/// The byte ranges, in the layout's tensor order, of one shard's state tensors.
fn tensor_bytes(layout: Layout, len: usize) -> Vec<usize> {
    layout
        .tensors(&[len])
        .iter()
        .map(|(_, dtype, shape)| shape.iter().product::<usize>() * dtype.size())
        .collect()
}

/// Every rank's byte slices, each padded to the longest, gathered in one collective: returns
/// `out[rank][k]` = rank `rank`'s slice `k`. `lens[rank][k]` are the lengths every rank knows.
fn gather_slices(
    comm: &dyn Communicator,
    mine: &[Vec<u8>],
    lens: &[Vec<usize>],
) -> Result<Vec<Vec<Vec<u8>>>> {
    let k = mine.len();
    let width: Vec<usize> = (0..k)
        .map(|j| lens.iter().map(|l| l[j]).max().unwrap_or(0))
        .collect();
    let mut bytes = Vec::with_capacity(width.iter().sum());
    for (m, w) in mine.iter().zip(&width) {
        bytes.extend_from_slice(m);
        bytes.resize(bytes.len() + (w - m.len()), 0);
    }
    let gathered = comm.all_gather(&bytes)?;
    let per_rank = width.iter().sum::<usize>();
    Ok(lens
        .iter()
        .enumerate()
        .map(|(rank, l)| {
            let mut at = rank * per_rank;
            (0..k)
                .map(|j| {
                    let s = gathered[at..at + l[j]].to_vec();
                    at += width[j];
                    s
                })
                .collect()
        })
        .collect())
}

/// The state of a parameter whose pieces, in element order, have the tensors `parts[k]` (in
/// the layout's tensor order, [`Layout::tensors`]): the tensors concatenated.
pub(super) fn joined_state(layout: Layout, parts: &[Vec<Vec<u8>>]) -> super::state::ParamState {
    let count = parts.first().map_or(0, Vec::len);
    let whole: Vec<Vec<u8>> = (0..count)
        .map(|k| parts.iter().flat_map(|p| p[k].iter().copied()).collect())
        .collect();
    let views: Vec<&[u8]> = whole.iter().map(Vec::as_slice).collect();
    layout.state_from(&views)
}

impl Optimizer {
    /// Refuses, for `op`, a parameter whose rule needs a norm of the whole gradient or update
    /// (percentile clipping, LAMB / LARS trust ratios, `max_unorm`): not sharded yet.
    pub(super) fn check_shardable(&self, i: usize, op: &str) -> Result<()> {
        let slot = &self.slots[i];
        let group = &self.groups[slot.group];
        let kind = group.effective_kind();
        let norm = group.clips()
            || kind.lamb().is_some()
            || kind.lars().is_some()
            || matches!(kind, OptimizerKind::Rmsprop(_) | OptimizerKind::Adagrad(_))
                && group.max_unorm > 0.0;
        if norm {
            return Err(Error::Invalid(format!(
                "optimizer {op}, parameter '{}': {} with percentile clipping, LAMB/LARS trust \
                 ratios or max_unorm needs the norm of the whole tensor; not supported sharded \
                 yet (step unsharded)",
                slot.name,
                kind.name()
            )));
        }
        Ok(())
    }

    /// One step as rank `comm.rank()` of `comm.size()`: every rank passes the same whole
    /// `params` and `grads` (for example after a data-parallel gradient all-reduce), updates the
    /// state and parameter elements it owns ([`owned_elements`]), and the updated elements are
    /// all-gathered, so every rank ends with the whole updated `params`, bit-identical to
    /// [`Optimizer::step`]. The state of other ranks' elements is never held. On the first
    /// sharded step of a parameter whose state is whole (loaded with
    /// [`Optimizer::load_state_dict`], or stepped unsharded), only the owned part is kept.
    ///
    /// # Errors
    /// As [`Optimizer::step`]; [`Error::Invalid`] for a rule that needs a norm of the whole
    /// gradient or update (percentile clipping, LAMB, LARS, `max_unorm`), not sharded yet, or
    /// a state sharded for another rank count; the all-gather's errors (ranks whose parameters
    /// differ in shape). The checks fail alike on every rank given the same inputs; a device
    /// error on one rank leaves the others in the all-gather, so a rank that gets an error
    /// should end the group with [`Communicator::abort`] (as `qforge finetune --shards` does).
    /// After an error, load a saved state to continue (the parameters and states before the
    /// failing one may already be stepped, as with [`Optimizer::step`]).
    pub fn step_sharded(
        &mut self,
        dev: &dyn Device,
        comm: &dyn Communicator,
        params: &mut [HostTensor],
        grads: &[HostTensor],
    ) -> Result<()> {
        self.check_counts(params, grads)?;
        let n = self.slots.len();
        let (rank, ranks) = (comm.rank(), comm.size());
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            self.check_pair(i, p, g)?;
            self.check_shardable(i, "step_sharded")?;
            let slot = &self.slots[i];
            let owned = owned_elements(p.numel(), rank, ranks);
            if let Some(r) = slot.shard.as_ref().filter(|r| **r != owned) {
                return Err(Error::Invalid(format!(
                    "optimizer step_sharded, parameter '{}': the state is the shard {r:?}, \
                     but rank {rank} of {ranks} owns {owned:?} (gather_state, save and load \
                     to change the rank count)",
                    slot.name
                )));
            }
        }
        let block = OPTIM_BLOCKSIZE as usize;
        let chunk = (self.options.workspace_elems / block).max(1) * block;
        let mut updated = Vec::with_capacity(n);
        let mut lens = vec![Vec::with_capacity(n); ranks];
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let (min8, seed) = (self.options.min_8bit_size, self.options.seed);
            let slot = &mut self.slots[i];
            let group = &self.groups[slot.group];
            let numel = p.numel();
            let owned = owned_elements(numel, rank, ranks);
            let m1 = slot.m1_scheme;
            // The layout from the whole parameter's size, the state of the owned part only.
            let state = match (slot.state.take(), &slot.shard) {
                (Some(s), Some(_)) => s,
                (Some(whole), None) => whole.slice(&owned),
                (None, _) => {
                    Layout::choose(&group.kind, group.bits, numel, min8, m1).zeros(owned.len())
                }
            };
            let state = slot.state.insert(state);
            slot.shard = Some(owned.clone());
            let size = p.dtype.size_bytes();
            let bytes = owned.start * size..owned.end * size;
            let mut part =
                HostTensor::new(p.dtype, vec![owned.len()], p.data[bytes.clone()].to_vec())?;
            if !owned.is_empty() {
                let grad = HostTensor::new(g.dtype, vec![owned.len()], g.data[bytes].to_vec())?;
                let opts = GradOptions {
                    gnorm_scale: 1.0,
                    skip_zeros: group.skip_zeros,
                };
                let kind = group.effective_kind();
                let rng = ((seed, i as u32), owned.start);
                state
                    .update(
                        dev,
                        &kind,
                        &mut part,
                        &grad,
                        slot.step + 1,
                        chunk,
                        rng,
                        &opts,
                        0.0,
                    )
                    .map_err(|e| {
                        Error::Invalid(format!("optimizer step_sharded, '{}': {e}", slot.name))
                    })?;
            }
            slot.shape = Some(p.shape.clone());
            slot.step += 1;
            for (r, l) in lens.iter_mut().enumerate() {
                l.push(owned_elements(numel, r, ranks).len() * size);
            }
            updated.push(part.data);
        }
        let all = gather_slices(comm, &updated, &lens)?;
        for (i, p) in params.iter_mut().enumerate() {
            let size = p.dtype.size_bytes();
            for (r, slices) in all.iter().enumerate() {
                let at = owned_elements(p.numel(), r, ranks).start * size;
                p.data[at..at + slices[i].len()].copy_from_slice(&slices[i]);
            }
        }
        Ok(())
    }

    /// Makes every parameter's state whole on every rank (one all-gather), so that
    /// [`Optimizer::state_dict`] writes the unsharded optimizer's bytes. A collective call: every
    /// rank makes it. Parameters whose state is already whole, or has not been created, are
    /// left as they are.
    ///
    /// # Errors
    /// [`Error::Invalid`] when a state is the shard of another rank count or rank (it was
    /// stepped on another communicator); the all-gather's errors (ranks whose optimizers
    /// differ).
    pub fn gather_state(&mut self, comm: &dyn Communicator) -> Result<()> {
        let (rank, ranks) = (comm.rank(), comm.size());
        for slot in &self.slots {
            if let (Some(r), Some(shape)) = (&slot.shard, &slot.shape) {
                let owned = owned_elements(shape.iter().product(), rank, ranks);
                if *r != owned {
                    return Err(Error::Invalid(format!(
                        "optimizer gather_state, parameter '{}': the state is the shard {r:?}, \
                         but rank {rank} of {ranks} owns {owned:?} (gather with the \
                         communicator it was stepped on)",
                        slot.name
                    )));
                }
            }
        }
        let mut mine = Vec::new();
        let mut lens = vec![Vec::new(); ranks];
        let mut sharded = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let (Some(state), Some(_), Some(shape)) = (&slot.state, &slot.shard, &slot.shape)
            else {
                continue;
            };
            let numel: usize = shape.iter().product();
            let layout = state.layout();
            let own = state.tensors(&[slot.shard.as_ref().map_or(0, Range::len)]);
            let count = own.len();
            mine.extend(own.into_iter().map(|t| t.data));
            for (r, l) in lens.iter_mut().enumerate() {
                l.extend(tensor_bytes(layout, owned_elements(numel, r, ranks).len()));
            }
            sharded.push((i, layout, count));
        }
        let all = gather_slices(comm, &mine, &lens)?;
        let mut first = 0;
        for (i, layout, count) in sharded {
            let parts: Vec<Vec<Vec<u8>>> = all
                .iter()
                .map(|rank| rank[first..first + count].to_vec())
                .collect();
            first += count;
            let slot = &mut self.slots[i];
            slot.state = Some(joined_state(layout, &parts));
            slot.shard = None;
        }
        Ok(())
    }
}
