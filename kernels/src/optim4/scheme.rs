//! The host side of the quantized-AdamW kernels ([`crate::optim4`]): the moment
//! schemes with their tables, block sizes, floors, the small-tensor rule and the initial state,
//! the per-step kernel scalars and sizes (the catalog's example arguments are in
//! `catalog.rs`).

use crate::adam::AdamHyper;
use crate::adam::{check_f32_scalars, step_exponent};
use crate::optim4::quant::{self as q, DYN4_BITS, NF4_BITS};
use crate::OptimAlgo;
use qforge_ir::Scalar;
use qforge_ir::{Error, Result};

/// Block of the 4-bit schemes (elements per absmax).
pub const QADAM_BLOCK4: u32 = 128;
/// Block of the 8-bit linear scheme.
pub const QADAM_BLOCK8: u32 = 256;
/// The small-tensor rule: a moment is quantized only if the tensor has at least this many
/// elements (and a multiple of the scheme's block).
pub const QADAM_MIN_NUMEL: usize = 4096;
/// Absmax floor of the 4-bit schemes.
pub const ABSMAX_FLOOR4: f32 = 1e-12;
/// Absmax floor of the 8-bit linear scheme.
pub const ABSMAX_FLOOR8: f32 = 1e-8;
/// Lower bound of the EDEN denominator `<s, table[code]>`.
pub const EDEN_DOT_FLOOR: f32 = 1e-12;

/// How one moment is stored between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MomentScheme {
    /// Unquantized `f32`.
    Fp32,
    /// NF4 codes, round to nearest (ties to the upper code), block 128.
    Nf4,
    /// NF4 codes with value-unbiased stochastic rounding, block 128.
    Nf4Sr,
    /// Zero-inclusive Dyn4 codes, round to nearest, block 128.
    Dyn4,
    /// Zero-exclusive Dyn4 (code 0 becomes 1), round to nearest, block 128.
    Dyn4Nz,
    /// Zero-exclusive Dyn4 with the EDEN scale `c = |s|^2 / max(<s, table[code]>, 1e-12)`
    /// (ZE-EDEN), block 128.
    Dyn4NzEden,
    /// Zero-inclusive Dyn4 with stochastic rounding in preconditioner space (ZIP-SR), block 128.
    Dyn4Sr,
    /// 8-bit linear `i8` codes `round_half_even(127 s)`, block 256.
    Linear8,
}

impl MomentScheme {
    /// Every scheme.
    pub const ALL: [MomentScheme; 8] = [
        MomentScheme::Fp32,
        MomentScheme::Nf4,
        MomentScheme::Nf4Sr,
        MomentScheme::Dyn4,
        MomentScheme::Dyn4Nz,
        MomentScheme::Dyn4NzEden,
        MomentScheme::Dyn4Sr,
        MomentScheme::Linear8,
    ];

