//! The Cranelift JIT: one `JITModule` per device, the host ISA, the libcalls Cranelift may emit
//! on CPUs without the matching instructions. It compiles the Cranelift IR text of
//! `Target::Clif` artifacts, parsed by `cranelift-reader`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cranelift_codegen::ir::{types, Function};
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module};

use super::entry::{Entry, KernelFn};
use super::libcalls::*;

use crate::error::{Error, Result};

/// The JIT module of one device.
pub(super) struct Jit {
    /// `None` only while dropping.
    module: Mutex<Option<JITModule>>,
    /// The host's C calling convention: the one the Clif text of `Target::Clif` declares
    /// (`CallConv::triple_default` of the host triple), checked by [`Jit::compile`].
    call_conv: CallConv,
    next_id: AtomicU64,
}

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        device: "cpu".into(),
        message: message.into(),
    }
}

impl Jit {
    /// A JIT for the host CPU, optimizing for speed, using all the host's instruction-set
    /// extensions when `native_features` is set, else only the architecture's baseline (x86_64:
    /// SSE2, so `fma` and the rounding instructions become calls to the routines above).
    pub(super) fn new(native_features: bool) -> Result<Self> {
        let mut flags = settings::builder();
        for (name, value) in [
            ("opt_level", "speed"),
            ("use_colocated_libcalls", "false"),
            ("is_pic", "false"),
        ] {
            flags
                .set(name, value)
                .map_err(|e| device_error(format!("Cranelift flag {name}: {e}")))?;
        }
        let isa = cranelift_native::builder_with_options(native_features)
            .map_err(|e| device_error(format!("host CPU not supported by Cranelift: {e}")))?
            .finish(settings::Flags::new(flags))
            .map_err(|e| device_error(format!("Cranelift ISA: {e}")))?;
        if isa.pointer_type() != types::I64 {
            return Err(device_error("the CPU device needs a 64-bit host"));
        }
        let call_conv = isa.default_call_conv();
        let mut builder =
            JITBuilder::with_isa(isa, Box::new(qforge_codegen::cranelift::libcall_name));
        builder.symbols([
            (
                "qforge_fmaf",
                qforge_fmaf as extern "C" fn(f32, f32, f32) -> f32 as *const u8,
            ),
            (
                "qforge_floorf",
                qforge_floorf as extern "C" fn(f32) -> f32 as *const u8,
            ),
            (
                "qforge_ceilf",
                qforge_ceilf as extern "C" fn(f32) -> f32 as *const u8,
            ),
            (
                "qforge_truncf",
                qforge_truncf as extern "C" fn(f32) -> f32 as *const u8,
            ),
            (
                "qforge_nearbyintf",
                qforge_nearbyintf as extern "C" fn(f32) -> f32 as *const u8,
            ),
        ]);
        #[cfg(target_arch = "x86_64")]
        builder.symbol("qforge_pshufb", qforge_pshufb as *const u8);
        Ok(Jit {
            module: Mutex::new(Some(JITModule::new(builder))),
            call_conv,
            next_id: AtomicU64::new(0),
        })
    }

    /// Parses the Cranelift IR text of a `Target::Clif` artifact (one function with the kernel
    /// ABI) and compiles it into executable memory.
    pub(super) fn compile(&self, name: &str, clif: &str) -> Result<Entry> {
        let mut functions = cranelift_reader::parse_functions(clif).map_err(|e| {
            device_error(format!(
                "kernel '{name}': cannot parse the Cranelift IR text of its clif artifact: {e}"
            ))
        })?;
        if functions.len() != 1 {
            return Err(device_error(format!(
                "kernel '{name}': the clif artifact holds {} functions, expected 1",
                functions.len()
            )));
        }
        let function = functions.remove(0);
        if function.signature.call_conv != self.call_conv {
            return Err(device_error(format!(
                "kernel '{name}': the clif artifact's calling convention is {}, the host's {}",
                function.signature.call_conv, self.call_conv
            )));
        }
        self.define(name, function)
    }

    /// Compiles a kernel function into executable memory.
    fn define(&self, name: &str, function: Function) -> Result<Entry> {
        let mut guard = self
            .module
            .lock()
            .map_err(|_| device_error("JIT lock poisoned"))?;
        let module = guard
            .as_mut()
            .ok_or_else(|| device_error("JIT already released"))?;
        let symbol = format!(
            "qforge_{}_{}",
            self.next_id.fetch_add(1, Ordering::Relaxed),
            name
        );
        let id = module
            .declare_function(&symbol, Linkage::Local, &function.signature)
            .map_err(|e| device_error(format!("kernel '{name}': {e}")))?;
        let mut ctx = module.make_context();
        ctx.func = function;
        module.define_function(id, &mut ctx).map_err(|e| {
            device_error(format!(
                "kernel '{name}': Cranelift compilation failed: {e:?}"
            ))
        })?;
        module.clear_context(&mut ctx);
        module
            .finalize_definitions()
            .map_err(|e| device_error(format!("kernel '{name}': {e}")))?;
        let code = module.get_finalized_function(id);
        // SAFETY: `code` is the finalized, executable entry of a function whose signature is
        // `(i64, i32, i32)` in the host's C calling convention, i.e. `KernelFn`, and it lives
        // as long as this JIT.
        Ok(unsafe { Entry::from_fn(std::mem::transmute::<*const u8, KernelFn>(code)) })
    }
}

impl Drop for Jit {
    fn drop(&mut self) {
        let module = match self.module.get_mut() {
            Ok(m) => m.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(module) = module {
            // SAFETY: dropping the `Jit` means no launch is running (launches borrow the
            // device) and no `Entry` outlives the device's cache, so no compiled code runs again.
            unsafe { module.free_memory() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty kernel function in `call_conv`.
    fn empty(call_conv: CallConv) -> String {
        format!(
            "function u0:0(i64, i32, i32) {call_conv} {{\nblock0(v0: i64, v1: i32, v2: i32):\n    \
             return\n}}\n"
        )
    }

    #[test]
    fn clif_text_is_parsed_checked_and_compiled() {
        let jit = Jit::new(true).expect("host JIT");
        let entry = jit
            .compile("empty", &empty(jit.call_conv))
            .expect("compiles");
        // SAFETY: the function takes no slot and does nothing.
        unsafe { entry.run(&[], 0, 4) };
        let other = if jit.call_conv == CallConv::WindowsFastcall {
            CallConv::SystemV
        } else {
            CallConv::WindowsFastcall
        };
        let message = |name: &str, text: &str| match jit.compile(name, text) {
            Ok(_) => panic!("'{name}' compiled"),
            Err(e) => e.to_string(),
        };
        let e = message("wrong_cc", &empty(other));
        assert!(
            e.contains("'wrong_cc'") && e.contains("calling convention"),
            "{e}"
        );
        let e = message("garbage", "function u0:0(");
        assert!(e.contains("'garbage'") && e.contains("cannot parse"), "{e}");
        let two = format!("{}{}", empty(jit.call_conv), empty(jit.call_conv));
        let e = message("two", &two);
        assert!(e.contains("'two'") && e.contains("2 functions"), "{e}");
    }
}
