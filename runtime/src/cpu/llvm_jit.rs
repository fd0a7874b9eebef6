//! The LLVM JIT (feature `llvm`): parses the text that `qforge_codegen::llvm` emits, optimizes
//! it with LLVM's `default<O3>` pipeline for the host CPU (its name and every extension it has,
//! e.g. AVX-512, unless native features are off) and compiles it with MCJIT. One LLVM context
//! per device holds every module; the machine code lives until the device is dropped.
//!
//! LLVM keeps IEEE semantics without fast-math flags, which the backend never emits, so the
//! optimizer may vectorize and reorder independent work but never reassociates or contracts
//! floating-point arithmetic: the bits are those of the emitted code.

use std::sync::{Mutex, Once};

use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};
use inkwell::OptimizationLevel;

use super::entry::Entry;
use crate::error::{Error, Result};

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        device: "cpu-llvm".into(),
        message: message.into(),
    }
}

/// What the JIT holds; every LLVM object here belongs to `context`.
struct Inner {
    /// One engine per compiled module (they own the modules and their machine code). Declared
    /// before `context` and cleared in `Drop` before it is freed.
    engines: Vec<ExecutionEngine<'static>>,
    machine: TargetMachine,
    cpu: String,
    features: String,
    next_id: u64,
    /// Leaked box, freed in `Drop` after the engines.
    context: *mut Context,
}

// SAFETY: every use of the LLVM objects goes through the `Mutex` of `LlvmJit`, so no two
// threads use the context at once; LLVM contexts are not tied to a thread.
unsafe impl Send for Inner {}

/// The LLVM JIT of one device.
pub(super) struct LlvmJit {
    inner: Mutex<Inner>,
    /// Lanes of the vector code to emit for this host.
    lanes: u32,
    /// The target has AVX-512F (x86-64): permute lookups (`LlvmOptions::x86_avx512`).
    avx512: bool,
    /// The target also has AVX-512 VBMI: fused 4-bit decodes (`LlvmOptions::x86_avx512_vbmi`).
    vbmi: bool,
    /// The target has AVX2 (x86-64): small-table permute lookups (`LlvmOptions::x86_avx2`).
    avx2: bool,
}

static INIT: Once = Once::new();

impl LlvmJit {
    /// A JIT for the host CPU (`native_features`: its name and all its extensions, without
    /// the AVX-512 ones unless `avx512`; otherwise the architecture's baseline, e.g. x86-64
    /// with SSE2).
    pub(super) fn new(native_features: bool, avx512: bool) -> Result<Self> {
        let mut init_error = None;
        INIT.call_once(|| {
            if let Err(e) = Target::initialize_native(&InitializationConfig::default()) {
                init_error = Some(e);
            }
        });
        if let Some(e) = init_error {
            return Err(device_error(format!("LLVM native target: {e}")));
        }
        let triple = TargetMachine::get_default_triple();
        let target = Target::from_triple(&triple)
            .map_err(|e| device_error(format!("LLVM target for {triple}: {e}")))?;
        let (cpu, features) = if native_features {
            let features = TargetMachine::get_host_cpu_features().to_string();
            let features = if avx512 {
                features
            } else {
                features.replace("+avx512", "-avx512")
            };
            (TargetMachine::get_host_cpu_name().to_string(), features)
        } else {
            ("generic".to_string(), String::new())
        };
        let machine = target
            .create_target_machine(
                &triple,
                &cpu,
                &features,
                OptimizationLevel::Aggressive,
                RelocMode::Default,
                CodeModel::JITDefault,
            )
            .ok_or_else(|| device_error(format!("no LLVM target machine for {triple}")))?;
        let has = |f: &str| features.split(',').any(|x| x == format!("+{f}"));
        let avx512 = cfg!(target_arch = "x86_64") && has("avx512f");
        let vbmi = avx512 && has("avx512vbmi");
        let avx2 = cfg!(target_arch = "x86_64") && has("avx2");
        let lanes = if has("avx512f") {
            16
        } else if has("avx2") {
            8
        } else {
            4
        };
        // A tuning override.
        let lanes = match std::env::var_os("QFORGE_LLVM_LANES") {
            None => lanes,
            Some(v) => v
                .to_str()
                .and_then(|s| s.trim().parse().ok())
                .filter(|l| qforge_codegen::llvm::supported_lanes(*l))
                .ok_or_else(|| {
                    device_error(format!(
                        "QFORGE_LLVM_LANES={v:?}: expected 0 (scalar code) or a power of two \
                         from 4 to 64"
                    ))
                })?,
        };
        let context = Box::into_raw(Box::new(Context::create()));
        Ok(LlvmJit {
            inner: Mutex::new(Inner {
                engines: Vec::new(),
                machine,
                cpu,
                features,
                next_id: 0,
                context,
            }),
            lanes,
            avx512,
            vbmi,
            avx2,
        })
    }

