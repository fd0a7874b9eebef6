//! The LLVM JIT (feature `llvm`): parses the text that `qforge_codegen::llvm` emits, optimizes
//! it with LLVM's `default<O3>` pipeline for the host CPU (its name and every extension it has,
//! e.g. AVX-512, unless native features are off), compiles it to a native object and loads that
//! with ORC (`orc.rs`). Objects are kept in a disk cache (`jit_cache.rs`), so a kernel compiled
//! once on a machine loads in a fraction of a millisecond in every later process. The machine
//! code lives until the device is dropped.
//!
//! LLVM keeps IEEE semantics without fast-math flags, which the backend never emits, so the
//! optimizer may vectorize and reorder independent work but never reassociates or contracts
//! floating-point arithmetic: the bits are those of the emitted code.

use std::collections::HashMap;
use std::sync::{Mutex, Once};

use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
};
use inkwell::OptimizationLevel;

use super::entry::Entry;
use super::jit_cache::{self, JitCache, KeyParts};
use super::orc::Orc;
use super::perf_map;
use crate::error::{Error, Result};

/// The optimization pipeline every kernel runs (part of the cache key).
const PIPELINE: &str = "default<O3>";

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        device: "cpu-llvm".into(),
        message: message.into(),
    }
}

/// What the JIT holds, used under the lock of `LlvmJit`.
struct Inner {
    /// Loads the objects; their code lives as long as it does.
    orc: Orc,
    /// The entry address of every object loaded, by its symbol (the cache key): one kernel
    /// text compiled twice on one device loads once.
    loaded: HashMap<String, u64>,
    /// The host's target machine (JIT code model), which writes the objects.
    machine: TargetMachine,
    cpu: String,
    features: String,
    /// The disk cache, `None` when off.
    cache: Option<JitCache>,
}

