//! Quantized AdamW (4-bit AdamW as the adamw4bit library: ZIP-SR, ZE-EDEN, `QuantizedAdamW`
//! with explicit per-moment schemes) over any [`Device`]. The formulas are in
//! [`crate::optim4`] and `docs/optimizers.md` ("4-bit AdamW").

use crate::{AdamHyper, MomentScheme, QAdamScalars, QAdamSpec};

use crate::ops::le_f32;
use crate::optim4::launch::{check_range, launch_qadam_typed, TypedMoment};
use qforge_runtime::Device;
use qforge_runtime::HostTensor;
use qforge_runtime::{Error, Result};

/// One moment's stored state.
#[derive(Clone, Debug, PartialEq)]
pub struct MomentState {
    /// The scheme that stores it (after the small-tensor rule: `Fp32` for small tensors).
    pub scheme: MomentScheme,
    /// Codes: packed nibbles (4-bit, element `2i` in the low nibble of byte `i`), `i8` bits
    /// (8-bit), or the `f32` values as little-endian bytes (`Fp32`).
    pub codes: Vec<u8>,
    /// One scale per block (empty for `Fp32`).
    pub absmax: Vec<f32>,
}

impl MomentState {
    /// The reference's initial state of `scheme` for `n` elements
    /// ([`MomentScheme::initial_state`]).
    pub fn initial(scheme: MomentScheme, n: usize) -> MomentState {
        let (codes, absmax) = scheme.initial_state(n);
        MomentState {
            scheme,
            codes,
            absmax,
        }
    }

    /// Persistent bytes (codes plus scales).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.absmax.len()
    }

    /// The dequantized values (`table[code] * absmax`; 8-bit: `f32(code / 127) * absmax`).
    pub fn dequantize(&self, n: usize) -> Vec<f32> {
        match self.scheme.bits() {
            32 => le_f32(&self.codes),
            8 => (0..n)
                .map(|i| (self.codes[i] as i8 as f32 / 127.0) * self.absmax[i / 256])
                .collect(),
            _ => {
                let table = self.scheme.table().unwrap_or([0.0; 16]);
                (0..n)
                    .map(|i| {
                        let c = (self.codes[i / 2] >> (4 * (i % 2))) & 15;
                        table[c as usize] * self.absmax[i / 128]
                    })
                    .collect()
            }
        }
    }

    fn check(&self, op: &str, which: &str, n: usize) -> Result<()> {
        let (codes, blocks) = self.scheme.state_lens(n);
        let codes = if self.scheme.bits() == 32 {
            4 * codes
        } else {
            codes
        };
        if self.codes.len() != codes || self.absmax.len() != blocks {
            return Err(Error::Invalid(format!(
                "{op}: {which} ({}) has {} code bytes and {} scales, {n} elements need {codes} and \
                 {blocks}",
                self.scheme,
                self.codes.len(),
                self.absmax.len()
            )));
        }
        Ok(())
    }
}

/// Quantized-AdamW state of one parameter: both moments.
#[derive(Clone, Debug, PartialEq)]
pub struct QAdamState {
    /// First moment.
    pub m1: MomentState,
    /// Second moment.
    pub m2: MomentState,
}

impl QAdamState {
    /// The initial state of a parameter of `n` elements for the requested schemes, after the
    /// small-tensor rule ([`MomentScheme::effective`]).
    pub fn new(m1: MomentScheme, m2: MomentScheme, n: usize) -> QAdamState {
        QAdamState {
            m1: MomentState::initial(m1.effective(n), n),
            m2: MomentState::initial(m2.effective(n), n),
        }
    }

    /// Persistent bytes of both moments.
    pub fn bytes(&self) -> usize {
        self.m1.bytes() + self.m2.bytes()
    }
}

/// The stochastic-rounding key of a launch: the Philox key and the counter words besides the
/// step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QAdamRng {
    /// The 64-bit seed (Philox key).
    pub seed: u64,
    /// The parameter's id (its position in the optimizer).
    pub param_id: u32,
    /// Index of the launch's first element within the whole parameter (chunked updates); must
    /// be even (one Philox call serves an element pair).
    pub offset: u32,
}

/// One quantized-AdamW step (step number `step`, 1-based) in place on `params` and `state`.
/// Gradient elements that are NaN or ±inf zero that element's moments and leave its parameter
/// unchanged. A quantized moment needs `n` to be a multiple of its block (the small-tensor rule
/// of [`QAdamState::new`] guarantees it). CPU devices run the staged kernel in chunks
/// ([`crate::ops::launch_qadam`]; the same bits).
///
/// # Errors
/// [`Error::Invalid`] for an empty or non-float parameter, a gradient of another dtype or shape,
/// state of the wrong size, a quantized moment whose block does not divide `n`, an odd
/// `rng.offset` or one that with `n` overflows `u32`, schemes the kernel does not take, invalid
/// hyperparameters or step 0; any device error.
pub fn qadamw_step(
    dev: &dyn Device,
    params: &mut HostTensor,
    grads: &HostTensor,
    state: &mut QAdamState,
    hyper: &AdamHyper,
    step: u32,
    rng: QAdamRng,
) -> Result<()> {
    const OP: &str = "qadamw_step";
    let n = crate::adam::host::param_grad_pair(OP, params, grads)?;
    if !rng.offset.is_multiple_of(2) {
        return Err(Error::Invalid(format!(
            "{OP}: the random-bits offset {} must be even",
            rng.offset
        )));
    }
    for (which, m) in [("m1", &state.m1), ("m2", &state.m2)] {
        m.check(OP, which, n as usize)?;
        let bs = m.scheme.block();
        if bs != 0 && n % bs != 0 {
            return Err(Error::Invalid(format!(
                "{OP}: {which} ({}) needs a multiple of {bs} elements, got {n}",
                m.scheme
            )));
        }
    }
    let spec = QAdamSpec::new(state.m1.scheme, state.m2.scheme, params.dtype);
    let scalars = QAdamScalars::new(hyper, step)?;
    check_range(OP, n as usize, rng)?;
    let mut m1 = TypedMoment::new(state.m1.scheme, &mut state.m1.codes, &mut state.m1.absmax);
    let mut m2 = TypedMoment::new(state.m2.scheme, &mut state.m2.codes, &mut state.m2.absmax);
    let r = launch_qadam_typed(
        dev,
        spec,
        &scalars,
        rng,
        &mut params.data,
        &grads.data,
        [&mut m1, &mut m2],
    );
    m1.finish();
    m2.finish();
    r?;
    Ok(())
}
