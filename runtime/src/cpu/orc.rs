//! LLVM's ORC `LLJIT` as a loader of native objects (feature `llvm`): the LLVM JIT writes each
//! kernel as an object (fresh, or from the disk cache of `jit_cache.rs`), and this links it into
//! executable memory and resolves its entry symbol. Calls the LLVM C API through `llvm-sys`,
//! which inkwell does not wrap for ORC.
//!
//! Undefined symbols of an object (libm routines LLVM calls where the CPU lacks an instruction)
//! resolve against the symbols of this process.

use std::ffi::{CStr, CString};

use llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy;
use llvm_sys::error::{LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage};
use llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcDisposeLLJIT, LLVMOrcLLJITAddObjectFileWithRT,
    LLVMOrcLLJITGetGlobalPrefix, LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITRef,
};
use llvm_sys::orc2::{
    LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess, LLVMOrcJITDylibAddGenerator,
    LLVMOrcJITDylibCreateResourceTracker, LLVMOrcReleaseResourceTracker,
    LLVMOrcResourceTrackerRemove,
};

/// The message of an LLVM error (`None` for success), consuming it.
fn take_error(error: LLVMErrorRef) -> Option<String> {
    if error.is_null() {
        return None;
    }
    // SAFETY: `error` is a live error; `LLVMGetErrorMessage` consumes it and returns a string
    // that we copy and then free with `LLVMDisposeErrorMessage`.
    unsafe {
        let message = LLVMGetErrorMessage(error);
        let text = CStr::from_ptr(message).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(message);
        Some(text)
    }
}

/// One `LLJIT` instance: the objects added to it stay loaded until it is dropped.
pub(super) struct Orc {
    jit: LLVMOrcLLJITRef,
}

// SAFETY: an `LLJIT` is thread-safe (its execution session locks itself), and the LLVM JIT
// uses it only under its mutex.
unsafe impl Send for Orc {}

impl Orc {
    /// An `LLJIT` for the host, whose main library also searches this process's symbols.
    ///
    /// # Errors
    /// LLVM's message when it cannot create the JIT (e.g. no native target).
    pub(super) fn new() -> Result<Self, String> {
        let mut jit: LLVMOrcLLJITRef = std::ptr::null_mut();
        // SAFETY: a null builder asks for the default one (the host's target machine builder);
        // on success `jit` is a live LLJIT owned by the returned value.
        if let Some(e) = take_error(unsafe { LLVMOrcCreateLLJIT(&mut jit, std::ptr::null_mut()) }) {
            return Err(format!("creating the ORC LLJIT: {e}"));
        }
        let orc = Orc { jit };
        let mut generator = std::ptr::null_mut();
        // SAFETY: `jit` is live; the generator is handed to its main library, which owns it.
        unsafe {
            let prefix = LLVMOrcLLJITGetGlobalPrefix(orc.jit);
            let error = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                &mut generator,
                prefix,
                None,
                std::ptr::null_mut(),
            );
            if let Some(e) = take_error(error) {
                return Err(format!("searching the process's symbols: {e}"));
            }
            LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(orc.jit), generator);
        }
        Ok(orc)
    }

    /// Links the native object `object` (for the host, any relocation model and code model
    /// RuntimeDyld supports) into executable memory and returns the address of its symbol
    /// `symbol`. An object that fails to load or link is removed again, so it defines nothing.
    ///
    /// # Errors
    /// LLVM's message when the object does not load (malformed, or a symbol already defined
    /// by an earlier object) or does not define `symbol`.
    pub(super) fn load(&mut self, object: &[u8], symbol: &str) -> Result<u64, String> {
        let name = CString::new(symbol).map_err(|_| format!("symbol {symbol:?} has a NUL"))?;
        // SAFETY: `jit` is live; the tracker owns what the object adds to the main library.
        let tracker =
            unsafe { LLVMOrcJITDylibCreateResourceTracker(LLVMOrcLLJITGetMainJITDylib(self.jit)) };
        // SAFETY: the buffer copies `object`; `LLVMOrcLLJITAddObjectFileWithRT` takes ownership
        // of it. The lookup links the object and writes its entry's address.
        let result = unsafe {
            let buffer = LLVMCreateMemoryBufferWithMemoryRangeCopy(
                object.as_ptr().cast(),
                object.len(),
                name.as_ptr(),
            );
            let mut address = 0u64;
            match take_error(LLVMOrcLLJITAddObjectFileWithRT(self.jit, tracker, buffer)) {
                Some(e) => Err(format!("loading the object: {e}")),
                None => match take_error(LLVMOrcLLJITLookup(self.jit, &mut address, name.as_ptr()))
                {
                    Some(e) => Err(format!("linking the object (symbol '{symbol}'): {e}")),
                    None if address == 0 => Err(format!("symbol '{symbol}' is at address 0")),
                    None => Ok(address),
                },
            }
        };
        // SAFETY: `tracker` is live. Removing it frees a failed object's definitions and
        // memory; releasing our reference keeps a loaded object loaded (the library holds it).
        unsafe {
            if result.is_err() {
                let _ = take_error(LLVMOrcResourceTrackerRemove(tracker));
            }
            LLVMOrcReleaseResourceTracker(tracker);
        }
        result
    }
}

impl Drop for Orc {
    fn drop(&mut self) {
        // SAFETY: `jit` is live and dropped once; it frees every loaded object's memory. An
        // error from tearing down has no one to report to.
        let _ = take_error(unsafe { LLVMOrcDisposeLLJIT(self.jit) });
    }
}
