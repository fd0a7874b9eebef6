//! The stateful optimizer API: [`Optimizer`] holds parameter groups ([`ParamGroup`]: names, an
//! [`OptimizerKind`] with hyperparameters, a state width) and each parameter's state and step
//! count; [`Optimizer::step`] updates parameters in place through the optimizer kernels on any
//! [`Device`]; [`Optimizer::state_dict`] / [`Optimizer::load_state_dict`] (and
//! [`Optimizer::save`] / [`Optimizer::load`]) write and read the state as safetensors, and
//! resuming gives the bit-identical trajectory. Usage and file format: `docs/optimizers.md`,
//! section "API".
//!
//! State is created at a parameter's first step (its shape is known then). Updates run in
//! chunks of whole 256-element blocks through a bounded workspace
//! ([`OptimizerOptions::workspace_elems`], default 512 Ki elements): besides parameters,
//! gradients and packed state, a step holds at most one chunk's copy of the parameter, gradient
//! and state (about `workspace_elems * (2 * param bytes + 2 * 8)` bytes for 32-bit state).

mod clip;
mod file;
mod group;
mod serial;
mod sharded;
mod state;
#[cfg(feature = "stablehlo")]
mod xla;

use std::collections::HashMap;

use crate::{MomentScheme, OPTIM_BLOCKSIZE};

pub use clip::GNORM_HISTORY;
pub use group::{OptimizerKind, ParamGroup, QAdamWConfig, StateBits};
pub use serial::{STATE_FORMAT_VERSION, STATE_METADATA_KEY};
pub use sharded::owned_elements;
pub use state::StateLayout;
#[cfg(feature = "stablehlo")]
pub use xla::XlaStepLayout;

use crate::ops::GradOptions;
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};
use state::{Layout, ParamState};

/// Settings shared by all groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptimizerOptions {
    /// Parameters with fewer elements keep 32-bit state in 8-bit groups (bitsandbytes'
    /// `min_8bit_size`, default 4096).
    pub min_8bit_size: usize,
    /// Elements per update chunk (rounded down to a multiple of 256, at least 256); bounds the
    /// step's temporary memory. Does not change results. Default 512 Ki.
    pub workspace_elems: usize,
    /// Seed for rules with stochastic rounding (recorded in state files): the Philox key of
    /// quantized AdamW's `nf4_sr` / `dyn4_sr` moments, whose bits are keyed by (seed, parameter
    /// position, step, element index). Default 0.
    pub seed: u64,
}

impl Default for OptimizerOptions {
    fn default() -> Self {
        OptimizerOptions {
            min_8bit_size: 4096,
            workspace_elems: 512 * 1024,
            seed: 0,
        }
    }
}

/// One parameter's bookkeeping.
#[derive(Clone, Debug, PartialEq)]
struct Slot {
    name: String,
    group: usize,
    /// Steps taken (0: no state yet).
    step: u32,
    /// The parameter's shape, known from the first step (or a loaded state).
    shape: Option<Vec<usize>>,
    state: Option<ParamState>,
    /// The elements `state` covers when it is one rank's shard
    /// ([`Optimizer::step_sharded`]); `None`: the whole parameter.
    shard: Option<std::ops::Range<usize>>,
    /// Quantized AdamW: this parameter's first-moment scheme, replacing the group's
    /// ([`Optimizer::set_m1_quant_scheme_for_parameters`]).
    m1_scheme: Option<MomentScheme>,
    /// Percentile clipping: the squared norms of the last [`GNORM_HISTORY`] gradients
    /// (bitsandbytes' `gnorm_vec`), created with the state.
    gnorm_vec: Option<Vec<f32>>,
}

/// A stateful optimizer over named parameters in groups.
#[derive(Clone, Debug)]
pub struct Optimizer {
    groups: Vec<ParamGroup>,
    options: OptimizerOptions,
    slots: Vec<Slot>,
    index: HashMap<String, usize>,
}

impl Optimizer {
    /// An optimizer with default [`OptimizerOptions`].
    ///
    /// # Errors
    /// As [`Optimizer::with_options`].
    pub fn new(groups: Vec<ParamGroup>) -> Result<Optimizer> {
        Optimizer::with_options(groups, OptimizerOptions::default())
    }

