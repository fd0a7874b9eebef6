//! Optimizer steps on the XLA SPMD engine ([`XlaSpmd`], feature `stablehlo`,
//! `docs/distributed.md`): each update kernel launch of the ranks runs as one sharded
//! program on XLA's CPU devices, in the data-parallel layout (every rank updates the whole
//! parameter from replicated state) or the FSDP layout (rank `r` updates the 256-element blocks
//! [`owned_elements`] gives it). The steps are bit-identical to [`Optimizer::step`] for
//! parameters, gradients and states whose update meets no subnormal (XLA's CPU code flushes
//! them).
//!
//! The host drives the devices and holds the state between steps (whole, so
//! [`Optimizer::state_dict`] writes the unsharded file at any time). SPMD runs one program of
//! one shape on every rank, so in the FSDP layout each rank's blocks are padded with zero
//! blocks to the longest rank's (updated, then dropped; blocks do not depend on each other), and
//! a parameter's partial last block (fewer than 256 elements) is updated by every rank alike
//! from replicated inputs in a program of its own. Quantized AdamW's stochastic rounding, keyed
//! by the element's index in the whole parameter, gets each rank's first index as a scalar of
//! its own.

use std::ops::Range;

use qforge_runtime::xla_spmd::XlaSpmd;
use qforge_runtime::{Error, HostTensor, Result};

use super::sharded::{joined_state, owned_elements};
use super::state::{Layout, ParamState};
use super::Optimizer;
use crate::ops::GradOptions;
use crate::spmd_capture::run_each_rank;
use crate::OPTIM_BLOCKSIZE;

const BLOCK: usize = OPTIM_BLOCKSIZE as usize;

/// How the ranks of [`Optimizer::step_xla`] share each parameter's update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XlaStepLayout {
    /// Data parallel: every rank updates the whole parameter from the same (replicated)
    /// parameter, gradient and state; the replicas must agree bit for bit.
    DataParallel,
    /// FSDP / ZeRO: rank `r` updates the whole blocks [`owned_elements`] gives it (of the
    /// parameter's whole blocks); the partial last block is updated by every rank alike.
    Fsdp,
}

/// The update of a range of a parameter's elements: their new bytes and state.
struct Updated {
    len: usize,
    param: Vec<u8>,
    state: ParamState,
}

