//! Probes of what a machine's arithmetic instructions compute, bit for bit, before a kernel
//! relies on them (`qforge probe`). A probe runs an instruction on generated inputs and compares
//! every result with candidate models written from the vendors' documentation; a model that
//! agrees on every case is what the numeric contract can build on (`docs/semantics.md`,
//! "bf16 dot-product instructions").

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
pub mod bf16_dot;
// Only the x86-64 probes draw inputs.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod cases;

/// Whether this process may run AMX-BF16: the CPU has it and the kernel gave the tile state
/// (asked once per process), else why not.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn amx_state() -> Result<(), bf16_dot::ProbeError> {
    static STATE: std::sync::OnceLock<Result<(), bf16_dot::ProbeError>> =
        std::sync::OnceLock::new();
    STATE.get_or_init(amx::request).clone()
}

/// Whether [`amx_state`] is `Ok`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn amx_available() -> bool {
    amx_state().is_ok()
}

/// The bench's AMX bf16 peak loop (`amx::peak_loop`), `None` where [`amx_available`] is false.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn amx_peak_loop(steps: u64) -> Option<f64> {
    // SAFETY: the tile state was granted to this process (`amx_available`).
    amx_available().then(|| unsafe { amx::peak_loop(steps) })
}