    /// An optimizer over `groups`; parameters are ordered group by group, as listed.
    ///
    /// # Errors
    /// [`Error::Invalid`] for no parameters, an empty or repeated parameter name, invalid
    /// hyperparameters, a width the rule has no kernel for, or a zero workspace.
    pub fn with_options(groups: Vec<ParamGroup>, options: OptimizerOptions) -> Result<Optimizer> {
        if options.workspace_elems == 0 {
            return Err(Error::Invalid(
                "optimizer: workspace_elems must be at least 1".into(),
            ));
        }
        let mut slots = Vec::new();
        let mut index = HashMap::new();
        for (g, group) in groups.iter().enumerate() {
            group.check(g)?;
            for name in &group.params {
                if name.is_empty() {
                    return Err(Error::Invalid(format!(
                        "optimizer: parameter group {g} has an empty parameter name"
                    )));
                }
                if index.insert(name.clone(), slots.len()).is_some() {
                    return Err(Error::Invalid(format!(
                        "optimizer: parameter '{name}' is listed twice"
                    )));
                }
                slots.push(Slot {
                    name: name.clone(),
                    group: g,
                    step: 0,
                    shape: None,
                    state: None,
                    shard: None,
                    m1_scheme: None,
                    gnorm_vec: None,
                });
            }
        }
        if slots.is_empty() {
            return Err(Error::Invalid("optimizer: no parameters".into()));
        }
        Ok(Optimizer {
            groups,
            options,
            slots,
            index,
        })
    }

    /// The groups.
    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    /// The options.
    pub fn options(&self) -> &OptimizerOptions {
        &self.options
    }

    /// Parameter names in step order (group by group).
    pub fn param_names(&self) -> Vec<&str> {
        self.slots.iter().map(|s| s.name.as_str()).collect()
    }

    /// Steps taken by parameter `name` (`None` for an unknown name).
    pub fn step_count(&self, name: &str) -> Option<u32> {
        self.index.get(name).map(|&i| self.slots[i].step)
    }

    /// How the state of `name` is actually stored (`None` before its first step or for an
    /// unknown name): [`StateLayout::Bits32`] for small parameters of 8-bit groups; for
    /// quantized AdamW each moment's scheme after the small-tensor rule (a 4-bit moment is
    /// reported as its 4-bit scheme, a moment kept in `f32` as [`MomentScheme::Fp32`]).
    pub fn state_layout(&self, name: &str) -> Option<StateLayout> {
        let slot = &self.slots[*self.index.get(name)?];
        slot.state.as_ref().map(|s| s.layout().report())
    }

    /// One step for every parameter: `params[i]` and `grads[i]` belong to
    /// [`Optimizer::param_names`]`()[i]`. Parameters are updated in place; each parameter's step
    /// count grows by one. Everything is checked before anything is updated.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a count that differs from the parameter count, an empty parameter
    /// or one of a dtype the group's rule does not take (see [`OptimizerKind::param_dtypes`]),
    /// a gradient of another dtype or shape, a tensor whose bytes do not match its shape, a
    /// parameter whose shape changed since its state was created, a step count at `u32::MAX`,
    /// hyperparameters whose `f32` kernel values overflow (see
    /// [`crate::AdamHyper::scalars`]); any
    /// device error. After a device error the parameters before the failing one are already
    /// updated, and the failing one and its state may be partly updated (a chunked step) while
    /// its step count stays (a first step leaves no state): load a saved state to continue.
    pub fn step(
        &mut self,
        dev: &dyn Device,
        params: &mut [HostTensor],
        grads: &[HostTensor],
    ) -> Result<()> {
        self.check_counts(params, grads)?;
        let work: Vec<(usize, &mut HostTensor, &HostTensor)> = params
            .iter_mut()
            .zip(grads)
            .enumerate()
            .map(|(i, (p, g))| (i, p, g))
            .collect();
        self.run(dev, work)
    }

    /// One step for the parameters named in `grads` (others are skipped and keep their step
    /// count, like PyTorch parameters without a gradient), taking each from `params`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a gradient or parameter name the optimizer does not know, a
    /// gradient whose parameter is missing from `params`; otherwise as [`Optimizer::step`].
    pub fn step_named(
        &mut self,
        dev: &dyn Device,
        params: &mut HashMap<String, HostTensor>,
        grads: &HashMap<String, HostTensor>,
    ) -> Result<()> {
        for name in params.keys().chain(grads.keys()) {
            if !self.index.contains_key(name) {
                return Err(Error::Invalid(format!(
                    "optimizer step: unknown parameter '{name}'"
                )));
            }
        }
        if let Some(name) = grads.keys().find(|n| !params.contains_key(*n)) {
            return Err(Error::Invalid(format!(
                "optimizer step: gradient for '{name}' but no parameter tensor"
            )));
        }
        let mut work = Vec::new();
        for (name, p) in params.iter_mut() {
            if let Some(g) = grads.get(name) {
                work.push((self.index[name], p, g));
            }
        }
        work.sort_by_key(|w| w.0);
        self.run(dev, work)
    }

