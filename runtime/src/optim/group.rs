//! Parameter groups: which parameters, which update rule with which hyperparameters, and how
//! many bits of state.

use qforge_ir::library::{
    AdamHyper, AdemamixHyper, MomentScheme, Optim1Algo, Optim1Hyper, OptimAlgo, QAdamSpec,
};
use qforge_ir::DType;

use crate::error::{Error, Result};
use crate::ops::OPTIM_PARAM_DTYPES;

/// The update rule of a group, with its hyperparameters. New rules (4-bit AdamW, ...) are new
/// variants; [`crate::optim::Optimizer`]'s API does not change.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// Adam (bitsandbytes `Adam` / `Adam8bit`); `weight_decay` must be 0.
    Adam(AdamHyper),
    /// AdamW with decoupled weight decay (bitsandbytes `AdamW` / `AdamW8bit`).
    AdamW(AdamHyper),
    /// Lion (bitsandbytes `Lion` / `Lion8bit`); one state; `f32` parameters only.
    Lion(Optim1Hyper),
    /// SGD with momentum (bitsandbytes `SGD` / `SGD8bit`); one state; `f32` parameters only.
    Sgd(Optim1Hyper),
    /// RMSprop (bitsandbytes `RMSprop` / `RMSprop8bit`); one state; `f32` parameters only.
    Rmsprop(Optim1Hyper),
    /// Adagrad (bitsandbytes `Adagrad` / `Adagrad8bit`); one state; `f32` parameters only.
    Adagrad(Optim1Hyper),
    /// AdEMAMix (bitsandbytes `AdEMAMix` / `AdEMAMix8bit`); three states; `f32` parameters
    /// only.
    Ademamix(AdemamixHyper),
    /// Quantized AdamW as the adamw4bit library (4-bit AdamW: ZIP-SR, ZE-EDEN, or explicit
    /// per-moment schemes); `f32`, `f16`, `bf16` parameters. With [`StateBits::Bits8`] the
    /// moments use the configured schemes (the small-tensor rule keeps tensors under 4096
    /// elements, or not a multiple of the block, in `f32`); with [`StateBits::Bits32`] both
    /// moments are `f32`.
    QAdamW(QAdamWConfig),
}

/// Hyperparameters and moment schemes of [`OptimizerKind::QAdamW`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QAdamWConfig {
    /// lr, betas, eps, weight decay (decoupled, applied before the update).
    pub hyper: AdamHyper,
    /// First-moment scheme: `fp32`, `nf4`, `nf4_sr`, `linear8`.
    pub m1: MomentScheme,
    /// Second-moment scheme: `fp32`, `dyn4`, `dyn4_nz`, `dyn4_nz_eden`, `dyn4_sr`, `linear8`.
    pub m2: MomentScheme,
}

impl QAdamWConfig {
    /// Explicit schemes (adamw4bit `QuantizedAdamW(m1_quant_scheme, m2_quant_scheme)`).
    pub fn new(hyper: AdamHyper, m1: MomentScheme, m2: MomentScheme) -> QAdamWConfig {
        QAdamWConfig { hyper, m1, m2 }
    }

    /// adamw4bit `QuantizedAdamW`'s default: 8-bit linear for both moments.
    pub fn quantized(hyper: AdamHyper) -> QAdamWConfig {
        QAdamWConfig::new(hyper, MomentScheme::Linear8, MomentScheme::Linear8)
    }

    /// ZIP-SR (`ZIPSRAdamW4Bit`): NF4 m1, zero-inclusive Dyn4 m2 with stochastic rounding in
    /// preconditioner space.
    pub fn zip_sr(hyper: AdamHyper) -> QAdamWConfig {
        QAdamWConfig::new(hyper, MomentScheme::Nf4, MomentScheme::Dyn4Sr)
    }