// SAFETY: every use of the LLVM objects goes through the `Mutex` of `LlvmJit`, so no two
// threads use them at once; target machines are not tied to a thread.
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
    /// with SSE2), keeping compiled objects in `cache` (`None`: compile every kernel).
    pub(super) fn new(
        native_features: bool,
        avx512: bool,
        cache: Option<JitCache>,
    ) -> Result<Self> {
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
        let orc = Orc::new().map_err(device_error)?;
        static PRUNE: Once = Once::new();
        if let Some(cache) = &cache {
            PRUNE.call_once(|| cache.prune(jit_cache::MAX_BYTES));
        }
        Ok(LlvmJit {
            inner: Mutex::new(Inner {
                orc,
                loaded: HashMap::new(),
                machine,
                cpu,
                features,
                cache,
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
    /// into executable memory, or loads its object from the disk cache; `entry` is the function
    /// the artifact's launch names.
    pub(super) fn compile(&self, name: &str, text: &str, entry: &str) -> Result<Entry> {
        let mut guard = self
            .inner
            .lock()
            .map_err(|_| device_error("LLVM JIT lock poisoned"))?;
        let inner = &mut *guard;
        let triple = inner.machine.get_triple();
        let key = jit_cache::key(
            &KeyParts {
                triple: &triple.as_str().to_string_lossy(),
                cpu: &inner.cpu,
                features: &inner.features,
                pipeline: PIPELINE,
                entry,
            },
            text,
        );
        // Each object's entry has its own symbol, so that objects share one ORC library.
        let symbol = format!("qforge_jit_{key}");
        let address = match inner.loaded.get(&symbol) {
            Some(&address) => address,
            None => {
                let cached = inner.cache.as_ref().and_then(|c| c.get(&key));
                let loaded = cached.and_then(|object| {
                    let address = inner.orc.load(&object, &symbol).ok()?;
                    Some((object, address))
                });
                let (object, address) = match loaded {
                    Some(loaded) => loaded,
                    // No entry, or one that does not load (e.g. written by an LLVM whose
                    // objects this one cannot link): compile, and replace it.
                    None => {
                        let object = inner.object(name, text, entry, &symbol)?;
                        if let Some(cache) = &inner.cache {
                            cache.put(&key, &object);
                        }
                        let address = inner
                            .orc
                            .load(&object, &symbol)
                            .map_err(|e| device_error(format!("kernel '{name}': {e}")))?;
                        (object, address)
                    }
                };
                perf_map::record(&object, &symbol, address, name);
                inner.loaded.insert(symbol, address);
                address
            }
        };
        // SAFETY: `address` is the compiled entry of a function with the kernel ABI
        // `void(i64*, i32, i32)` in the C calling convention; its code lives as long as `orc`.
        Ok(unsafe { Entry::from_address(address as usize) })
    }
}

impl Inner {
    /// The native object of kernel `name`'s LLVM IR `text`, optimized for the host, with the
    /// function `entry` renamed to `symbol`.
    fn object(&self, name: &str, text: &str, entry: &str, symbol: &str) -> Result<Vec<u8>> {
        let context = Context::create();
        let buffer = MemoryBuffer::create_from_memory_range_copy(text.as_bytes(), symbol);
        let module = context.create_module_from_ir(buffer).map_err(|e| {
            device_error(format!(
                "kernel '{name}': LLVM rejected the emitted IR: {e}"
            ))
        })?;
        module.set_triple(&self.machine.get_triple());
        module.set_data_layout(&self.machine.get_target_data().get_data_layout());
        let function = module
            .get_function(entry)
            .ok_or_else(|| device_error(format!("kernel '{name}': no entry function '{entry}'")))?;
        function.as_global_value().set_name(symbol);
        // Every function with a body (the entry and an outlined work item) gets the host's CPU.
        for f in module
            .get_functions()
            .filter(|f| f.count_basic_blocks() > 0)
        {
            for (key, value) in [
                ("target-cpu", &self.cpu),
                ("target-features", &self.features),
            ] {
                if !value.is_empty() {
                    f.add_attribute(
                        AttributeLoc::Function,
                        context.create_string_attribute(key, value),
                    );
                }
            }
        }
        module
            .run_passes(PIPELINE, &self.machine, PassBuilderOptions::create())
            .map_err(|e| device_error(format!("kernel '{name}': LLVM passes: {e}")))?;
        let object = self
            .machine
            .write_to_memory_buffer(&module, FileType::Object)
            .map_err(|e| device_error(format!("kernel '{name}': writing the object: {e}")))?;
        Ok(object.as_slice().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection};

    /// An entry that calls a helper the optimizer keeps out of line and places first, so the
    /// entry lies inside the code section, not at its start.
    const TWO_FUNCTIONS: &str = "
        define internal void @helper(i64* %p) noinline {
          store volatile i64 1, i64* %p
          ret void
        }
        define void @entry(i64* %a, i32 %b, i32 %c) {
          call void @helper(i64* %a)
          ret void
        }";

    #[test]
    fn a_perf_map_line_covers_the_loaded_code_section() {
        let jit = LlvmJit::new(true, false, None).expect("an LLVM JIT for the host");
        let mut inner = jit.inner.lock().unwrap();
        let symbol = "qforge_jit_perf_map_test";
        let object = inner
            .object("perf_map_test", TWO_FUNCTIONS, "entry", symbol)
            .unwrap();
        let address = inner.orc.load(&object, symbol).unwrap();
        let line = perf_map::line(&object, symbol, address, "perf\nmap").unwrap();
        let fields: Vec<&str> = line.trim_end().split(' ').collect();
        let [start, size, name] = fields[..] else {
            panic!("{line:?} is not `START SIZE NAME`");
        };
        assert_eq!(name, "qforge:perf_map", "one line, the newline replaced");
        let (start, size) = (
            u64::from_str_radix(start, 16).unwrap(),
            u64::from_str_radix(size, 16).unwrap(),
        );
        // The range is the whole loaded code section, the entry inside it past the helper.
        let file = object::File::parse(&*object).unwrap();
        let text = file
            .sections()
            .find(|s| s.kind() == object::SectionKind::Text && s.size() > 0)
            .unwrap();
        assert_eq!(size, text.size());
        assert!(start < address && address < start + size, "{line}");
        // What lies at `start` is the section's first bytes (the helper's, no relocation).
        let head = &text.data().unwrap()[..4];
        // SAFETY: `start .. start + size` is the loaded code, readable while `inner` lives.
        let loaded = unsafe { std::slice::from_raw_parts(start as *const u8, 4) };
        assert_eq!(loaded, head);
        assert_eq!(perf_map::line(b"not an object", symbol, address, "x"), None);
    }
}