    fn run(
        &mut self,
        dev: &dyn Device,
        mut work: Vec<(usize, &mut HostTensor, &HostTensor)>,
    ) -> Result<()> {
        for (i, p, g) in &work {
            self.check_pair(*i, p, g)?;
            let slot = &self.slots[*i];
            if let Some(r) = &slot.shard {
                return Err(Error::Invalid(format!(
                    "optimizer step, parameter '{}': its state is one rank's shard (elements \
                     {r:?}); step it with step_sharded, or gather_state first",
                    slot.name
                )));
            }
        }
        let block = OPTIM_BLOCKSIZE as usize;
        let chunk = (self.options.workspace_elems / block).max(1) * block;
        for (i, p, g) in work.iter_mut() {
            let min8 = self.options.min_8bit_size;
            let seed = self.options.seed;
            let slot = &mut self.slots[*i];
            let group = &self.groups[slot.group];
            let numel = p.numel();
            let m1 = slot.m1_scheme;
            let fresh = slot.state.is_none();
            let state = slot.state.get_or_insert_with(|| {
                Layout::choose(&group.kind, group.bits, numel, min8, m1).zeros(numel)
            });
            let rng = (seed, *i as u32);
            // Adam / AdamW / SGD with a group `max_unorm` run the LAMB / LARS kernels.
            let kind = group.effective_kind();
            let step = slot.step + 1;
            // Percentile clipping: the history is updated on a copy, kept only on success.
            let mut history = None;
            let mut opts = GradOptions {
                gnorm_scale: 1.0,
                skip_zeros: group.skip_zeros,
            };
            let clipped = if group.clips() {
                clip::grad_sqnorm(dev, g, chunk).map(|sq| {
                    let mut h = slot
                        .gnorm_vec
                        .clone()
                        .unwrap_or_else(|| vec![0.0; GNORM_HISTORY]);
                    opts.gnorm_scale =
                        clip::record_and_scale(&mut h, sq, step, group.percentile_clipping);
                    history = Some(h);
                })
            } else {
                Ok(())
            };
            // RMSprop / Adagrad with a group `max_unorm` (Adam / AdamW / SGD carry theirs in
            // the LAMB / LARS kind).
            let unorm = match kind {
                OptimizerKind::Rmsprop(_) | OptimizerKind::Adagrad(_) => group.max_unorm,
                _ => 0.0,
            };
            let updated = clipped
                .and_then(|()| state.update(dev, &kind, p, g, step, chunk, (rng, 0), &opts, unorm));
            if let Err(e) = updated {
                // A parameter's first step that fails leaves no state behind (a state at
                // step 0 could not be saved and loaded again).
                if fresh {
                    slot.state = None;
                }
                return Err(Error::Invalid(format!(
                    "optimizer step, '{}': {e}",
                    slot.name
                )));
            }
            slot.shape = Some(p.shape.clone());
            slot.step += 1;
            if history.is_some() {
                slot.gnorm_vec = history;
            }
        }
        Ok(())
    }

    /// Quantized AdamW: the first-moment scheme of parameter `name` (its override, else its
    /// group's); `None` for an unknown name or another rule.
    pub fn m1_quant_scheme(&self, name: &str) -> Option<MomentScheme> {
        let slot = &self.slots[*self.index.get(name)?];
        let group = self.groups[slot.group].kind.qadam()?;
        Some(slot.m1_scheme.unwrap_or(group.m1))
    }