    /// ZE-EDEN (`ZEEDENAdamW4Bit`): NF4 m1, zero-exclusive Dyn4 m2 with EDEN scales.
    pub fn ze_eden(hyper: AdamHyper) -> QAdamWConfig {
        QAdamWConfig::new(hyper, MomentScheme::Nf4, MomentScheme::Dyn4NzEden)
    }
}

/// How many state tensors (besides 8-bit absmax) a rule keeps per parameter, and which host op
/// family updates them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// Adam / AdamW: `state1`, `state2`.
    Adam,
    /// Lion, SGD, RMSprop, Adagrad: `state1`.
    One,
    /// AdEMAMix: `state1` (m1), `state2` (nu), `state3` (m2).
    Ademamix,
    /// Quantized AdamW: `state1`/`absmax1` (m1), `state2`/`absmax2` (m2) per scheme.
    QAdam,
}

impl OptimizerKind {
    /// The rule's name in state files: `adam`, `adamw`, `lion`, `sgd`, `rmsprop`, `adagrad`,
    /// `ademamix` or `qadamw`.
    pub const fn name(&self) -> &'static str {
        match self {
            OptimizerKind::Adam(_) => "adam",
            OptimizerKind::AdamW(_) => "adamw",
            OptimizerKind::Lion(_) => "lion",
            OptimizerKind::Sgd(_) => "sgd",
            OptimizerKind::Rmsprop(_) => "rmsprop",
            OptimizerKind::Adagrad(_) => "adagrad",
            OptimizerKind::Ademamix(_) => "ademamix",
            OptimizerKind::QAdamW(_) => "qadamw",
        }
    }

    /// The host op family.
    pub(crate) fn family(&self) -> Family {
        match self {
            OptimizerKind::Adam(_) => Family::Adam,
            OptimizerKind::AdamW(_) => Family::Adam,
            OptimizerKind::Lion(_) => Family::One,
            OptimizerKind::Sgd(_) => Family::One,
            OptimizerKind::Rmsprop(_) => Family::One,
            OptimizerKind::Adagrad(_) => Family::One,
            OptimizerKind::Ademamix(_) => Family::Ademamix,
            OptimizerKind::QAdamW(_) => Family::QAdam,
        }
    }

    /// The hyperparameters as `(name, value)` pairs, in a fixed order (state files record them
    /// and [`crate::optim::Optimizer::load_state_dict`] compares them bit for bit). AdEMAMix's
    /// `t_alpha` / `t_beta3` are written as their value, or 0 for `None` (0 is not a valid
    /// scheduler length, so this is unambiguous).
    pub fn hyperparameters(&self) -> Vec<(&'static str, f64)> {
        match self {
            OptimizerKind::Adam(h)
            | OptimizerKind::AdamW(h)
            | OptimizerKind::QAdamW(QAdamWConfig { hyper: h, .. }) => vec![
                ("lr", h.lr),
                ("beta1", h.beta1),
                ("beta2", h.beta2),
                ("eps", h.eps),
                ("weight_decay", h.weight_decay),
            ],
            OptimizerKind::Lion(h)
            | OptimizerKind::Sgd(h)
            | OptimizerKind::Rmsprop(h)
            | OptimizerKind::Adagrad(h) => vec![
                ("lr", h.lr),
                ("beta1", h.beta1),
                ("beta2", h.beta2),
                ("eps", h.eps),
                ("weight_decay", h.weight_decay),
            ],
            OptimizerKind::Ademamix(h) => {
                let steps = |t: Option<u32>| t.map_or(0.0, f64::from);
                vec![
                    ("lr", h.lr),
                    ("beta1", h.beta1),
                    ("beta2", h.beta2),
                    ("beta3", h.beta3),
                    ("alpha", h.alpha),
                    ("eps", h.eps),
                    ("weight_decay", h.weight_decay),
                    ("t_alpha", steps(h.t_alpha)),
                    ("t_beta3", steps(h.t_beta3)),
                ]
            }
        }
    }

    /// Adam / AdamW: the algorithm and hyperparameters.
    pub(crate) fn adam(&self) -> Option<(OptimAlgo, &AdamHyper)> {
        match self {
            OptimizerKind::Adam(h) => Some((OptimAlgo::Adam, h)),
            OptimizerKind::AdamW(h) => Some((OptimAlgo::AdamW, h)),
            OptimizerKind::Lion(_)
            | OptimizerKind::Sgd(_)
            | OptimizerKind::Rmsprop(_)
            | OptimizerKind::Adagrad(_)
            | OptimizerKind::Ademamix(_)
            | OptimizerKind::QAdamW(_) => None,
        }
    }

    /// One-state rules: the algorithm and hyperparameters.
    pub(crate) fn one_state(&self) -> Option<(Optim1Algo, &Optim1Hyper)> {
        match self {
            OptimizerKind::Lion(h) => Some((Optim1Algo::Lion, h)),
            OptimizerKind::Sgd(h) => Some((Optim1Algo::Sgd, h)),
            OptimizerKind::Rmsprop(h) => Some((Optim1Algo::Rmsprop, h)),
            OptimizerKind::Adagrad(h) => Some((Optim1Algo::Adagrad, h)),
            OptimizerKind::Adam(_)
            | OptimizerKind::AdamW(_)
            | OptimizerKind::Ademamix(_)
            | OptimizerKind::QAdamW(_) => None,
        }
    }

    /// AdEMAMix: the hyperparameters.
    pub(crate) fn ademamix(&self) -> Option<&AdemamixHyper> {
        match self {
            OptimizerKind::Ademamix(h) => Some(h),
            OptimizerKind::Adam(_)
            | OptimizerKind::AdamW(_)
            | OptimizerKind::Lion(_)
            | OptimizerKind::Sgd(_)
            | OptimizerKind::Rmsprop(_)
            | OptimizerKind::Adagrad(_)
            | OptimizerKind::QAdamW(_) => None,
        }
    }

    /// Quantized AdamW: the hyperparameters and schemes.
    pub(crate) fn qadam(&self) -> Option<&QAdamWConfig> {
        match self {
            OptimizerKind::QAdamW(c) => Some(c),
            OptimizerKind::Adam(_)
            | OptimizerKind::AdamW(_)
            | OptimizerKind::Lion(_)
            | OptimizerKind::Sgd(_)
            | OptimizerKind::Rmsprop(_)
            | OptimizerKind::Adagrad(_)
            | OptimizerKind::Ademamix(_) => None,
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
            OptimizerKind::Lion(h) => h.check(Optim1Algo::Lion)?,
            OptimizerKind::Sgd(h) => h.check(Optim1Algo::Sgd)?,
            OptimizerKind::Rmsprop(h) => h.check(Optim1Algo::Rmsprop)?,
            OptimizerKind::Adagrad(h) => h.check(Optim1Algo::Adagrad)?,
            OptimizerKind::Ademamix(h) => h.check()?,
            OptimizerKind::QAdamW(c) => {
                c.hyper.check(OptimAlgo::AdamW)?;
                QAdamSpec::new(c.m1, c.m2, DType::F32).check()?;
            }
        }
        Ok(())
    }

    /// State bit widths this rule has kernels for (every rule: 32 and 8).
    pub fn supports(&self, bits: StateBits) -> bool {
        match bits {
            StateBits::Bits32 | StateBits::Bits8 => true,
        }
    }

    /// Parameter dtypes this rule's kernels take: `f32`, `f16`, `bf16` for Adam / AdamW and
    /// quantized AdamW, `f32` only for the others.
    pub fn param_dtypes(&self) -> &'static [DType] {
        match self.family() {
            Family::Adam | Family::QAdam => &OPTIM_PARAM_DTYPES,
            Family::One | Family::Ademamix => &[DType::F32],
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
