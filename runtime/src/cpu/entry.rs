//! A compiled kernel's entry point and what a launch needs with it: the one place that calls
//! native kernel code, JIT-compiled or linked ahead of time.

use qforge_ir::cpu_abi::ArgLayout;
use std::sync::Arc;

use qforge_ir::Kernel;

/// The ABI of every compiled kernel (see `qforge_codegen::cranelift`).
pub type KernelFn = unsafe extern "C" fn(args: *const u64, begin: u32, end: u32);

/// A compiled kernel entry point: created by a JIT from a function lowered with a matching
/// [`ArgLayout`] (the code lives as long as the JIT), or from an ahead-of-time kernel's linked
/// symbol (`crate::aot`, code that lives as long as the program).
#[derive(Clone, Copy)]
pub(crate) struct Entry(KernelFn);

impl Entry {
    /// The entry at `address`.
    ///
    /// # Safety
    /// `address` must be the executable entry of a function with the kernel ABI
    /// (`extern "C" fn(*const u64, u32, u32)`) whose code outlives every use of the `Entry`.
    #[cfg(feature = "llvm")]
    pub(crate) unsafe fn from_address(address: usize) -> Self {
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
    pub(crate) unsafe fn run(self, args: &[u64], begin: u32, end: u32) {
        // SAFETY: the caller's contract. The code has no other side effects: it cannot trap
        // (integer division is guarded, loads are non-trapping by the contract) and calls
        // only pure math routines.
        unsafe { (self.0)(args.as_ptr(), begin, end) }
    }

    /// The entry of a kernel linked into the program.
    ///
    /// # Safety
    /// `f` must follow the kernel ABI for the layout it is launched with.
    pub(crate) unsafe fn from_fn(f: KernelFn) -> Self {
        Entry(f)
    }
}

/// A kernel ready to launch: its entry, argument layout and table data.
pub(crate) struct Compiled {
    /// The kernel it was compiled from (launch arguments are bound against it; a cache
    /// confirms hits with `==`).
    pub(crate) kernel: Arc<Kernel>,
    pub(crate) entry: Entry,
    pub(crate) layout: ArgLayout,
    /// Table data the code reads through `args`, owned here.
    pub(crate) tables: Vec<Vec<u32>>,
}