    /// The vector lanes to lower kernels with on this host.
    pub(super) fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Whether kernels may use AVX-512F intrinsics on this host.
    pub(super) fn avx512(&self) -> bool {
        self.avx512
    }

    /// Whether kernels may use AVX-512 VBMI intrinsics on this host.
    pub(super) fn vbmi(&self) -> bool {
        self.vbmi
    }

    /// Whether kernels may use AVX2 intrinsics on this host.
    pub(super) fn avx2(&self) -> bool {
        self.avx2
    }

    /// Optimizes and compiles the LLVM IR text of one kernel (a `Target::LlvmIr` artifact)
    /// into executable memory; `entry` is the function the artifact's launch names.
    pub(super) fn compile(&self, name: &str, text: &str, entry: &str) -> Result<Entry> {
        let mut guard = self
            .inner
            .lock()
            .map_err(|_| device_error("LLVM JIT lock poisoned"))?;
        let inner = &mut *guard;
        inner.next_id += 1;
        // SAFETY: the context lives until `Drop` frees it after every engine, and it is used
        // only under the lock.
        let context: &'static Context = unsafe { &*inner.context };
        let module_name = format!("qforge_{}_{name}", inner.next_id);
        let buffer = MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), &module_name);
        let module = context.create_module_from_ir(buffer).map_err(|e| {
            device_error(format!(
                "kernel '{name}': LLVM rejected the emitted IR: {e}"
            ))
        })?;
        module.set_triple(&inner.machine.get_triple());
        module.set_data_layout(&inner.machine.get_target_data().get_data_layout());
        let function = module
            .get_function(entry)
            .ok_or_else(|| device_error(format!("kernel '{name}': no entry function '{entry}'")))?;
        for (key, value) in [
            ("target-cpu", &inner.cpu),
            ("target-features", &inner.features),
        ] {
            if !value.is_empty() {
                function.add_attribute(
                    AttributeLoc::Function,
                    context.create_string_attribute(key, value),
                );
            }
        }
        module
            .run_passes("default<O3>", &inner.machine, PassBuilderOptions::create())
            .map_err(|e| device_error(format!("kernel '{name}': LLVM passes: {e}")))?;
        let engine = module
            .create_jit_execution_engine(OptimizationLevel::Aggressive)
            .map_err(|e| device_error(format!("kernel '{name}': LLVM JIT: {e}")))?;
        let address = engine
            .get_function_address(entry)
            .map_err(|e| device_error(format!("kernel '{name}': {e:?}")))?;
        inner.engines.push(engine);
        // SAFETY: `address` is the compiled entry of a function with the kernel ABI
        // `void(i64*, i32, i32)` in the C calling convention; its engine is kept in `engines`.
        Ok(unsafe { Entry::from_address(address) })
    }
}

impl Drop for LlvmJit {
    fn drop(&mut self) {
        let inner = match self.inner.get_mut() {
            Ok(i) => i,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Engines (and their modules and code) first, then the context they belong to.
        inner.engines.clear();
        // SAFETY: `context` came from `Box::into_raw` in `new` and nothing refers to it now.
        drop(unsafe { Box::from_raw(inner.context) });
    }
}
