//! Parameter groups: which parameters, which update rule with which hyperparameters, and how
//! many bits of state.

use qforge_ir::library::{AdamHyper, OptimAlgo};

use crate::error::{Error, Result};

/// The update rule of a group, with its hyperparameters. New rules (Lion, SGD, 4-bit AdamW, ...)
/// are new variants; [`crate::optim::Optimizer`]'s API does not change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// Adam (bitsandbytes `Adam` / `Adam8bit`); `weight_decay` must be 0.
    Adam(AdamHyper),
    /// AdamW with decoupled weight decay (bitsandbytes `AdamW` / `AdamW8bit`).
    AdamW(AdamHyper),
}

impl OptimizerKind {
    /// The rule's name in state files: `adam` or `adamw`.
    pub const fn name(&self) -> &'static str {
        match self {
            OptimizerKind::Adam(_) => "adam",
            OptimizerKind::AdamW(_) => "adamw",
        }
    }

    /// The hyperparameters as `(name, value)` pairs, in a fixed order (state files record them
    /// and [`crate::optim::Optimizer::load_state_dict`] compares them bit for bit).
    pub fn hyperparameters(&self) -> Vec<(&'static str, f64)> {
        match self {
            OptimizerKind::Adam(h) | OptimizerKind::AdamW(h) => vec![
                ("lr", h.lr),
                ("beta1", h.beta1),
                ("beta2", h.beta2),
                ("eps", h.eps),
                ("weight_decay", h.weight_decay),
            ],
        }
    }

    /// Checks the hyperparameters (as the kernels will).
    ///
    /// # Errors
    /// [`Error::Ir`] naming the first invalid value.
    pub fn check(&self) -> Result<()> {
        match self {
            OptimizerKind::Adam(h) => h.check(OptimAlgo::Adam)?,
            OptimizerKind::AdamW(h) => h.check(OptimAlgo::AdamW)?,
        }
        Ok(())
    }

    /// State bit widths this rule has kernels for.
    pub fn supports(&self, bits: StateBits) -> bool {
        match self {
            OptimizerKind::Adam(_) | OptimizerKind::AdamW(_) => match bits {
                StateBits::Bits32 | StateBits::Bits8 => true,
            },
        }
    }
}

pub use qforge_ir::library::StateBits;

/// Bit width of a group's state as written in state files: `32` or `8`.
pub(crate) fn bits_number(bits: StateBits) -> u64 {
    match bits {
        StateBits::Bits32 => 32,
        StateBits::Bits8 => 8,
    }
}

/// A set of parameters (by name) sharing a rule, hyperparameters and a state width.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamGroup {
    /// Parameter names, unique across all groups of an optimizer.
    pub params: Vec<String>,
    /// Update rule and hyperparameters.
    pub kind: OptimizerKind,
    /// State width. With [`StateBits::Bits8`], parameters with fewer than the optimizer's
    /// `min_8bit_size` elements keep 32-bit state (as bitsandbytes does).
    pub bits: StateBits,
}

impl ParamGroup {
    /// A group of `params` with `kind` and `bits`.
    pub fn new<S: Into<String>>(
        params: impl IntoIterator<Item = S>,
        kind: OptimizerKind,
        bits: StateBits,
    ) -> ParamGroup {
        ParamGroup {
            params: params.into_iter().map(Into::into).collect(),
            kind,
            bits,
        }
    }

    /// Checks the hyperparameters and that the rule supports the width.
    pub(crate) fn check(&self, index: usize) -> Result<()> {
        self.kind
            .check()
            .map_err(|e| Error::Invalid(format!("optimizer: parameter group {index}: {e}")))?;
        if !self.kind.supports(self.bits) {
            return Err(Error::Invalid(format!(
                "optimizer: parameter group {index}: {} has no {}-bit state",
                self.kind.name(),
                bits_number(self.bits)
            )));
        }
        Ok(())
    }
}
