//! Per-parameter state and the chunked update: the parameter is processed in chunks of whole
//! 256-element blocks, each copied into a small workspace, updated by the host op and copied
//! back. The kernels have no dependency across blocks, so the result is bit-identical to one
//! launch over the whole tensor.

use std::ops::Range;

use crate::{MomentScheme, OPTIM_BLOCKSIZE};
use safetensors::Dtype;

use super::group::{Family, OptimizerKind, StateBits};
use crate::ops::{
    adam_step_32bit, adam_step_8bit, ademamix_step_32bit, ademamix_step_8bit, lamb8_norm_partials,
    lamb_norm_partials, lamb_update_32bit, lamb_update_8bit, lars8_norm_partials,
    lars_norm_partials, lars_update_32bit, lars_update_8bit, norm_scale, optim1_norm_partials,
    optim1_norm_scale, optim1_step_32bit, optim1_step_8bit, optim1_update_scaled_32bit,
    qadamw_step, AdamState32, AdamState8, AdemamixState32, AdemamixState8, GradOptions,
    MomentState, NormPartials, Optim1State8, QAdamRng, QAdamState,
};
use qforge_runtime::Device;
use qforge_runtime::{bytes_f32, f32_bytes, HostTensor};
use qforge_runtime::{Error, Result};

const BLOCK: usize = OPTIM_BLOCKSIZE as usize;

/// The state of one parameter (a new state layout is a new variant).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ParamState {
    /// Adam / AdamW: both moments in `f32`.
    Adam32(AdamState32),
    /// Adam / AdamW: 8-bit blockwise moments.
    Adam8(AdamState8),
    /// One-state rules: the state in `f32`.
    One32(Vec<f32>),
    /// One-state rules: 8-bit blockwise state.
    One8(Optim1State8),
    /// AdEMAMix: `m1`, `nu`, `m2` in `f32`.
    Ademamix32(AdemamixState32),
    /// AdEMAMix: 8-bit blockwise `m1`, `nu`, `m2`.
    Ademamix8(AdemamixState8),
    /// Quantized AdamW: each moment in its scheme.
    QAdam(QAdamState),
}

/// One named state tensor: suffix, safetensors dtype, shape, bytes.
pub(crate) struct StateTensor {
    pub suffix: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// How a parameter's state is stored, as [`Optimizer::state_layout`](super::Optimizer::state_layout)
/// reports it (`None` there before the parameter's first step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateLayout {
    /// Every state tensor in `f32` (32 bits per element): a 32-bit group, or a parameter of an
    /// 8-bit group with fewer than `min_8bit_size` elements.
    Bits32,
    /// Every state tensor in 8-bit blockwise codes (one `u8` per element, one `f32` absmax per
    /// 256-element block).
    Bits8,
    /// Quantized AdamW: each moment in the scheme that actually stores it, after the
    /// small-tensor rule ([`MomentScheme::effective`]); [`MomentScheme::bits`] is its width per
    /// element: 4 (`nf4`, `nf4_sr`, `dyn4*`), 8 (`linear8`) or 32 (`fp32`, also every moment of a
    /// [`StateBits::Bits32`] group).
    QAdamW {
        /// The first moment's scheme.
        m1: MomentScheme,
        /// The second moment's scheme.
        m2: MomentScheme,
    },
}

/// The layout a parameter's state has: which tensors, dtypes and shapes (see
/// [`Layout::tensors`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `state1`, `state2`: `f32`.
    Adam32,
    /// `state1`, `state2`: `u8`; `absmax1`, `absmax2`.
    Adam8,
    /// `state1`: `f32`.
    One32,
    /// `state1`: `u8`; `absmax1`.
    One8,
    /// `state1` (m1), `state2` (nu), `state3` (m2): `f32`.
    Ademamix32,
    /// `state1..3`: `u8`; `absmax1..3`.
    Ademamix8,
    /// Quantized AdamW with these (effective) schemes: `state1` (m1) then `absmax1` when
    /// quantized, then `state2`/`absmax2` (m2). Codes are `u8[ceil(n / 2)]` packed nibbles
    /// (4-bit), `i8` of the parameter's shape (8-bit) or `f32` of the parameter's shape.
    QAdam {
        /// First-moment scheme.
        m1: MomentScheme,
        /// Second-moment scheme.
        m2: MomentScheme,
    },
}