    /// The name used in kernel names, state files and on the command line: `fp32`, `nf4`,
    /// `nf4_sr`, `dyn4`, `dyn4_nz`, `dyn4_nz_eden`, `dyn4_sr`, `linear8`.
    pub const fn name(self) -> &'static str {
        match self {
            MomentScheme::Fp32 => "fp32",
            MomentScheme::Nf4 => "nf4",
            MomentScheme::Nf4Sr => "nf4_sr",
            MomentScheme::Dyn4 => "dyn4",
            MomentScheme::Dyn4Nz => "dyn4_nz",
            MomentScheme::Dyn4NzEden => "dyn4_nz_eden",
            MomentScheme::Dyn4Sr => "dyn4_sr",
            MomentScheme::Linear8 => "linear8",
        }
    }

    /// Parses a name produced by [`MomentScheme::name`]; also accepts adamw4bit's `linear` and
    /// `dyn4_upd_sr_fp32read`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the value and the allowed set.
    pub fn parse(name: &str) -> Result<MomentScheme> {
        match name {
            "linear" => return Ok(MomentScheme::Linear8),
            "dyn4_upd_sr_fp32read" => return Ok(MomentScheme::Dyn4Sr),
            _ => {}
        }
        MomentScheme::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                let all: Vec<&str> = MomentScheme::ALL.iter().map(|s| s.name()).collect();
                Error::Unsupported(format!(
                    "moment scheme '{name}' is not supported; allowed: {}",
                    all.join(", ")
                ))
            })
    }

    /// Elements per absmax block: 128 (4-bit), 256 (8-bit), 0 for `f32`.
    pub const fn block(self) -> u32 {
        match self {
            MomentScheme::Fp32 => 0,
            MomentScheme::Nf4
            | MomentScheme::Nf4Sr
            | MomentScheme::Dyn4
            | MomentScheme::Dyn4Nz
            | MomentScheme::Dyn4NzEden
            | MomentScheme::Dyn4Sr => QADAM_BLOCK4,
            MomentScheme::Linear8 => QADAM_BLOCK8,
        }
    }

    /// Bits per stored element: 4, 8 or 32.
    pub const fn bits(self) -> u32 {
        match self {
            MomentScheme::Fp32 => 32,
            MomentScheme::Linear8 => 8,
            MomentScheme::Nf4
            | MomentScheme::Nf4Sr
            | MomentScheme::Dyn4
            | MomentScheme::Dyn4Nz
            | MomentScheme::Dyn4NzEden
            | MomentScheme::Dyn4Sr => 4,
        }
    }

    /// True when the scheme draws random bits (stochastic rounding).
    pub const fn stochastic(self) -> bool {
        matches!(self, MomentScheme::Nf4Sr | MomentScheme::Dyn4Sr)
    }

    /// True for the schemes allowed for the (signed) first moment: `fp32`, `nf4`, `nf4_sr`,
    /// `linear8`.
    pub const fn signed(self) -> bool {
        matches!(
            self,
            MomentScheme::Fp32 | MomentScheme::Nf4 | MomentScheme::Nf4Sr | MomentScheme::Linear8
        )
    }

    /// True for the schemes allowed for the (non-negative) second moment: `fp32`, `dyn4`,
    /// `dyn4_nz`, `dyn4_nz_eden`, `dyn4_sr`, `linear8`.
    pub const fn unsigned(self) -> bool {
        !matches!(self, MomentScheme::Nf4 | MomentScheme::Nf4Sr)
    }

    /// The absmax floor: `1e-12` (4-bit), `1e-8` (8-bit), 0 for `f32`.
    pub fn absmax_floor(self) -> f32 {
        match self.bits() {
            4 => ABSMAX_FLOOR4,
            8 => ABSMAX_FLOOR8,
            _ => 0.0,
        }
    }

    /// The 16 code values of a 4-bit scheme (NF4 or Dyn4), `None` otherwise.
    pub fn table(self) -> Option<[f32; 16]> {
        match self {
            MomentScheme::Nf4 | MomentScheme::Nf4Sr => Some(q::table_values(&NF4_BITS)),
            MomentScheme::Dyn4
            | MomentScheme::Dyn4Nz
            | MomentScheme::Dyn4NzEden
            | MomentScheme::Dyn4Sr => Some(q::table_values(&DYN4_BITS)),
            MomentScheme::Fp32 | MomentScheme::Linear8 => None,
        }
    }

    /// The scheme that actually stores a moment of a tensor of `numel` elements: the
    /// small-tensor rule keeps it in `f32` unless `numel >= 4096` and `numel % block == 0`.
    pub fn effective(self, numel: usize) -> MomentScheme {
        let block = self.block() as usize;
        if block == 0 || numel < QADAM_MIN_NUMEL || !numel.is_multiple_of(block) {
            MomentScheme::Fp32
        } else {
            self
        }
    }

    /// `(codes, absmax)` lengths of the state of `n` elements: codes are bytes for 4-bit
    /// (`ceil(n / 2)`), `i8` per element for 8-bit, `f32` per element for `f32`; absmax is one
    /// `f32` per block (0 for `f32`).
    pub fn state_lens(self, n: usize) -> (usize, usize) {
        match self.bits() {
            4 => (n.div_ceil(2), n.div_ceil(QADAM_BLOCK4 as usize)),
            8 => (n, n.div_ceil(QADAM_BLOCK8 as usize)),
            _ => (n, 0),
        }
    }

    /// The state the reference's first step starts from (its zero store): the codes as bytes
    /// (packed nibbles for 4-bit, `i8` bits for 8-bit, `f32` little endian for `f32`) and the
    /// absmax. NF4: code 7, absmax `1e-12`; `dyn4`, `dyn4_sr`: code 0, absmax `1e-12`;
    /// `dyn4_nz`: code 1, absmax `1e-12` (reads back as `3.25e-15`); `dyn4_nz_eden`: code 1,
    /// absmax 0 (EDEN's `c = 0`); `linear8`: code 0, absmax `1e-8`; `f32`: zeros.
    pub fn initial_state(self, n: usize) -> (Vec<u8>, Vec<f32>) {
        let (codes, blocks) = self.state_lens(n);
        let nibble = |c: u8| {
            let mut v = vec![c | c << 4; codes];
            if n % 2 == 1 {
                if let Some(last) = v.last_mut() {
                    *last = c;
                }
            }
            v
        };
        match self {
            MomentScheme::Fp32 => (vec![0; 4 * n], Vec::new()),
            MomentScheme::Nf4 | MomentScheme::Nf4Sr => (nibble(7), vec![ABSMAX_FLOOR4; blocks]),
            MomentScheme::Dyn4 | MomentScheme::Dyn4Sr => (nibble(0), vec![ABSMAX_FLOOR4; blocks]),
            MomentScheme::Dyn4Nz => (nibble(1), vec![ABSMAX_FLOOR4; blocks]),
            MomentScheme::Dyn4NzEden => (nibble(1), vec![0.0; blocks]),
            MomentScheme::Linear8 => (vec![0; codes], vec![ABSMAX_FLOOR8; blocks]),
        }
    }
}

