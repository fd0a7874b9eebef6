//! The thin layer over cudarc's driver bindings that must never panic: finding `libcuda`
//! before cudarc's lazy loader would (it panics when the library is missing), the driver
//! version, readable driver errors, the PTX JIT's error log, and a guard that turns any panic
//! left inside cudarc (a missing symbol in an old driver, a `CString` unwrap) into an error.

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

/// The oldest driver that accepts the PTX backend's `.version 8.0` modules (CUDA 12.0), as
/// `cuDriverGetVersion` reports it (`1000 * major + 10 * minor`).
pub(super) const MIN_DRIVER_VERSION: c_int = 12000;

/// Checks that the CUDA driver library can be opened, without touching cudarc's loader (which
/// panics when the library is missing).
///
/// # Errors
/// A message naming the library and the names that were tried.
pub(crate) fn probe_library() -> Result<(), String> {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names and closes them.
    let present = guard(|| Ok(unsafe { sys::is_culib_present() }))?;
    if present {
        Ok(())
    } else {
        let mut tried = cudarc::get_lib_name_candidates("cuda");
        tried.sort();
        tried.dedup();
        Err(format!(
            "CUDA driver not found (libcuda.so): none of libcuda.so.1, libcuda.so and {} other \
             names loads; install the NVIDIA driver (CUDA 12.0 or later) or put libcuda on \
             LD_LIBRARY_PATH",
            tried.len().saturating_sub(2)
        ))
    }
}

/// The version of the loaded driver (`1000 * major + 10 * minor`).
///
/// # Errors
/// The driver's error, described.
pub(super) fn driver_version() -> Result<c_int, String> {
    guard(|| {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer for the call.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(|e| describe(&e))?;
        Ok(v)
    })
}

/// `Ok` when `version` (as [`driver_version`] reports it) can load the PTX backend's modules.
///
/// # Errors
/// A message naming the driver's CUDA version and the one needed.
pub(super) fn check_driver_version(version: c_int) -> Result<(), String> {
    if version >= MIN_DRIVER_VERSION {
        Ok(())
    } else {
        Err(format!(
            "the CUDA driver supports CUDA {}.{}, but PTX ISA 8.0 modules need CUDA 12.0 or \
             later (update the NVIDIA driver)",
            version / 1000,
            (version % 1000) / 10
        ))
    }
}

/// `CUDA_ERROR_NAME: description` of a driver error (falls back to the numeric code).
pub(crate) fn describe(e: &DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("CUresult {}", e.0 as u32));
    match e.error_string() {
        Ok(s) => format!("{name}: {}", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Runs `f`, turning a panic inside it (cudarc's loader panics on a missing symbol) into an
/// error message instead of unwinding through the caller.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("the CUDA bindings failed: {what}"))
        }
    }
}

/// Loads `ptx` once more through `cuModuleLoadDataEx` only to collect the JIT compiler's error
/// log, after `cuModuleLoadData` failed (the context must be current). Returns the log's text,
/// empty when the driver wrote none.
pub(super) fn jit_error_log(ptx: &str) -> String {
    let Ok(source) = std::ffi::CString::new(ptx) else {
        return "the PTX text contains a NUL byte".into();
    };
    let mut log = vec![0u8; 16 * 1024];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let loaded = guard(|| {
        // SAFETY: `source` is NUL-terminated PTX; `options` and `values` have the same length
        // and the log buffer outlives the call; a module that loads is unloaded at once.
        unsafe {
            let r = sys::cuModuleLoadDataEx(
                &mut module,
                source.as_ptr() as *const c_void,
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            );
            if r == sys::CUresult::CUDA_SUCCESS && !module.is_null() {
                let _ = sys::cuModuleUnload(module);
            }
        }
        Ok(())
    });
    if let Err(e) = loaded {
        return e;
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    String::from_utf8_lossy(&log[..end]).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_versions_below_cuda_12_are_refused_with_the_version() {
        assert!(check_driver_version(12000).is_ok());
        assert!(check_driver_version(13010).is_ok());
        let e = check_driver_version(11080).expect_err("11.8 is too old");
        assert!(e.contains("CUDA 11.8") && e.contains("12.0"), "{e}");
    }

    #[test]
    fn guard_turns_a_panic_into_an_error() {
        // The default hook prints the panic message; the guard must still return an error.
        let r: Result<(), String> = guard(|| panic!("Missing symbol cuFoo"));
        let e = r.expect_err("the panic becomes an error");
        assert!(e.contains("Missing symbol cuFoo"), "{e}");
        assert_eq!(guard(|| Ok(3)), Ok(3));
    }
}