impl Layout {
    /// The layout for a parameter of `numel` elements in a group of `kind` and `bits`;
    /// `m1_override` replaces a quantized-AdamW group's first-moment scheme for this parameter
    /// (ignored by other rules).
    pub fn choose(
        kind: &OptimizerKind,
        bits: StateBits,
        numel: usize,
        min_8bit_size: usize,
        m1_override: Option<MomentScheme>,
    ) -> Layout {
        if let Some(c) = kind.qadam() {
            return match bits {
                StateBits::Bits32 => Layout::QAdam {
                    m1: MomentScheme::Fp32,
                    m2: MomentScheme::Fp32,
                },
                StateBits::Bits8 => Layout::QAdam {
                    m1: m1_override.unwrap_or(c.m1).effective(numel),
                    m2: c.m2.effective(numel),
                },
            };
        }
        let eight = match bits {
            StateBits::Bits32 => false,
            StateBits::Bits8 => numel >= min_8bit_size,
        };
        match (kind.family(), eight) {
            (Family::Adam, false) => Layout::Adam32,
            (Family::Adam, true) => Layout::Adam8,
            (Family::One, false) => Layout::One32,
            (Family::One, true) => Layout::One8,
            (Family::Ademamix, false) => Layout::Ademamix32,
            (Family::Ademamix, true) => Layout::Ademamix8,
            (Family::QAdam, _) => Layout::QAdam {
                m1: MomentScheme::Fp32,
                m2: MomentScheme::Fp32,
            },
        }
    }

    /// How the state is stored, as [`Optimizer::state_layout`](super::Optimizer::state_layout)
    /// reports it: quantized AdamW reports each moment's (effective) scheme, so a 4-bit moment
    /// is reported as 4-bit.
    pub fn report(self) -> StateLayout {
        match self {
            Layout::Adam32 | Layout::One32 | Layout::Ademamix32 => StateLayout::Bits32,
            Layout::Adam8 | Layout::One8 | Layout::Ademamix8 => StateLayout::Bits8,
            Layout::QAdam { m1, m2 } => StateLayout::QAdamW { m1, m2 },
        }
    }

    /// Name in state files (`32bit` or `8bit`, the group's rule says which tensors; quantized
    /// AdamW: `qadamw:<m1 scheme>+<m2 scheme>`).
    pub fn name(self) -> String {
        match self.report() {
            StateLayout::Bits32 => "32bit".into(),
            StateLayout::Bits8 => "8bit".into(),
            StateLayout::QAdamW { m1, m2 } => format!("qadamw:{m1}+{m2}"),
        }
    }

    /// The zero (initial) state for `numel` elements.
    pub fn zeros(self, numel: usize) -> ParamState {
        match self {
            Layout::Adam32 => ParamState::Adam32(AdamState32::zeros(numel)),
            Layout::Adam8 => ParamState::Adam8(AdamState8::zeros(numel)),
            Layout::One32 => ParamState::One32(vec![0.0; numel]),
            Layout::One8 => ParamState::One8(Optim1State8::zeros(numel)),
            Layout::Ademamix32 => ParamState::Ademamix32(AdemamixState32::zeros(numel)),
            Layout::Ademamix8 => ParamState::Ademamix8(AdemamixState8::zeros(numel)),
            Layout::QAdam { m1, m2 } => ParamState::QAdam(QAdamState {
                m1: MomentState::initial(m1, numel),
                m2: MomentState::initial(m2, numel),
            }),
        }
    }

