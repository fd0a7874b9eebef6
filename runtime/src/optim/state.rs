//! Per-parameter state and the chunked update: the parameter is processed in chunks of whole
//! 256-element blocks, each copied into a small workspace, updated by the host op and copied
//! back. The kernels have no dependency across blocks, so the result is bit-identical to one
//! launch over the whole tensor.

use qforge_ir::library::{OptimAlgo, OPTIM_BLOCKSIZE};
use safetensors::Dtype;

use super::group::{OptimizerKind, StateBits};
use crate::device::Device;
use crate::error::Result;
use crate::ops::{adam_step_32bit, adam_step_8bit, AdamState32, AdamState8};
use crate::tensor::{bytes_f32, f32_bytes, HostTensor};

const BLOCK: usize = OPTIM_BLOCKSIZE as usize;

/// The state of one parameter (a new state layout is a new variant).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ParamState {
    /// Both moments in `f32`.
    Adam32(AdamState32),
    /// 8-bit blockwise moments.
    Adam8(AdamState8),
}

/// One named state tensor: suffix, safetensors dtype, shape, bytes.
pub(crate) struct StateTensor {
    pub suffix: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// The layout a parameter's state has: which tensors, dtypes and shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `state1`, `state2`: `f32`, the parameter's shape.
    Adam32,
    /// `state1`, `state2`: `u8`, the parameter's shape; `absmax1`, `absmax2`: `f32[blocks]`.
    Adam8,
}

impl Layout {
    /// The layout for a parameter of `numel` elements in a group of `kind` and `bits`.
    pub fn choose(
        kind: &OptimizerKind,
        bits: StateBits,
        numel: usize,
        min_8bit_size: usize,
    ) -> Layout {
        match kind {
            OptimizerKind::Adam(_) | OptimizerKind::AdamW(_) => match bits {
                StateBits::Bits32 => Layout::Adam32,
                StateBits::Bits8 if numel < min_8bit_size => Layout::Adam32,
                StateBits::Bits8 => Layout::Adam8,
            },
        }
    }

    /// Name in state files.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Adam32 => "32bit",
            Layout::Adam8 => "8bit",
        }
    }

    /// Parses [`Layout::name`].
    pub fn from_name(s: &str) -> Option<Layout> {
        [Layout::Adam32, Layout::Adam8]
            .into_iter()
            .find(|l| l.name() == s)
    }

    /// The zero (initial) state for `numel` elements.
    pub fn zeros(self, numel: usize) -> ParamState {
        match self {
            Layout::Adam32 => ParamState::Adam32(AdamState32::zeros(numel)),
            Layout::Adam8 => ParamState::Adam8(AdamState8::zeros(numel)),
        }
    }

    /// Expected tensors `(suffix, dtype, shape)` for a parameter of `shape`.
    pub fn tensors(self, shape: &[usize]) -> Vec<(&'static str, Dtype, Vec<usize>)> {
        let numel: usize = shape.iter().product();
        let blocks = vec![numel.div_ceil(BLOCK)];
        match self {
            Layout::Adam32 => vec![
                ("state1", Dtype::F32, shape.to_vec()),
                ("state2", Dtype::F32, shape.to_vec()),
            ],
            Layout::Adam8 => vec![
                ("state1", Dtype::U8, shape.to_vec()),
                ("absmax1", Dtype::F32, blocks.clone()),
                ("state2", Dtype::U8, shape.to_vec()),
                ("absmax2", Dtype::F32, blocks),
            ],
        }
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
        }
    }
}

impl ParamState {
    /// The state's layout.
    pub fn layout(&self) -> Layout {
        match self {
            ParamState::Adam32(_) => Layout::Adam32,
            ParamState::Adam8(_) => Layout::Adam8,
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
    /// 256-element block).
    pub fn update(
        &mut self,
        dev: &dyn Device,
        kind: &OptimizerKind,
        params: &mut HostTensor,
        grads: &HostTensor,
        step: u32,
        chunk: usize,
    ) -> Result<()> {
        let (algo, hyper) = match kind {
            OptimizerKind::Adam(h) => (OptimAlgo::Adam, h),
            OptimizerKind::AdamW(h) => (OptimAlgo::AdamW, h),
        };
        let n = params.numel();
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
            match self {
                ParamState::Adam32(s) => {
                    let mut c = AdamState32 {
                        state1: s.state1[start..end].to_vec(),
                        state2: s.state2[start..end].to_vec(),
                    };
                    adam_step_32bit(dev, algo, &mut p, &g, &mut c, hyper, step)?;
                    s.state1[start..end].copy_from_slice(&c.state1);
                    s.state2[start..end].copy_from_slice(&c.state2);
                }
                ParamState::Adam8(s) => {
                    let blocks = start / BLOCK..end.div_ceil(BLOCK);
                    let mut c = AdamState8 {
                        state1: s.state1[start..end].to_vec(),
                        absmax1: s.absmax1[blocks.clone()].to_vec(),
                        state2: s.state2[start..end].to_vec(),
                        absmax2: s.absmax2[blocks.clone()].to_vec(),
                    };
                    adam_step_8bit(dev, algo, &mut p, &g, &mut c, hyper, step)?;
                    s.state1[start..end].copy_from_slice(&c.state1);
                    s.absmax1[blocks.clone()].copy_from_slice(&c.absmax1);
                    s.state2[start..end].copy_from_slice(&c.state2);
                    s.absmax2[blocks].copy_from_slice(&c.absmax2);
                }
            }
            params.data[bytes].copy_from_slice(&p.data);
            start = end;
        }
        Ok(())
    }
}
