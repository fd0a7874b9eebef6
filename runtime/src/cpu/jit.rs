//! The Cranelift JIT: one `JITModule` per device, the host ISA, the libcalls Cranelift may emit
//! on CPUs without the matching instructions, and the one place that calls compiled code.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cranelift_codegen::ir::{types, Function, LibCall};
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};

use crate::error::{Error, Result};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m128i;

/// The ABI of every compiled kernel (see `qforge_codegen::cranelift`).
type KernelFn = unsafe extern "C" fn(args: *const u64, begin: u32, end: u32);

/// A compiled kernel entry point. Only [`Jit`] creates one, from a function lowered with a
/// matching [`qforge_codegen::cranelift::ArgLayout`], and the code lives as long as the `Jit`.
#[derive(Clone, Copy)]
pub(super) struct Entry(KernelFn);

impl Entry {
    /// The entry at `address`.
    ///
    /// # Safety
    /// `address` must be the executable entry of a function with the kernel ABI
    /// (`extern "C" fn(*const u64, u32, u32)`) whose code outlives every use of the `Entry`.
    #[cfg(feature = "llvm")]
    pub(super) unsafe fn from_address(address: usize) -> Self {
        // SAFETY: the caller's contract.
        Entry(unsafe { std::mem::transmute::<usize, KernelFn>(address) })
    }

    /// Runs work items `begin..end` of a compiled kernel.
    ///
    /// # Safety
    /// The code must still be mapped (its JIT alive), and `args` must follow the `ArgLayout`
    /// the kernel was lowered with, built from live arguments that passed `qforge_ir::bind`:
    /// every buffer pointer valid for its whole byte length, writable buffers not accessed by
    /// anything else during the call (other threads running other work items of the same
    /// launch excepted: work items write disjoint elements by the IR's contract), the status
    /// word (bounds checks on) valid and private to this call. Without bounds checks, the
    /// kernel must also index every buffer in range.
    pub(super) unsafe fn run(self, args: &[u64], begin: u32, end: u32) {
        // SAFETY: the caller's contract. The code has no other side effects: it cannot trap
        // (integer division is guarded, loads are non-trapping by the contract) and calls
        // only pure math routines.
        unsafe { (self.0)(args.as_ptr(), begin, end) }
    }
}

/// The JIT module of one device.
pub(super) struct Jit {
    /// `None` only while dropping.
    module: Mutex<Option<JITModule>>,
    call_conv: CallConv,
    next_id: AtomicU64,
}

fn device_error(message: impl Into<String>) -> Error {
    Error::Device {
        device: "cpu".into(),
        message: message.into(),
    }
}

// Replacements for the libm routines Cranelift calls where the host lacks an instruction (e.g.
// `fma` without the x86 FMA extension, `nearest`/`floor` without SSE4.1). Rust's versions are
// exact: `mul_add` is a single rounding, the others round to an integral value exactly.
extern "C" fn qforge_fmaf(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
extern "C" fn qforge_floorf(x: f32) -> f32 {
    x.floor()
}
extern "C" fn qforge_ceilf(x: f32) -> f32 {
    x.ceil()
}
extern "C" fn qforge_truncf(x: f32) -> f32 {
    x.trunc()
}
extern "C" fn qforge_nearbyintf(x: f32) -> f32 {
    x.round_ties_even()
}

/// `pshufb` for x86_64 CPUs without SSSE3: byte `i` of the result is 0 when bit 7 of `mask[i]`
/// is set, else `a[mask[i] & 15]`. (`__m128i` is passed in an xmm register, as Cranelift's
/// libcall does.)
#[cfg(target_arch = "x86_64")]
#[allow(improper_ctypes_definitions)]
extern "C" fn qforge_pshufb(a: __m128i, mask: __m128i) -> __m128i {
    // SAFETY: `__m128i` and `[u8; 16]` have the same size and every bit pattern is valid.
    let (a, mask) = unsafe {
        (
            std::mem::transmute::<__m128i, [u8; 16]>(a),
            std::mem::transmute::<__m128i, [u8; 16]>(mask),
        )
    };
    let out: [u8; 16] = std::array::from_fn(|i| {
        if mask[i] & 0x80 != 0 {
            0
        } else {
            a[(mask[i] & 15) as usize]
        }
    });
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 16], __m128i>(out) }
}

fn libcall_name(call: LibCall) -> String {
    match call {
        LibCall::FmaF32 => "qforge_fmaf".into(),
        LibCall::FloorF32 => "qforge_floorf".into(),
        LibCall::CeilF32 => "qforge_ceilf".into(),
        LibCall::TruncF32 => "qforge_truncf".into(),
        LibCall::NearestF32 => "qforge_nearbyintf".into(),
        LibCall::X86Pshufb => "qforge_pshufb".into(),
        other => default_libcall_names()(other),
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
        let mut builder = JITBuilder::with_isa(isa, Box::new(libcall_name));
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

    /// The host's C calling convention, to lower kernels with.
    pub(super) fn call_conv(&self) -> CallConv {
        self.call_conv
    }

    /// Compiles a lowered kernel function into executable memory.
    pub(super) fn compile(&self, name: &str, function: Function) -> Result<Entry> {
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
        // `(i64, i32, i32)` in the host's C calling convention, i.e. `KernelFn`.
        Ok(Entry(unsafe {
            std::mem::transmute::<*const u8, KernelFn>(code)
        }))
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
