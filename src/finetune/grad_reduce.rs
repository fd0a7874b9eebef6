//! The data-parallel gradient all-reduce of `qforge finetune` in a fixed order
//! (`docs/distributed.md`, "Data parallel").
//!
//! A step's batch is split into `G` micro-batches (`--micro-batches`); rank `r` of `D` computes
//! micro-batches `r G/D .. (r+1) G/D`. Every rank gathers every micro-batch's gradients and
//! sums them in micro-batch order, `((g_0 + g_1) + g_2) + ...`, one `f32` addition per element
//! per micro-batch after the first, so the step's gradient (and so every later step) has the
//! same bits for every `D` dividing `G`. MPI's own `MPI_Allreduce` is not used: its order is the
//! library's choice.

use qforge_ir::DType;
use qforge_runtime::{Communicator, HostTensor};

use crate::error::{Error, Result};

/// One micro-batch's part of a step: its sum of squared errors (`f64`) and the gradient of
/// every parameter (`f32`, in the parameter list's order).
pub(super) struct MicroGrad {
    /// `sum (y - t)^2` over the micro-batch's outputs of every block.
    pub sq: f64,
    /// One `f32` gradient per parameter.
    pub grads: Vec<HostTensor>,
}

/// The step's gradient and squared error from every rank's micro-batches (`local`, in order):
/// gathered from all ranks, then summed in micro-batch order. `shapes` are the parameters'
/// shapes, the same on every rank.
///
/// # Errors
/// The all-gather's errors (ranks with different micro-batch counts or parameter shapes).
pub(super) fn all_reduce_in_order(
    comm: &dyn Communicator,
    local: &[MicroGrad],
    shapes: &[Vec<usize>],
) -> Result<(f64, Vec<HostTensor>)> {
    let mut bytes = Vec::new();
    for mb in local {
        bytes.extend_from_slice(&mb.sq.to_le_bytes());
        for g in &mb.grads {
            bytes.extend_from_slice(&g.data);
        }
    }
    let gathered = comm.all_gather(&bytes)?;
    let sizes: Vec<usize> = shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * 4)
        .collect();
    let per_micro = 8 + sizes.iter().sum::<usize>();
    if gathered.len() % per_micro != 0 || gathered.is_empty() {
        return Err(Error::Usage(format!(
            "finetune: the ranks' gradients do not split into micro-batches of {per_micro} bytes \
             ({} bytes gathered)",
            gathered.len()
        )));
    }
    let mut sq = 0.0f64;
    let mut sums: Vec<Vec<f32>> = Vec::new();
    for micro in gathered.chunks_exact(per_micro) {
        let (head, mut rest) = micro.split_at(8);
        sq += f64::from_le_bytes(head.try_into().expect("8 bytes"));
        let first = sums.is_empty();
        for (p, size) in sizes.iter().enumerate() {
            let (g, tail) = rest.split_at(*size);
            rest = tail;
            let values = g
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
            if first {
                sums.push(values.collect());
            } else {
                for (s, v) in sums[p].iter_mut().zip(values) {
                    *s += v;
                }
            }
        }
    }
    let grads = sums
        .iter()
        .zip(shapes)
        .map(|(s, shape)| HostTensor::from_f32_as(DType::F32, shape.clone(), s))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((sq, grads))
}
