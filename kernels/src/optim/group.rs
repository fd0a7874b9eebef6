//! Parameter groups: which parameters, which update rule with which hyperparameters, and how
//! many bits of state.

use crate::{
    AdamHyper, AdemamixHyper, LambHyper, LarsHyper, MomentScheme, Optim1Algo, Optim1Hyper,
    OptimAlgo, QAdamSpec,
};
use qforge_ir::DType;

use crate::ops::OPTIM_PARAM_DTYPES;
use qforge_runtime::{Error, Result};

/// The update rule of a group, with its hyperparameters. New rules (4-bit AdamW, ...) are new
/// variants; [`crate::adam::Optimizer`]'s API does not change.
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
    /// LAMB (bitsandbytes `LAMB` / `LAMB32bit`): AdamW whose step is scaled by the trust ratio
    /// `max_unorm * |p| / |u|` when the update norm exceeds `max_unorm * |p|`; `state1`,
    /// `state2` as Adam, 32-bit or blockwise 8-bit (the 8-bit AdamW state, not bitsandbytes'
    /// non-blockwise `LAMB8bit` state); `f32`, `f16`, `bf16` parameters.
    Lamb(LambHyper),
    /// LARS (bitsandbytes `LARS` / `LARS32bit`): SGD with momentum and the same trust-ratio
    /// scaling (`max_unorm` 0.02); `state1` as SGD, 32-bit or blockwise 8-bit (the 8-bit SGD
    /// state, not bitsandbytes' non-blockwise `LARS8bit` state); `f32` parameters only.
    Lars(LarsHyper),
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
    /// `ademamix`, `qadamw`, `lamb` or `lars`.
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
            OptimizerKind::Lamb(_) => "lamb",
            OptimizerKind::Lars(_) => "lars",
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
            OptimizerKind::Lamb(_) => Family::Adam,
            OptimizerKind::Lars(_) => Family::One,
        }
    }

    /// The hyperparameters as `(name, value)` pairs, in a fixed order (state files record them
    /// and [`crate::adam::Optimizer::load_state_dict`] compares them bit for bit). AdEMAMix's
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
            OptimizerKind::Lamb(h) => vec![
                ("lr", h.lr),
                ("beta1", h.beta1),
                ("beta2", h.beta2),
                ("eps", h.eps),
                ("weight_decay", h.weight_decay),
                ("max_unorm", h.max_unorm),
            ],
            OptimizerKind::Lars(h) => vec![
                ("lr", h.lr),
                ("momentum", h.momentum),
                ("weight_decay", h.weight_decay),
                ("max_unorm", h.max_unorm),
            ],
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
            | OptimizerKind::QAdamW(_)
            | OptimizerKind::Lamb(_)
            | OptimizerKind::Lars(_) => None,
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
            | OptimizerKind::QAdamW(_)
            | OptimizerKind::Lamb(_)
            | OptimizerKind::Lars(_) => None,
        }
    }

    /// AdEMAMix: the hyperparameters.
    pub(crate) fn ademamix(&self) -> Option<&AdemamixHyper> {
        if let OptimizerKind::Ademamix(h) = self {
            Some(h)
        } else {
            None
        }
    }

    /// Quantized AdamW: the hyperparameters and schemes.
    pub(crate) fn qadam(&self) -> Option<&QAdamWConfig> {
        if let OptimizerKind::QAdamW(c) = self {
            Some(c)
        } else {
            None
        }
    }

    /// LAMB: the hyperparameters.
    pub(crate) fn lamb(&self) -> Option<&LambHyper> {
        if let OptimizerKind::Lamb(h) = self {
            Some(h)
        } else {
            None
        }
    }

    /// LARS: the hyperparameters.
    pub(crate) fn lars(&self) -> Option<&LarsHyper> {
        if let OptimizerKind::Lars(h) = self {
            Some(h)
        } else {
            None
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
            OptimizerKind::Lamb(h) => h.check()?,
            OptimizerKind::Lars(h) => h.check()?,
        }
        Ok(())
    }

    /// Parameter dtypes this rule's kernels take: `f32`, `f16`, `bf16` for Adam / AdamW, LAMB
    /// and quantized AdamW, `f32` only for the others.
    pub fn param_dtypes(&self) -> &'static [DType] {
        match self.family() {
            Family::Adam | Family::QAdam => &OPTIM_PARAM_DTYPES,
            Family::One | Family::Ademamix => &[DType::F32],
        }
    }
}

