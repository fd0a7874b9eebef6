//! AMX on Linux x86-64 for the bf16 probe and the bench's bf16 peak: the process asks the kernel
//! for the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), then
//! `tdpbf16ps` runs on tiles loaded from memory. Inline assembly: Rust's AMX intrinsics are not
//! stable.

use std::arch::asm;

use super::bf16_dot::ProbeError;

/// `arch_prctl` code asking for permission to use an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_int = 0x1023;
/// The AMX tile data state component.
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether `/proc/cpuinfo` lists `flag` for this CPU.
fn cpu_flag(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == flag))
    })
}

/// Asks for the tile state (callers go through [`super::amx_state`], which asks once per
/// process).
///
/// # Errors
/// [`ProbeError::Unavailable`] when the CPU lacks AMX-TILE or AMX-BF16, or the kernel refuses.
pub(super) fn request() -> Result<(), ProbeError> {
    if !(cpu_flag("amx_tile") && cpu_flag("amx_bf16")) {
        return Err(ProbeError::Unavailable(
            "the CPU has no AMX-TILE and AMX-BF16 (tdpbf16ps)".into(),
        ));
    }
    // SAFETY: arch_prctl with an integer code and argument; no memory is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    if rc != 0 {
        return Err(ProbeError::Unavailable(format!(
            "the kernel refused the AMX tile state (arch_prctl: {})",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The 64-byte tile configuration (palette 1).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// Palette 1 with tiles `0..` of `rows[t]` rows of `colsb[t]` bytes (at most 16 and 64).
    fn new(colsb: &[u8], rows: &[u8]) -> TileConfig {
        let mut cfg = TileConfig([0; 64]);
        cfg.0[0] = 1;
        for (t, (&c, &r)) in colsb.iter().zip(rows).enumerate() {
            cfg.0[16 + 2 * t] = c;
            cfg.0[48 + t] = r;
        }
        cfg
    }
}

/// Row stride of every tile in memory: 64 bytes.
const STRIDE: usize = 64;

/// `acc` after one `tdpbf16ps` of the 16 x `2 * k_pairs` bf16 tile `a` (rows of `a`, bit
/// patterns) with the `k_pairs` x 16 pair tile `b` (row `k` holds the pairs of 16 columns).
///
/// # Safety
/// [`super::amx_state`] must have succeeded in this process; `k_pairs` is 1 to 16.
pub(super) unsafe fn tdpbf16ps(
    acc: [[f32; 16]; 16],
    a: &[[u16; 32]; 16],
    b: &[[u16; 32]; 16],
    k_pairs: u8,
) -> [[f32; 16]; 16] {
    let mut out = acc;
    let mut cfg = TileConfig([0; 64]);
    cfg.0[0] = 1; // palette
                  // Bytes per row (u16 at 16 + 2 t) and rows (u8 at 48 + t) of tiles 0 (acc), 1 (a), 2 (b).
    let colsb = [64, 4 * k_pairs, 64];
    let rows = [16, 16, k_pairs];
    for t in 0..3 {
        cfg.0[16 + 2 * t] = colsb[t];
        cfg.0[48 + t] = rows[t];
    }
    // SAFETY: the configuration is valid for palette 1 (rows <= 16, bytes per row <= 64); each
    // tile load reads `rows` rows of `colsb` bytes 64 bytes apart, inside `out`, `a` or `b`
    // (16 rows of 64 bytes each); the store writes 16 rows of 64 bytes into `out`; the tile
    // state is released before returning.
    unsafe {
        asm!(
            "ldtilecfg [{cfg}]",
            "tileloadd tmm0, [{c} + {s} * 1]",
            "tileloadd tmm1, [{a} + {s} * 1]",
            "tileloadd tmm2, [{b} + {s} * 1]",
            "tdpbf16ps tmm0, tmm1, tmm2",
            "tilestored [{c} + {s} * 1], tmm0",
            "tilerelease",
            cfg = in(reg) cfg.0.as_ptr(),
            c = in(reg) out.as_mut_ptr(),
            a = in(reg) a.as_ptr(),
            b = in(reg) b.as_ptr(),
            s = in(reg) STRIDE,
            options(nostack),
        );
    }
    out
}

/// The bench's bf16 peak loop: `steps` steps of 12 `tdpbf16ps`, 3 into each of 4 independent
/// 16 x 16 f32 tiles, every bf16 operand 1.0 (each instruction adds 32 to every output); returns
/// the sum of the 4 tiles' outputs (exact while each output stays below 2^24).
///
/// # Safety
/// [`super::amx_state`] must have succeeded in this process.
pub(super) unsafe fn peak_loop(steps: u64) -> f64 {
    let ones = [[0x3f80u16; 32]; 16];
    let mut out = [[[0.0f32; 16]; 16]; 4];
    let cfg = TileConfig::new(&[64; 6], &[16; 6]);
    if steps > 0 {
        // SAFETY: a valid palette-1 configuration of 6 tiles of 16 rows of 64 bytes; the
        // operand loads read the 16 rows of 64 bytes of `ones`, the stores write those of
        // `out[t]`; the tile state is released before returning.
        unsafe {
            asm!(
                "ldtilecfg [{cfg}]",
                "tileloadd tmm4, [{a} + {s} * 1]",
                "tileloadd tmm5, [{a} + {s} * 1]",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tdpbf16ps tmm1, tmm4, tmm5",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tdpbf16ps tmm3, tmm4, tmm5",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tdpbf16ps tmm1, tmm4, tmm5",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tdpbf16ps tmm3, tmm4, tmm5",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tdpbf16ps tmm1, tmm4, tmm5",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tdpbf16ps tmm3, tmm4, tmm5",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c0} + {s} * 1], tmm0",
                "tilestored [{c1} + {s} * 1], tmm1",
                "tilestored [{c2} + {s} * 1], tmm2",
                "tilestored [{c3} + {s} * 1], tmm3",
                "tilerelease",
                cfg = in(reg) cfg.0.as_ptr(),
                a = in(reg) ones.as_ptr(),
                c0 = in(reg) out[0].as_mut_ptr(),
                c1 = in(reg) out[1].as_mut_ptr(),
                c2 = in(reg) out[2].as_mut_ptr(),
                c3 = in(reg) out[3].as_mut_ptr(),
                s = in(reg) STRIDE,
                n = inout(reg) steps => _,
                options(nostack),
            );
        }
    }
    out.iter().flatten().flatten().map(|&x| f64::from(x)).sum()
}

/// `C = A B^T` for bf16 `a: [m, k]` (bit patterns, row-major) and `B: [n, k]` packed as
/// `pairs` ([`super::bf16_dot::Amx32Weight`]'s layout), `m`, `n` and `k` multiples of 32, on up
/// to `threads` threads (bands of 32 rows): every 16 x 16 tile of `C` starts at `-0.0` and
/// takes one instruction per 32 elements of `k` in increasing order. Each step loads two tiles
/// of `A` and two of `B` (1 KiB in one piece each) for four instructions (a 32 x 32 block of
/// `C`).
///
/// # Safety
/// [`super::amx_state`] must have succeeded in this process; `a` holds `m * k` elements and `pairs`
/// `n * k / 2`.
pub(super) unsafe fn gemm(
    a: &[u16],
    pairs: &[u32],
    (m, n, k): (usize, usize, usize),
    threads: usize,
) -> Vec<f32> {
    let panel = k / 2 * 16;
    let mut c = vec![-0.0f32; m * n];
    if m == 0 || n == 0 {
        return c;
    }
    // Tiles 0-3: C (16 rows of 16 f32); 4, 5: A (16 rows of 32 bf16); 6, 7: B (16 pair rows).
    let cfg = TileConfig::new(&[64; 8], &[16; 8]);
    let bands = m / 32;
    let per_thread = bands.div_ceil(threads.clamp(1, bands.max(1)));
    let pairs = &pairs;
    let cfg = &cfg;
    std::thread::scope(|s| {
        for (t, band) in c.chunks_mut(per_thread * 32 * n).enumerate() {
            s.spawn(move || {
                for (r, rows) in band.chunks_mut(32 * n).enumerate() {
                    let i0 = (t * per_thread + r) * 32;
                    for j0 in (0..n).step_by(32) {
                        let base = rows.as_mut_ptr();
                        let at = |i: usize, j: usize| base.wrapping_add(i * n + j0 + j);
                        let (c00, c01, c10, c11) = (at(0, 0), at(0, 16), at(16, 0), at(16, 16));
                        let a0 = a[i0 * k..].as_ptr();
                        let a1 = a[(i0 + 16) * k..].as_ptr();
                        let b0 = pairs.as_ptr().wrapping_add((j0 / 16) * panel);
                        let b1 = pairs.as_ptr().wrapping_add((j0 / 16 + 1) * panel);
                        // SAFETY: a valid palette-1 configuration of 8 tiles of 16 rows of 64
                        // bytes. C tiles: 16 rows `4 n` bytes apart from rows `i0`, `i0 + 16`
                        // and columns `j0`, `j0 + 16` of this band, inside it (`j0 + 32 <=
                        // n`). A tiles: 16 rows `2 k` bytes apart from `a[i0][0]`, `a[i0 +
                        // 16][0]`, advanced 64 bytes per step for `k / 32` steps: inside `a`
                        // (`i0 + 32 <= m`). B tiles: 1 KiB contiguous per step inside their
                        // panels of `4 panel` bytes. The tile state is released at the end.
                        unsafe {
                            asm!(
                                "ldtilecfg [{cfg}]",
                                "tileloadd tmm0, [{c00} + {cs} * 1]",
                                "tileloadd tmm1, [{c01} + {cs} * 1]",
                                "tileloadd tmm2, [{c10} + {cs} * 1]",
                                "tileloadd tmm3, [{c11} + {cs} * 1]",
                                "test {steps}, {steps}",
                                "jz 3f",
                                "2:",
                                "tileloadd tmm4, [{a0} + {as_} * 1]",
                                "tileloadd tmm5, [{a1} + {as_} * 1]",
                                "tileloadd tmm6, [{b0} + {bs} * 1]",
                                "tileloadd tmm7, [{b1} + {bs} * 1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                "add {a0}, 64",
                                "add {a1}, 64",
                                "add {b0}, 1024",
                                "add {b1}, 1024",
                                "dec {steps}",
                                "jnz 2b",
                                "3:",
                                "tilestored [{c00} + {cs} * 1], tmm0",
                                "tilestored [{c01} + {cs} * 1], tmm1",
                                "tilestored [{c10} + {cs} * 1], tmm2",
                                "tilestored [{c11} + {cs} * 1], tmm3",
                                "tilerelease",
                                cfg = in(reg) cfg.0.as_ptr(),
                                c00 = in(reg) c00,
                                c01 = in(reg) c01,
                                c10 = in(reg) c10,
                                c11 = in(reg) c11,
                                a0 = inout(reg) a0 => _,
                                a1 = inout(reg) a1 => _,
                                b0 = inout(reg) b0 => _,
                                b1 = inout(reg) b1 => _,
                                cs = in(reg) 4 * n,
                                as_ = in(reg) 2 * k,
                                bs = in(reg) STRIDE,
                                steps = inout(reg) k / 32 => _,
                                options(nostack),
                            );
                        }
                    }
                }
            });
        }
    });
    c
}