    /// Expected tensors `(suffix, dtype, shape)` for a parameter of `shape`: `stateK` (the
    /// parameter's shape, `f32` or `u8` codes) and, for 8-bit state, `absmaxK` (`f32`, one per
    /// 256-element block) after each.
    pub fn tensors(self, shape: &[usize]) -> Vec<(&'static str, Dtype, Vec<usize>)> {
        let numel: usize = shape.iter().product();
        let blocks = vec![numel.div_ceil(BLOCK)];
        let (count, eight) = match self {
            Layout::One32 => (1, false),
            Layout::One8 => (1, true),
            Layout::Adam32 => (2, false),
            Layout::Adam8 => (2, true),
            Layout::Ademamix32 => (3, false),
            Layout::Ademamix8 => (3, true),
            Layout::QAdam { m1, m2 } => return qadam_tensors(m1, m2, shape),
        };
        let states = ["state1", "state2", "state3"];
        let absmaxes = ["absmax1", "absmax2", "absmax3"];
        let mut out = Vec::new();
        for k in 0..count {
            if eight {
                out.push((states[k], Dtype::U8, shape.to_vec()));
                out.push((absmaxes[k], Dtype::F32, blocks.clone()));
            } else {
                out.push((states[k], Dtype::F32, shape.to_vec()));
            }
        }
        out
    }

    /// Builds the state from tensors in the order of [`Layout::tensors`] (already checked for
    /// dtype and shape).
    pub fn state_from(self, data: &[&[u8]]) -> ParamState {
        match self {
            Layout::Adam32 => ParamState::Adam32(AdamState32 {
                state1: bytes_f32(data[0]),
                state2: bytes_f32(data[1]),
            }),
            Layout::Adam8 => ParamState::Adam8(AdamState8 {
                state1: data[0].to_vec(),
                absmax1: bytes_f32(data[1]),
                state2: data[2].to_vec(),
                absmax2: bytes_f32(data[3]),
            }),
            Layout::One32 => ParamState::One32(bytes_f32(data[0])),
            Layout::One8 => ParamState::One8(Optim1State8 {
                state1: data[0].to_vec(),
                absmax1: bytes_f32(data[1]),
            }),
            Layout::Ademamix32 => ParamState::Ademamix32(AdemamixState32 {
                m1: bytes_f32(data[0]),
                nu: bytes_f32(data[1]),
                m2: bytes_f32(data[2]),
            }),
            Layout::Ademamix8 => ParamState::Ademamix8(AdemamixState8 {
                codes: std::array::from_fn(|k| data[2 * k].to_vec()),
                absmax: std::array::from_fn(|k| bytes_f32(data[2 * k + 1])),
            }),
            Layout::QAdam { m1, m2 } => {
                let mut next = data.iter();
                let mut moment = |scheme: MomentScheme| {
                    let codes = next.next().map_or_else(Vec::new, |d| d.to_vec());
                    let absmax = if scheme == MomentScheme::Fp32 {
                        Vec::new()
                    } else {
                        next.next().map_or_else(Vec::new, |d| bytes_f32(d))
                    };
                    MomentState {
                        scheme,
                        codes,
                        absmax,
                    }
                };
                let m1 = moment(m1);
                let m2 = moment(m2);
                ParamState::QAdam(QAdamState { m1, m2 })
            }
        }
    }
}

/// The tensors of a quantized-AdamW state (see [`Layout::QAdam`]).
fn qadam_tensors(
    m1: MomentScheme,
    m2: MomentScheme,
    shape: &[usize],
) -> Vec<(&'static str, Dtype, Vec<usize>)> {
    let numel: usize = shape.iter().product();
    let mut out = Vec::new();
    for (scheme, state, absmax) in [(m1, "state1", "absmax1"), (m2, "state2", "absmax2")] {
        let (codes, blocks) = scheme.state_lens(numel);
        match scheme.bits() {
            32 => out.push((state, Dtype::F32, shape.to_vec())),
            8 => {
                out.push((state, Dtype::I8, shape.to_vec()));
                out.push((absmax, Dtype::F32, vec![blocks]));
            }
            _ => {
                out.push((state, Dtype::U8, vec![codes]));
                out.push((absmax, Dtype::F32, vec![blocks]));
            }
        }
    }
    out
}

/// Calls `f` with each chunk of `chunk` elements (a multiple of the block) of the parameter and
/// gradient, its element range and its block range; copies the updated parameter back.
/// The update-norm partials of a whole parameter: `part` gives those of each chunk (elements
/// `r`, blocks `b`), which land at the chunk's blocks.
fn chunk_partials(
    params: &mut HostTensor,
    grads: &HostTensor,
    chunk: usize,
    mut part: impl FnMut(
        &mut HostTensor,
        &HostTensor,
        Range<usize>,
        Range<usize>,
    ) -> Result<NormPartials>,
) -> Result<NormPartials> {
    let mut parts = NormPartials::zeros(params.numel());
    for_chunks(params, grads, chunk, |p, g, r, b| {
        let c = part(p, g, r, b.clone())?;
        parts.unorm[b.clone()].copy_from_slice(&c.unorm);
        parts.pnorm[b].copy_from_slice(&c.pnorm);
        Ok(())
    })?;
    Ok(parts)
}