impl Optimizer {
    /// One step with the update kernels run by `engine`'s ranks in `layout`: the parameters
    /// and gradients are whole (for data parallelism, the gradients already all-reduced), and
    /// so is the state the optimizer keeps; every updated element is the bits of
    /// [`Optimizer::step`] for inputs whose update meets no subnormal. One XLA program per
    /// update chunk ([`super::OptimizerOptions::workspace_elems`]) and parameter, plus one per
    /// parameter with a partial last block in the FSDP layout. Memory: the recording of a
    /// parameter's launches holds every rank's arguments and results at once (in the
    /// data-parallel layout about `D` copies of the parameter, gradient and state; in the FSDP
    /// layout about one), not bounded by `workspace_elems`: the engine is for programs the size
    /// of one host's memory.
    ///
    /// # Errors
    /// As [`Optimizer::step`]; [`Error::Invalid`] for a rule that needs a norm of the whole
    /// gradient or update (percentile clipping, LAMB, LARS, `max_unorm`, as
    /// [`Optimizer::step_sharded`]), a state that is one MPI rank's shard (gather it first),
    /// or data-parallel replicas that disagree; the engine's errors. A parameter is updated
    /// only when its update succeeded on every rank (the parameters before a failing one are
    /// stepped, as with [`Optimizer::step`]).
    pub fn step_xla(
        &mut self,
        engine: &XlaSpmd,
        layout: XlaStepLayout,
        params: &mut [HostTensor],
        grads: &[HostTensor],
    ) -> Result<()> {
        self.check_counts(params, grads)?;
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            self.check_pair(i, p, g)?;
            self.check_shardable(i, "step_xla")?;
            let slot = &self.slots[i];
            if let Some(r) = &slot.shard {
                return Err(Error::Invalid(format!(
                    "optimizer step_xla, parameter '{}': its state is one MPI rank's shard \
                     (elements {r:?}); gather_state first",
                    slot.name
                )));
            }
        }
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            let numel = p.numel();
            let d = engine.ranks();
            // The element ranges of each program's ranks.
            let phases: Vec<Vec<Range<usize>>> = match layout {
                XlaStepLayout::DataParallel => vec![vec![0..numel; d]],
                XlaStepLayout::Fsdp => {
                    let whole = numel / BLOCK * BLOCK;
                    let mut phases = Vec::new();
                    if whole > 0 {
                        phases.push((0..d).map(|r| owned_elements(whole, r, d)).collect());
                    }
                    if whole < numel || numel == 0 {
                        phases.push(vec![whole..numel; d]);
                    }
                    phases
                }
            };
            let mut pieces = Vec::new();
            for ranges in &phases {
                pieces.extend(self.update_ranges(engine, i, p, g, ranges)?);
            }
            let state = match pieces.as_slice() {
                [one] => one.state.clone(),
                _ => joined(&pieces),
            };
            p.data = pieces
                .iter()
                .flat_map(|u| u.param.iter().copied())
                .collect();
            let slot = &mut self.slots[i];
            slot.state = Some(state);
            slot.shape = Some(p.shape.clone());
            slot.step += 1;
        }
        Ok(())
    }

    /// Parameter `i`'s update with rank `r` taking elements `ranges[r]`, padded with zero
    /// elements and initial state to the longest range (whole blocks); one program per
    /// update chunk. Returns the updated elements of each distinct range, in rank order:
    /// one for ranges that are all the same (after checking that the ranks agree), else one
    /// per rank.
    fn update_ranges(
        &self,
        engine: &XlaSpmd,
        i: usize,
        p: &HostTensor,
        g: &HostTensor,
        ranges: &[Range<usize>],
    ) -> Result<Vec<Updated>> {
        let slot = &self.slots[i];
        let group = &self.groups[slot.group];
        let numel = p.numel();
        let (min8, seed) = (self.options.min_8bit_size, self.options.seed);
        let layout = match &slot.state {
            Some(s) => s.layout(),
            None => Layout::choose(&group.kind, group.bits, numel, min8, slot.m1_scheme),
        };
        let chunk = (self.options.workspace_elems / BLOCK).max(1) * BLOCK;
        let len = ranges.iter().map(Range::len).max().unwrap_or(0);
        let kind = group.effective_kind();
        let opts = GradOptions {
            gnorm_scale: 1.0,
            skip_zeros: group.skip_zeros,
        };
        let size = p.dtype.size_bytes();
        let padded = |t: &HostTensor, r: &Range<usize>| {
            let mut bytes = t.data[r.start * size..r.end * size].to_vec();
            bytes.resize(len * size, 0);
            HostTensor::new(t.dtype, vec![len], bytes)
        };
        let state_of = |r: &Range<usize>| -> ParamState {
            let mine = match &slot.state {
                Some(s) => s.slice(r),
                None => layout.zeros(r.len()),
            };
            if r.len() == len {
                return mine;
            }
            // Whole zero blocks after the rank's own (`r` ends on a block, being shorter).
            joined(&[
                Updated {
                    len: r.len(),
                    param: Vec::new(),
                    state: mine,
                },
                Updated {
                    len: len - r.len(),
                    param: Vec::new(),
                    state: layout.zeros(len - r.len()),
                },
            ])
        };
        let op = format!("optimizer step_xla, '{}'", slot.name);
        let mut outs = run_each_rank(&op, engine, |rank, dev| {
            let r = &ranges[rank];
            let mut part = padded(p, r)?;
            let grad = padded(g, r)?;
            let mut state = state_of(r);
            if len > 0 {
                let rng = ((seed, i as u32), r.start);
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
                    .map_err(|e| Error::Invalid(format!("{op}: {e}")))?;
            }
            Ok(Updated {
                len,
                param: part.data,
                state,
            })
        })?;
        if ranges.iter().all(|r| *r == ranges[0]) {
            // Replicas: every rank computed the same update.
            let last = outs
                .pop()
                .ok_or_else(|| Error::Invalid(format!("{op}: no ranks")))?;
            // Compared as bytes: a NaN moment is the same replica, a -0.0 another.
            let bytes = |u: &Updated| -> Vec<Vec<u8>> {
                let tensors = u.state.tensors(&[u.len]).into_iter().map(|t| t.data);
                std::iter::once(u.param.clone()).chain(tensors).collect()
            };
            let want = bytes(&last);
            for (rank, u) in outs.iter().enumerate() {
                if bytes(u) != want {
                    return Err(Error::Invalid(format!(
                        "{op}: rank {rank}'s replica of the update differs from rank {}'s",
                        ranges.len() - 1
                    )));
                }
            }
            return Ok(vec![last]);
        }
        Ok(outs
            .into_iter()
            .zip(ranges)
            .map(|(u, r)| Updated {
                len: r.len(),
                param: u.param[..r.len() * size].to_vec(),
                state: u.state.slice(&(0..r.len())),
            })
            .collect())
    }
}

/// The state of consecutive pieces of a parameter (pieces without elements add nothing).
fn joined(pieces: &[Updated]) -> ParamState {
    let parts: Vec<Vec<Vec<u8>>> = pieces
        .iter()
        .filter(|u| u.len > 0)
        .map(|u| {
            u.state
                .tensors(&[u.len])
                .into_iter()
                .map(|t| t.data)
                .collect()
        })
        .collect();
    match (parts.is_empty(), pieces.first()) {
        (false, Some(first)) => joined_state(first.state.layout(), &parts),
        (_, first) => first.map_or(Layout::One32.zeros(0), |u| u.state.clone()),
    }
}