impl std::fmt::Display for MomentScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `f32` kernel scalars of one step, derived on the host in `f64` and rounded once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QAdamScalars {
    /// `f32(1 - beta1)`: the `lerp_` weight of m1.
    pub w1: f32,
    /// `f32(1 - beta2)`: the `lerp_` weight of m2.
    pub w2: f32,
    /// `f32(1 - lr * weight_decay)`.
    pub decay: f32,
    /// `f32(-(lr / c1))` with `c1 = 1 - beta1^t`.
    pub neg_step: f32,
    /// `f32(sqrt(c2))` with `c2 = 1 - beta2^t`.
    pub sqrt_c2: f32,
    /// `f32(eps)`.
    pub eps: f32,
    /// `f32(c2)` (ZIP-SR's preconditioner).
    pub c2: f32,
    /// The step number `t` (1-based), also a Philox counter word.
    pub step: u32,
}

impl QAdamScalars {
    /// The scalars of step `step` (1-based). `c1 = 1 - beta1^t` and `c2 = 1 - beta2^t` are
    /// computed in `f64` with `powf` (C `pow`, as Python's `**`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for step 0 or invalid hyperparameters ([`AdamHyper::check`]).
    pub fn new(hyper: &AdamHyper, step: u32) -> Result<QAdamScalars> {
        hyper.check(OptimAlgo::AdamW)?;
        step_exponent(step)?;
        let t = f64::from(step);
        let c1 = 1.0 - hyper.beta1.powf(t);
        let c2 = 1.0 - hyper.beta2.powf(t);
        let s = QAdamScalars {
            w1: (1.0 - hyper.beta1) as f32,
            w2: (1.0 - hyper.beta2) as f32,
            decay: (1.0 - hyper.lr * hyper.weight_decay) as f32,
            neg_step: (-(hyper.lr / c1)) as f32,
            sqrt_c2: c2.sqrt() as f32,
            eps: hyper.eps as f32,
            c2: c2 as f32,
            step,
        };
        check_f32_scalars(
            &[
                ("decay", s.decay),
                ("neg_step", s.neg_step),
                ("sqrt_c2", s.sqrt_c2),
                ("eps", s.eps),
                ("c2", s.c2),
            ],
            &["eps"],
        )?;
        Ok(s)
    }

    /// The scalar arguments after the five sizes, in parameter order: the seven `f32` values,
    /// then `seed_lo`, `seed_hi`, `param_id`, `step`, `offset` (the launch's first element
    /// within the whole tensor; a Philox counter word).
    pub fn kernel_args(&self, seed: u64, param_id: u32, offset: u32) -> Vec<Scalar> {
        let mut out: Vec<Scalar> = [
            self.w1,
            self.w2,
            self.decay,
            self.neg_step,
            self.sqrt_c2,
            self.eps,
            self.c2,
        ]
        .into_iter()
        .map(Scalar::f32)
        .collect();
        out.extend([
            Scalar::U32(seed as u32),
            Scalar::U32((seed >> 32) as u32),
            Scalar::U32(param_id),
            Scalar::U32(self.step),
            Scalar::U32(offset),
        ]);
        out
    }
}

/// The size scalars of a tensor of `n` elements: `[n, n_items, n_packed, n_blocks1, n_blocks2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QAdamSizes {
    /// Elements.
    pub n: u32,
    /// Work items (the grid).
    pub n_items: u32,
    /// Bytes of a packed 4-bit code buffer, `ceil(n / 2)`.
    pub n_packed: u32,
    /// Absmax blocks of m1 (0 for `f32`).
    pub n_blocks1: u32,
    /// Absmax blocks of m2 (0 for `f32`).
    pub n_blocks2: u32,
}

impl QAdamSizes {
    /// As `u32` scalars, in parameter order.
    pub fn args(&self) -> [Scalar; 5] {
        [
            self.n,
            self.n_items,
            self.n_packed,
            self.n_blocks1,
            self.n_blocks2,
        ]
        .map(Scalar::U32)
    }
}