/// Runs `f(p, g, elements, blocks)` on each run of `chunk` elements of `params` and `grads`,
/// `p` a copy of the parameter's elements written back when `f` succeeds. A parameter of one
/// chunk is passed whole (its shape kept) and its gradient as it is: the finetuning adapters'
/// parameters, each one chunk, were copied three times a step.
fn for_chunks(
    params: &mut HostTensor,
    grads: &HostTensor,
    chunk: usize,
    mut f: impl FnMut(&mut HostTensor, &HostTensor, Range<usize>, Range<usize>) -> Result<()>,
) -> Result<()> {
    let n = params.numel();
    if n > 0 && n <= chunk {
        let mut p = params.clone();
        f(&mut p, grads, 0..n, 0..n.div_ceil(BLOCK))?;
        *params = p;
        return Ok(());
    }
    let size = params.dtype.size_bytes();
    let mut start = 0;
    while start < n {
        let end = (start + chunk).min(n);
        let bytes = start * size..end * size;
        let mut p = HostTensor::new(
            params.dtype,
            vec![end - start],
            params.data[bytes.clone()].to_vec(),
        )?;
        let g = HostTensor::new(
            grads.dtype,
            vec![end - start],
            grads.data[bytes.clone()].to_vec(),
        )?;
        f(&mut p, &g, start..end, start / BLOCK..end.div_ceil(BLOCK))?;
        params.data[bytes].copy_from_slice(&p.data);
        start = end;
    }
    Ok(())
}

impl ParamState {
    /// The state of elements `r` alone (`r.start` on a 256-element block; `r.end` on one or
    /// at the parameter's end): the state of a shard.
    pub fn slice(&self, r: &Range<usize>) -> ParamState {
        let b = r.start / BLOCK..r.end.div_ceil(BLOCK);
        match self {
            ParamState::Adam32(s) => ParamState::Adam32(AdamState32 {
                state1: s.state1[r.clone()].to_vec(),
                state2: s.state2[r.clone()].to_vec(),
            }),
            ParamState::Adam8(s) => ParamState::Adam8(adam8_chunk(s, r, &b)),
            ParamState::One32(s) => ParamState::One32(s[r.clone()].to_vec()),
            ParamState::One8(s) => ParamState::One8(one8_chunk(s, r, &b)),
            ParamState::Ademamix32(s) => ParamState::Ademamix32(AdemamixState32 {
                m1: s.m1[r.clone()].to_vec(),
                nu: s.nu[r.clone()].to_vec(),
                m2: s.m2[r.clone()].to_vec(),
            }),
            ParamState::Ademamix8(s) => ParamState::Ademamix8(AdemamixState8 {
                codes: std::array::from_fn(|k| s.codes[k][r.clone()].to_vec()),
                absmax: std::array::from_fn(|k| s.absmax[k][b.clone()].to_vec()),
            }),
            ParamState::QAdam(s) => ParamState::QAdam(QAdamState {
                m1: moment_chunk(&s.m1, r),
                m2: moment_chunk(&s.m2, r),
            }),
        }
    }

    /// The state's layout.
    pub fn layout(&self) -> Layout {
        match self {
            ParamState::Adam32(_) => Layout::Adam32,
            ParamState::Adam8(_) => Layout::Adam8,
            ParamState::One32(_) => Layout::One32,
            ParamState::One8(_) => Layout::One8,
            ParamState::Ademamix32(_) => Layout::Ademamix32,
            ParamState::Ademamix8(_) => Layout::Ademamix8,
            ParamState::QAdam(s) => Layout::QAdam {
                m1: s.m1.scheme,
                m2: s.m2.scheme,
            },
        }
    }