pub use crate::StateBits;

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
    /// bitsandbytes' `max_unorm` for Adam, AdamW and SGD groups (32-bit or 8-bit state) and
    /// RMSprop and Adagrad groups with 32-bit state: `0` (the default) is off; `> 0` scales each
    /// parameter's step by the trust ratio `thr / |u|` when the update norm `|u|` exceeds
    /// `thr = max_unorm * |p|` (RMSprop and Adagrad: `+ eps`), through the LAMB / LARS kernels
    /// of the state's width ([`ParamGroup::effective_kind`]) or RMSprop's / Adagrad's norm
    /// kernels. With 8-bit state this goes beyond bitsandbytes, whose blockwise 8-bit update
    /// has no update norm. LAMB and LARS take it in their hyperparameters instead, so it must
    /// stay 0 for them (and for Lion, AdEMAMix and quantized AdamW).
    pub max_unorm: f64,
    /// bitsandbytes' `skip_zeros`: `true` leaves each element whose gradient is exactly zero
    /// (its parameter and its state) untouched, where bitsandbytes honours it (32-bit state of
    /// every rule but AdEMAMix, LAMB and LARS included; 8-bit state of Lion, SGD, RMSprop,
    /// Adagrad and qforge's 8-bit LARS). bitsandbytes ignores it for 8-bit Adam / AdamW and for
    /// AdEMAMix, and so does qforge (also for 8-bit LAMB); the update norm of LAMB, LARS and
    /// `max_unorm` groups includes the skipped elements (bitsandbytes' precondition kernels
    /// take no `skip_zeros`). Quantized AdamW refuses it. Default `false`.
    pub skip_zeros: bool,
    /// bitsandbytes' `percentile_clipping` (1..=100, default 100 = off): each parameter keeps
    /// the squared norms of its last 100 gradients, and a gradient whose norm exceeds the
    /// given percentile of that history is scaled down to it (`gnorm_scale`, see
    /// `docs/optimizers.md`). Adam, AdamW, Lion, SGD, RMSprop, Adagrad, LAMB, LARS (both
    /// widths, with or without `max_unorm`: the scaled gradient enters both the update norm and
    /// the update).
    pub percentile_clipping: u32,
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
            max_unorm: 0.0,
            skip_zeros: false,
            percentile_clipping: 100,
        }
    }

    /// The same group with `skip_zeros` set (see [`ParamGroup::skip_zeros`]).
    pub fn with_skip_zeros(mut self, skip_zeros: bool) -> ParamGroup {
        self.skip_zeros = skip_zeros;
        self
    }

    /// The same group with `percentile_clipping` set (see
    /// [`ParamGroup::percentile_clipping`]).
    pub fn with_percentile_clipping(mut self, percentile: u32) -> ParamGroup {
        self.percentile_clipping = percentile;
        self
    }

    /// Whether the group clips gradients by percentile (`percentile_clipping < 100`).
    pub fn clips(&self) -> bool {
        self.percentile_clipping < 100
    }

    /// The same group with `max_unorm` set (see [`ParamGroup::max_unorm`]).
    pub fn with_max_unorm(mut self, max_unorm: f64) -> ParamGroup {
        self.max_unorm = max_unorm;
        self
    }

    /// The rule the kernels run: `kind`, except that with `max_unorm > 0` Adam and AdamW run as
    /// [`OptimizerKind::Lamb`] (same hyperparameters; Adam has no weight decay, so LAMB's decay
    /// factor is exactly 1) and SGD as [`OptimizerKind::Lars`] (`momentum` = SGD's `beta1`).
    /// With a scale of 1 these equal the plain rules bit for bit.
    pub fn effective_kind(&self) -> OptimizerKind {
        if self.max_unorm <= 0.0 {
            return self.kind;
        }
        match self.kind {
            OptimizerKind::Adam(h) | OptimizerKind::AdamW(h) => OptimizerKind::Lamb(LambHyper {
                lr: h.lr,
                beta1: h.beta1,
                beta2: h.beta2,
                eps: h.eps,
                weight_decay: h.weight_decay,
                max_unorm: self.max_unorm,
            }),
            OptimizerKind::Sgd(h) => OptimizerKind::Lars(LarsHyper {
                lr: h.lr,
                momentum: h.beta1,
                weight_decay: h.weight_decay,
                max_unorm: self.max_unorm,
            }),
            OptimizerKind::Lion(_)
            | OptimizerKind::Rmsprop(_)
            | OptimizerKind::Adagrad(_)
            | OptimizerKind::Ademamix(_)
            | OptimizerKind::QAdamW(_)
            | OptimizerKind::Lamb(_)
            | OptimizerKind::Lars(_) => self.kind,
        }
    }

    /// The hyperparameters recorded in state files: the rule's, plus `max_unorm` when the
    /// group sets it.
    pub(crate) fn hyperparameters(&self) -> Vec<(&'static str, f64)> {
        let mut out = self.kind.hyperparameters();
        if self.max_unorm != 0.0 {
            out.push(("max_unorm", self.max_unorm));
        }
        if self.skip_zeros {
            out.push(("skip_zeros", 1.0));
        }
        if self.clips() {
            out.push(("percentile_clipping", f64::from(self.percentile_clipping)));
        }
        out
    }

    /// Checks `skip_zeros` and `percentile_clipping` (see their docs).
    fn check_grad_options(&self) -> std::result::Result<(), String> {
        let p = self.percentile_clipping;
        if !(1..=100).contains(&p) {
            return Err(format!(
                "percentile_clipping = {p} is invalid: it must be in 1..=100 (100: off)"
            ));
        }
        let kind = self.kind.name();
        // The update-norm paths (LAMB, LARS, `max_unorm`) take both options, as bitsandbytes'
        // `optimizer_update_32bit` does: the gradient is scaled in the norm and the update
        // kernels, and `skip_zeros` acts in the update only (where the plain rule's kernel of
        // that width honours it).
        let why_not = match self.kind {
            OptimizerKind::Adam(_)
            | OptimizerKind::AdamW(_)
            | OptimizerKind::Lion(_)
            | OptimizerKind::Sgd(_)
            | OptimizerKind::Rmsprop(_)
            | OptimizerKind::Adagrad(_)
            | OptimizerKind::Lamb(_)
            | OptimizerKind::Lars(_) => None,
            // bitsandbytes' AdEMAMix kernels ignore skip_zeros (so does qforge); percentile
            // clipping is not implemented for it.
            OptimizerKind::Ademamix(_) => self.clips().then_some(
                "qforge's AdEMAMix kernels take no gnorm_scale (skip_zeros is accepted and \
                 ignored, as bitsandbytes does)",
            ),
            OptimizerKind::QAdamW(_) => Some(
                "quantized AdamW is not a bitsandbytes optimizer and its kernels take no \
                 gradient options",
            ),
        };
        let Some(why) = why_not else {
            return Ok(());
        };
        if !(self.skip_zeros || self.clips()) {
            return Ok(());
        }
        let what = if self.skip_zeros && !matches!(self.kind, OptimizerKind::Ademamix(_)) {
            "skip_zeros = true".to_string()
        } else {
            format!("percentile_clipping = {p}")
        };
        Err(format!(
            "{what} is not supported for {kind} ({why}); supported: adam, adamw, lion, sgd, \
             rmsprop, adagrad (also with max_unorm), lamb, lars"
        ))
    }

    /// Checks `max_unorm` (see [`ParamGroup::max_unorm`]).
    fn check_max_unorm(&self) -> std::result::Result<(), String> {
        let m = self.max_unorm;
        if m == 0.0 {
            return Ok(());
        }
        // The kernels take max_unorm as f32: it must round to a finite, non-zero value.
        let m32 = m as f32;
        if !(m.is_finite() && m > 0.0 && m32.is_finite()) || m32 == 0.0 {
            return Err(format!(
                "max_unorm = {m:?} is invalid: it must be 0 (off) or a positive value that \
                 is finite and non-zero in f32 (about 1.2e-38 to 3.4e38)"
            ));
        }
        let why_not = match self.kind {
            OptimizerKind::Adam(_)
            | OptimizerKind::AdamW(_)
            | OptimizerKind::Sgd(_)
            | OptimizerKind::Rmsprop(_)
            | OptimizerKind::Adagrad(_) => None,
            OptimizerKind::Lamb(_) | OptimizerKind::Lars(_) => {
                return Err(format!(
                    "max_unorm = {m:?} is set on the group, but it belongs in {}'s \
                     hyperparameters",
                    self.kind.name()
                ))
            }
            OptimizerKind::Lion(_) => Some(
                "bitsandbytes' Lion path sums the unsquared next-step interpolation after the \
                 update and applies it one step late, which is not an update norm",
            ),
            OptimizerKind::Ademamix(_) => {
                Some("bitsandbytes' AdEMAMix kernels compute no update norm and apply no scale")
            }
            OptimizerKind::QAdamW(_) => Some("quantized AdamW is not a bitsandbytes optimizer"),
        };
        if let Some(why) = why_not {
            return Err(format!(
                "max_unorm = {m:?} is not supported for {} ({why}); supported: adam, adamw, sgd, \
                 rmsprop, adagrad",
                self.kind.name()
            ));
        }
        let norm8 = matches!(
            self.effective_kind(),
            OptimizerKind::Lamb(_) | OptimizerKind::Lars(_)
        );
        if self.bits == StateBits::Bits8 && !norm8 {
            return Err(format!(
                "max_unorm = {m:?} with 8-bit state is not supported for {}: its update-norm \
                 kernels take 32-bit state (8-bit state: adam, adamw and sgd, through the 8-bit \
                 LAMB / LARS kernels); use 32-bit state",
                self.kind.name()
            ));
        }
        self.effective_kind().check().map_err(|e| {
            format!(
                "with max_unorm, {} runs the {} kernels: {e}",
                self.kind.name(),
                self.effective_kind().name()
            )
        })
    }

    /// Checks the hyperparameters and the options against the rule and the width.
    pub(crate) fn check(&self, index: usize) -> Result<()> {
        self.kind
            .check()
            .map_err(|e| Error::Invalid(format!("optimizer: parameter group {index}: {e}")))?;
        self.check_max_unorm()
            .and_then(|()| self.check_grad_options())
            .map_err(|e| Error::Invalid(format!("optimizer: parameter group {index}: {e}")))
    }
}