    /// Quantized AdamW: switches the first moment of the named parameters to `scheme` from
    /// their next step on (adamw4bit's `set_m1_quant_scheme_for_parameters`, used for the
    /// paper's switch of the LM head to NF4 stochastic rounding for the last 10% of training).
    /// A parameter that already has state keeps it: the new scheme must store the moment in the
    /// same format (`nf4` and `nf4_sr` share NF4 codes; a moment kept in `f32` by the
    /// small-tensor rule stays `f32`). The choice is saved in state files. Nothing changes on
    /// error.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an unknown name, a parameter outside a quantized-AdamW group, a
    /// scheme not allowed for the first moment, or a switch that would change the stored
    /// format of an existing state.
    pub fn set_m1_quant_scheme_for_parameters(
        &mut self,
        names: &[&str],
        scheme: MomentScheme,
    ) -> Result<()> {
        let err = |m: String| Err(Error::Invalid(format!("set_m1_quant_scheme: {m}")));
        if !scheme.signed() {
            return err(format!(
                "scheme '{scheme}' is not allowed for the first moment; allowed: fp32, nf4, \
                 nf4_sr, linear8"
            ));
        }
        let mut picked = Vec::new();
        for name in names {
            let Some(&i) = self.index.get(*name) else {
                return err(format!("unknown parameter '{name}'"));
            };
            let slot = &self.slots[i];
            let group = &self.groups[slot.group];
            if group.kind.qadam().is_none() {
                return err(format!(
                    "parameter '{name}' is in a {} group, not qadamw",
                    group.kind.name()
                ));
            }
            if let (Some(state), Some(shape)) = (&slot.state, &slot.shape) {
                let numel = shape.iter().product();
                let min8 = self.options.min_8bit_size;
                let new = Layout::choose(&group.kind, group.bits, numel, min8, Some(scheme));
                let (state::Layout::QAdam { m1: old, .. }, state::Layout::QAdam { m1: want, .. }) =
                    (state.layout(), new)
                else {
                    return err(format!("parameter '{name}' has no quantized-AdamW state"));
                };
                if old.bits() != want.bits() || old.table() != want.table() {
                    return err(format!(
                        "parameter '{name}' stores its first moment as {old}; {want} stores it \
                         differently (switch before its first step, or between nf4 and nf4_sr)"
                    ));
                }
                picked.push((i, Some(new)));
            } else {
                picked.push((i, None));
            }
        }
        for (i, layout) in picked {
            let slot = &mut self.slots[i];
            slot.m1_scheme = Some(scheme);
            if let (Some(state::Layout::QAdam { m1, .. }), Some(ParamState::QAdam(s))) =
                (layout, slot.state.as_mut())
            {
                s.m1.scheme = m1;
            }
        }
        Ok(())
    }

    /// One parameter and one gradient per slot.
    fn check_counts(&self, params: &[HostTensor], grads: &[HostTensor]) -> Result<()> {
        let n = self.slots.len();
        if params.len() != n || grads.len() != n {
            return Err(Error::Invalid(format!(
                "optimizer step: {n} parameters, got {} parameter and {} gradient tensors",
                params.len(),
                grads.len()
            )));
        }
        Ok(())
    }

    fn check_pair(&self, i: usize, p: &HostTensor, g: &HostTensor) -> Result<()> {
        let slot = &self.slots[i];
        let bad = |what: String| {
            Err(Error::Invalid(format!(
                "optimizer step, parameter '{}': {what}",
                slot.name
            )))
        };
        let kind = &self.groups[slot.group].kind;
        let dtypes = kind.param_dtypes();
        if !dtypes.contains(&p.dtype) {
            let names: Vec<String> = dtypes.iter().map(|d| d.to_string()).collect();
            return bad(format!(
                "dtype {} is not supported by {} (parameters must be {})",
                p.dtype,
                kind.name(),
                names.join(", ")
            ));
        }
        if p.numel() == 0 {
            return bad("the parameter is empty".into());
        }
        if g.dtype != p.dtype || g.shape != p.shape {
            return bad(format!(
                "the gradient ({} {:?}) must have the parameter's dtype and shape ({} {:?})",
                g.dtype, g.shape, p.dtype, p.shape
            ));
        }
        // `HostTensor`'s fields are public: its bytes must match its shape.
        for (what, t) in [("parameter", p), ("gradient", g)] {
            let want = t.numel() * t.dtype.size_bytes();
            if t.data.len() != want {
                return bad(format!(
                    "the {what} holds {} bytes, but its shape {:?} of {} needs {want}",
                    t.data.len(),
                    t.shape,
                    t.dtype
                ));
            }
        }
        if let Some(shape) = &slot.shape {
            if *shape != p.shape {
                return bad(format!(
                    "shape {:?} differs from the shape {shape:?} its state was created for",
                    p.shape
                ));
            }
        }
        if slot.step == u32::MAX {
            return bad("the step count would overflow u32".into());
        }
        Ok(())
    }
}