    /// The state tensors for a parameter of `shape`, in the order of [`Layout::tensors`].
    pub fn tensors(&self, shape: &[usize]) -> Vec<StateTensor> {
        let datas: Vec<Vec<u8>> = match self {
            ParamState::Adam32(s) => vec![f32_bytes(&s.state1), f32_bytes(&s.state2)],
            ParamState::Adam8(s) => vec![
                s.state1.clone(),
                f32_bytes(&s.absmax1),
                s.state2.clone(),
                f32_bytes(&s.absmax2),
            ],
            ParamState::One32(s) => vec![f32_bytes(s)],
            ParamState::One8(s) => vec![s.state1.clone(), f32_bytes(&s.absmax1)],
            ParamState::Ademamix32(s) => {
                vec![f32_bytes(&s.m1), f32_bytes(&s.nu), f32_bytes(&s.m2)]
            }
            ParamState::Ademamix8(s) => (0..3)
                .flat_map(|k| [s.codes[k].clone(), f32_bytes(&s.absmax[k])])
                .collect(),
            ParamState::QAdam(s) => {
                let mut out = Vec::new();
                for m in [&s.m1, &s.m2] {
                    out.push(m.codes.clone());
                    if m.scheme != MomentScheme::Fp32 {
                        out.push(f32_bytes(&m.absmax));
                    }
                }
                out
            }
        };
        self.layout()
            .tensors(shape)
            .into_iter()
            .zip(datas)
            .map(|((suffix, dtype, shape), data)| StateTensor {
                suffix,
                dtype,
                shape,
                data,
            })
            .collect()
    }

