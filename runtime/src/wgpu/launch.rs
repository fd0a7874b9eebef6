//! One launch on the wgpu device: storage buffers per [`qforge_codegen::wgsl::WgslLayout`]
//! (narrow element types padded to whole `u32` words, at least 4 bytes), the `Params` uniform,
//! the dispatch, and the readback of every writable buffer.

use std::sync::mpsc;

use qforge_codegen::wgsl::WgslLayout;
use qforge_ir::{Arg, Binding, Scalar};
use wgpu::util::DeviceExt;

use super::{Compiled, WgpuDevice};
use crate::error::Result;

/// A storage buffer of a launch and, for a writable one, where its result is read back.
struct Bound {
    param: usize,
    storage: wgpu::Buffer,
    readback: Option<wgpu::Buffer>,
    size: u64,
}

/// The byte size of a device buffer holding `len` host bytes: whole words, at least one.
fn padded(len: usize) -> u64 {
    (len.div_ceil(4).max(1) * 4) as u64
}

/// The `Params` uniform bytes: each scalar's 32 bits at its offset, `qf_zero` left 0.
fn params_bytes(layout: &WgslLayout, args: &[Arg<'_>]) -> Vec<u8> {
    let mut bytes = vec![0u8; layout.params_size as usize];
    for field in &layout.scalars {
        let bits = match args.get(field.param) {
            Some(Arg::Scalar(Scalar::F32(b))) | Some(Arg::Scalar(Scalar::U32(b))) => *b,
            Some(Arg::Scalar(Scalar::I32(v))) => *v as u32,
            Some(Arg::Scalar(Scalar::Bool(v))) => *v as u32,
            // `bind` already checked every argument's kind.
            Some(Arg::Read(_)) | Some(Arg::Write(_)) | None => 0,
        };
        let at = field.offset as usize;
        bytes[at..at + 4].copy_from_slice(&bits.to_le_bytes());
    }
    debug_assert!(layout.zero_offset + 4 <= layout.params_size);
    bytes
}

/// Runs `compiled` on `args` (already checked by `bind`, giving `binding`).
pub(super) fn launch(
    dev: &WgpuDevice,
    compiled: &Compiled,
    binding: &Binding,
    args: &mut [Arg<'_>],
) -> Result<()> {
    let layout = &compiled.layout;
    let groups = WgslLayout::dispatch(binding.grid);
    if groups[0] == 0 {
        return Ok(());
    }
    let max_groups = dev.limits.max_compute_workgroups_per_dimension;
    if groups[0] > max_groups || groups[1] > max_groups {
        return Err(dev.err(format!(
            "'{}': grid {} needs {}x{} workgroups, more than the device's {max_groups} per \
             dimension",
            compiled.kernel.name, binding.grid, groups[0], groups[1]
        )));
    }
    let max_binding = dev
        .limits
        .max_storage_buffer_binding_size
        .min(dev.limits.max_buffer_size);
    for b in &layout.buffers {
        let len = match &args[b.param] {
            Arg::Read(x) => x.len(),
            Arg::Write(x) => x.len(),
            Arg::Scalar(_) => 0,
        };
        if padded(len) > max_binding {
            return Err(dev.err(format!(
                "'{}': buffer '{}' is {} bytes, more than the device's storage binding limit \
                 of {max_binding} bytes",
                compiled.kernel.name,
                b.name,
                padded(len)
            )));
        }
    }

    let what = format!("launching '{}'", compiled.kernel.name);
    let bound = dev.scoped(&what, || dispatch(dev, compiled, binding, args))?;
    let results = dev.scoped(&what, || read_back(dev, &bound))?;
    for (b, data) in bound.iter().zip(results) {
        if let (Some(data), Arg::Write(out)) = (data, &mut args[b.param]) {
            let n = out.len();
            out.copy_from_slice(&data[..n]);
        }
    }
    Ok(())
}

/// Uploads the buffers, records the dispatch and the copies to the readback buffers, submits.
fn dispatch(
    dev: &WgpuDevice,
    compiled: &Compiled,
    binding: &Binding,
    args: &[Arg<'_>],
) -> Result<Vec<Bound>> {
    let layout = &compiled.layout;
    let mut bound = Vec::with_capacity(layout.buffers.len());
    for b in &layout.buffers {
        let (bytes, writable): (&[u8], bool) = match &args[b.param] {
            Arg::Read(x) => (x, false),
            Arg::Write(x) => (x, true),
            Arg::Scalar(_) => (&[], false),
        };
        let size = padded(bytes.len());
        let mut contents = bytes.to_vec();
        contents.resize(size as usize, 0);
        let mut usage = wgpu::BufferUsages::STORAGE;
        if writable {
            usage |= wgpu::BufferUsages::COPY_SRC;
        }
        let storage = dev
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(&b.name),
                contents: &contents,
                usage,
            });
        let readback = writable.then(|| {
            dev.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&b.name),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        bound.push(Bound {
            param: b.param,
            storage,
            readback,
            size,
        });
    }
    let params = dev
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &params_bytes(layout, args),
            usage: wgpu::BufferUsages::UNIFORM,
        });
    let mut entries: Vec<wgpu::BindGroupEntry> = layout
        .buffers
        .iter()
        .zip(&bound)
        .map(|(b, x)| wgpu::BindGroupEntry {
            binding: b.binding,
            resource: x.storage.as_entire_binding(),
        })
        .collect();
    entries.push(wgpu::BindGroupEntry {
        binding: layout.params_binding,
        resource: params.as_entire_binding(),
    });
    let bind_group = dev.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(&compiled.kernel.name),
        layout: &compiled.bind_group_layout,
        entries: &entries,
    });
    let groups = WgslLayout::dispatch(binding.grid);
    let mut encoder = dev
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some(&compiled.kernel.name),
        });
    {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(&compiled.kernel.name),
            timestamp_writes: None,
        });
        pass.set_pipeline(&compiled.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
    for x in &bound {
        if let Some(rb) = &x.readback {
            encoder.copy_buffer_to_buffer(&x.storage, 0, rb, 0, x.size);
        }
    }
    dev.queue.submit([encoder.finish()]);
    Ok(bound)
}

/// Maps every readback buffer, waits for the device, and copies the words out.
fn read_back(dev: &WgpuDevice, bound: &[Bound]) -> Result<Vec<Option<Vec<u8>>>> {
    let (tx, rx) = mpsc::channel();
    let mut pending = 0;
    for (i, x) in bound.iter().enumerate() {
        if let Some(rb) = &x.readback {
            let tx = tx.clone();
            rb.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send((i, r.map_err(|e| e.to_string())));
            });
            pending += 1;
        }
    }
    drop(tx);
    dev.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| dev.err(format!("waiting for the device: {e}")))?;
    for _ in 0..pending {
        let (i, r) = rx
            .recv()
            .map_err(|_| dev.err("a buffer mapping was dropped unanswered".into()))?;
        r.map_err(|e| dev.err(format!("mapping buffer {i} for reading: {e}")))?;
    }
    let mut out = Vec::with_capacity(bound.len());
    for x in bound {
        match &x.readback {
            Some(rb) => {
                let data = {
                    let view = rb
                        .get_mapped_range(..)
                        .map_err(|e| dev.err(format!("reading a mapped buffer: {e}")))?;
                    view.to_vec()
                };
                rb.unmap();
                out.push(Some(data));
            }
            None => out.push(None),
        }
    }
    Ok(out)
}
