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
    let sizes: Vec<usize> = shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * 4)
        .collect();
    let per_micro = 8 + sizes.iter().sum::<usize>();
    let mut bytes = Vec::new();
    // One rank sums its own micro-batches' bytes in place; several gather everyone's first.
    let micro_batches: Vec<(f64, Vec<&[u8]>)> = if comm.size() == 1 {
        local
            .iter()
            .map(|mb| (mb.sq, mb.grads.iter().map(|g| &g.data[..]).collect()))
            .collect()
    } else {
        for mb in local {
            bytes.extend_from_slice(&mb.sq.to_le_bytes());
            for g in &mb.grads {
                bytes.extend_from_slice(&g.data);
            }
        }
        bytes = comm.all_gather(&bytes)?;
        bytes
            .chunks(per_micro)
            .map(|micro| {
                let (head, mut rest) = micro.split_at(8.min(micro.len()));
                let sq = f64::from_le_bytes(head.try_into().unwrap_or([0; 8]));
                let grads = sizes
                    .iter()
                    .map(|size| {
                        let (g, tail) = rest.split_at((*size).min(rest.len()));
                        rest = tail;
                        g
                    })
                    .collect();
                (sq, grads)
            })
            .collect()
    };
    let whole = |(_, grads): &(f64, Vec<&[u8]>)| {
        grads.len() == sizes.len() && grads.iter().zip(&sizes).all(|(g, s)| g.len() == *s)
    };
    if micro_batches.is_empty() || !micro_batches.iter().all(whole) {
        return Err(Error::Usage(format!(
            "finetune: the ranks' gradients do not split into micro-batches of {per_micro} bytes \
             ({} micro-batches, {} bytes gathered)",
            micro_batches.len(),
            bytes.len()
        )));
    }
    let mut sq = 0.0f64;
    let mut sums: Vec<Vec<f32>> = Vec::new();
    for (micro_sq, grads) in &micro_batches {
        sq += micro_sq;
        let first = sums.is_empty();
        for (p, g) in grads.iter().enumerate() {
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