    /// One update of step `step` (1-based) in chunks of `chunk` elements (a multiple of the
    /// 256-element block). `rng` is the stochastic-rounding key `(seed, parameter id)`;
    /// `origin` is the index of `params`' first element in the whole parameter (a shard's
    /// first element, block-aligned; 0 unsharded), which keys the stochastic rounding.
    ///
    /// # Errors
    /// Any host op error; [`Error::Invalid`] if the state does not belong to `kind` (a bug).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        dev: &dyn Device,
        kind: &OptimizerKind,
        params: &mut HostTensor,
        grads: &HostTensor,
        step: u32,
        chunk: usize,
        (rng, origin): ((u64, u32), usize),
        opts: &GradOptions,
        max_unorm: f64,
    ) -> Result<()> {
        let layout = self.layout();
        let mismatch = || {
            Error::Invalid(format!(
                "{} state of layout {layout:?} does not fit the rule",
                kind.name()
            ))
        };
        match self {
            ParamState::Adam32(s) if kind.lamb().is_some() => {
                let h = kind.lamb().ok_or_else(mismatch)?;
                // Pass 1: the partials of every chunk (whole blocks), then one scale.
                let parts = chunk_partials(params, grads, chunk, |p, g, r, _| {
                    let c = AdamState32 {
                        state1: s.state1[r.clone()].to_vec(),
                        state2: s.state2[r].to_vec(),
                    };
                    lamb_norm_partials(dev, p, g, &c, h, step, opts)
                })?;
                let scale = norm_scale(dev, &parts, h.max_unorm)?;
                // Pass 2: the scaled update, chunk by chunk.
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    let mut c = AdamState32 {
                        state1: s.state1[r.clone()].to_vec(),
                        state2: s.state2[r.clone()].to_vec(),
                    };
                    lamb_update_32bit(dev, p, g, &mut c, h, step, scale, opts)?;
                    s.state1[r.clone()].copy_from_slice(&c.state1);
                    s.state2[r].copy_from_slice(&c.state2);
                    Ok(())
                })
            }
            ParamState::One32(s) if kind.lars().is_some() => {
                let h = kind.lars().ok_or_else(mismatch)?;
                let parts = chunk_partials(params, grads, chunk, |p, g, r, _| {
                    lars_norm_partials(dev, p, g, &s[r], h, step, opts)
                })?;
                let scale = norm_scale(dev, &parts, h.max_unorm)?;
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    lars_update_32bit(dev, p, g, &mut s[r], h, step, scale, opts)
                })
            }
            // 8-bit LAMB / LARS: as with 32-bit state, on the 8-bit state of each chunk (whole
            // blocks, so each chunk's absmax are its own blocks').
            ParamState::Adam8(s) if kind.lamb().is_some() => {
                let h = kind.lamb().ok_or_else(mismatch)?;
                let parts = chunk_partials(params, grads, chunk, |p, g, r, b| {
                    let c = adam8_chunk(s, &r, &b);
                    lamb8_norm_partials(dev, p, g, &c, h, step, opts)
                })?;
                let scale = norm_scale(dev, &parts, h.max_unorm)?;
                for_chunks(params, grads, chunk, |p, g, r, b| {
                    let mut c = adam8_chunk(s, &r, &b);
                    lamb_update_8bit(dev, p, g, &mut c, h, step, scale, opts)?;
                    put_adam8_chunk(s, &c, &r, &b);
                    Ok(())
                })
            }
            ParamState::One8(s) if kind.lars().is_some() => {
                let h = kind.lars().ok_or_else(mismatch)?;
                let parts = chunk_partials(params, grads, chunk, |p, g, r, b| {
                    let c = one8_chunk(s, &r, &b);
                    lars8_norm_partials(dev, p, g, &c, h, step, opts)
                })?;
                let scale = norm_scale(dev, &parts, h.max_unorm)?;
                for_chunks(params, grads, chunk, |p, g, r, b| {
                    let mut c = one8_chunk(s, &r, &b);
                    lars_update_8bit(dev, p, g, &mut c, h, step, scale, opts)?;
                    put_one8_chunk(s, &c, &r, &b);
                    Ok(())
                })
            }
            // RMSprop / Adagrad with `max_unorm`: partials of every chunk, one scale, then the
            // scaled update chunk by chunk (as LAMB / LARS).
            ParamState::One32(s) if max_unorm > 0.0 => {
                let (algo, h) = kind.one_state().ok_or_else(mismatch)?;
                let parts = chunk_partials(params, grads, chunk, |p, g, r, _| {
                    optim1_norm_partials(dev, algo, p, g, &s[r], h, step, opts)
                })?;
                let scale = optim1_norm_scale(dev, &parts, h, max_unorm)?;
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    optim1_update_scaled_32bit(dev, algo, p, g, &mut s[r], h, step, scale, opts)
                })
            }
            ParamState::Adam32(s) => {
                let (algo, h) = kind.adam().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    let mut c = AdamState32 {
                        state1: s.state1[r.clone()].to_vec(),
                        state2: s.state2[r.clone()].to_vec(),
                    };
                    adam_step_32bit(dev, algo, p, g, &mut c, h, step, opts)?;
                    s.state1[r.clone()].copy_from_slice(&c.state1);
                    s.state2[r].copy_from_slice(&c.state2);
                    Ok(())
                })
            }
            ParamState::Adam8(s) => {
                let (algo, h) = kind.adam().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, b| {
                    let mut c = adam8_chunk(s, &r, &b);
                    adam_step_8bit(dev, algo, p, g, &mut c, h, step, opts)?;
                    put_adam8_chunk(s, &c, &r, &b);
                    Ok(())
                })
            }
            ParamState::One32(s) => {
                let (algo, h) = kind.one_state().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    optim1_step_32bit(dev, algo, p, g, &mut s[r], h, step, opts)
                })
            }
            ParamState::One8(s) => {
                let (algo, h) = kind.one_state().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, b| {
                    let mut c = one8_chunk(s, &r, &b);
                    optim1_step_8bit(dev, algo, p, g, &mut c, h, step, opts)?;
                    put_one8_chunk(s, &c, &r, &b);
                    Ok(())
                })
            }
            ParamState::Ademamix32(s) => {
                let h = kind.ademamix().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    let mut c = AdemamixState32 {
                        m1: s.m1[r.clone()].to_vec(),
                        nu: s.nu[r.clone()].to_vec(),
                        m2: s.m2[r.clone()].to_vec(),
                    };
                    ademamix_step_32bit(dev, p, g, &mut c, h, step)?;
                    s.m1[r.clone()].copy_from_slice(&c.m1);
                    s.nu[r.clone()].copy_from_slice(&c.nu);
                    s.m2[r].copy_from_slice(&c.m2);
                    Ok(())
                })
            }
            ParamState::Ademamix8(s) => {
                let h = kind.ademamix().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, b| {
                    let mut c = AdemamixState8 {
                        codes: std::array::from_fn(|k| s.codes[k][r.clone()].to_vec()),
                        absmax: std::array::from_fn(|k| s.absmax[k][b.clone()].to_vec()),
                    };
                    ademamix_step_8bit(dev, p, g, &mut c, h, step)?;
                    for k in 0..3 {
                        s.codes[k][r.clone()].copy_from_slice(&c.codes[k]);
                        s.absmax[k][b.clone()].copy_from_slice(&c.absmax[k]);
                    }
                    Ok(())
                })
            }
            ParamState::QAdam(s) => {
                let c = kind.qadam().ok_or_else(mismatch)?;
                for_chunks(params, grads, chunk, |p, g, r, _| {
                    let offset = u32::try_from(origin + r.start)
                        .map_err(|_| Error::Invalid("parameter too large".into()))?;
                    let mut part = QAdamState {
                        m1: moment_chunk(&s.m1, &r),
                        m2: moment_chunk(&s.m2, &r),
                    };
                    let key = QAdamRng {
                        seed: rng.0,
                        param_id: rng.1,
                        offset,
                    };
                    qadamw_step(dev, p, g, &mut part, &c.hyper, step, key)?;
                    put_moment_chunk(&mut s.m1, &part.m1, &r);
                    put_moment_chunk(&mut s.m2, &part.m2, &r);
                    Ok(())
                })
            }
        }
    }
}

