//! The routines compiled CPU code calls where the target lacks an instruction (Cranelift's
//! libcalls, named by `qforge_codegen::cranelift::libcall_name`): exact replacements for
//! `fma`, the rounding functions and `pshufb`. They are exported unmangled so that
//! ahead-of-time objects linked into a program find them; the JIT passes their addresses.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m128i;

// Replacements for the libm routines Cranelift calls where the host lacks an instruction (e.g.
// `fma` without the x86 FMA extension, `nearest`/`floor` without SSE4.1). Rust's versions are
// exact: `mul_add` is a single rounding, the others round to an integral value exactly.
#[no_mangle]
pub extern "C" fn qforge_fmaf(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}
#[no_mangle]
pub extern "C" fn qforge_floorf(x: f32) -> f32 {
    x.floor()
}
#[no_mangle]
pub extern "C" fn qforge_ceilf(x: f32) -> f32 {
    x.ceil()
}
#[no_mangle]
pub extern "C" fn qforge_truncf(x: f32) -> f32 {
    x.trunc()
}
#[no_mangle]
pub extern "C" fn qforge_nearbyintf(x: f32) -> f32 {
    x.round_ties_even()
}

/// `pshufb` for x86_64 CPUs without SSSE3: byte `i` of the result is 0 when bit 7 of `mask[i]`
/// is set, else `a[mask[i] & 15]`. (`__m128i` is passed in an xmm register, as Cranelift's
/// libcall does.)
#[cfg(target_arch = "x86_64")]
#[allow(improper_ctypes_definitions)]
#[no_mangle]
pub extern "C" fn qforge_pshufb(a: __m128i, mask: __m128i) -> __m128i {
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