/// The part of an 8-bit Adam state covering elements `r` (blocks `b`).
fn adam8_chunk(s: &AdamState8, r: &Range<usize>, b: &Range<usize>) -> AdamState8 {
    AdamState8 {
        state1: s.state1[r.clone()].to_vec(),
        absmax1: s.absmax1[b.clone()].to_vec(),
        state2: s.state2[r.clone()].to_vec(),
        absmax2: s.absmax2[b.clone()].to_vec(),
    }
}

/// Writes an updated part of an 8-bit Adam state back.
fn put_adam8_chunk(s: &mut AdamState8, c: &AdamState8, r: &Range<usize>, b: &Range<usize>) {
    s.state1[r.clone()].copy_from_slice(&c.state1);
    s.absmax1[b.clone()].copy_from_slice(&c.absmax1);
    s.state2[r.clone()].copy_from_slice(&c.state2);
    s.absmax2[b.clone()].copy_from_slice(&c.absmax2);
}

/// Writes an updated part of an 8-bit one-state state back.
fn put_one8_chunk(s: &mut Optim1State8, c: &Optim1State8, r: &Range<usize>, b: &Range<usize>) {
    s.state1[r.clone()].copy_from_slice(&c.state1);
    s.absmax1[b.clone()].copy_from_slice(&c.absmax1);
}

/// The part of an 8-bit one-state state covering elements `r` (blocks `b`).
fn one8_chunk(s: &Optim1State8, r: &Range<usize>, b: &Range<usize>) -> Optim1State8 {
    Optim1State8 {
        state1: s.state1[r.clone()].to_vec(),
        absmax1: s.absmax1[b.clone()].to_vec(),
    }
}

/// Byte range of the codes and block range of the scales of elements `r` (block-aligned).
fn moment_ranges(m: &MomentState, r: &Range<usize>) -> (Range<usize>, Range<usize>) {
    let bs = (m.scheme.block() as usize).max(1);
    let blocks = r.start / bs..r.end.div_ceil(bs);
    match m.scheme.bits() {
        32 => (4 * r.start..4 * r.end, 0..0),
        8 => (r.clone(), blocks),
        _ => (r.start / 2..r.end.div_ceil(2), blocks),
    }
}

/// The part of a moment's state covering elements `r`.
fn moment_chunk(m: &MomentState, r: &Range<usize>) -> MomentState {
    let (c, b) = moment_ranges(m, r);
    MomentState {
        scheme: m.scheme,
        codes: m.codes[c].to_vec(),
        absmax: m.absmax[b].to_vec(),
    }
}

/// Writes an updated part back.
fn put_moment_chunk(m: &mut MomentState, part: &MomentState, r: &Range<usize>) {
    let (c, b) = moment_ranges(m, r);
    m.codes[c].copy_from_slice(&part.codes);
    m.absmax[b].copy_from_slice(&part.absmax);
}
