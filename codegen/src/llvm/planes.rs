//! Lookups in 32-bit tables of 65 to 256 entries as four byte planes (AVX-512 VBMI,
//! [`super::LlvmOptions::x86_avx512_vbmi`]), 64 lanes per step: the 8-bit codes' decodes.
//!
//! Plane `p` of the table is byte `p` of every entry: 256 bytes, four vector constants. The
//! indices (clamped to the table, so below 256) are truncated to bytes, and each plane gives
//! `plane[index]` for 64 lanes with one byte permute: `vpermb` (64 entries),
//! `vpermi2b` (128 entries: index bits 0-6) or two `vpermi2b` and a select on bit 7 (256
//! entries). Four unpacks of bytes and four of 16-bit words put the planes' bytes back
//! together into the 64 entries. The unpacks work within 128-bit lanes, so they leave
//! element `16s + 4j + t` in dword `4j + t` of result `s` only if the index bytes are first
//! permuted (one `vpermb`) by `sigma(16j + 4s + t) = 16s + 4j + t`, which swaps the two 2-bit
//! fields `j` and `s`.
//!
//! Per 64 lanes of a 256-entry table: 1 + 8 permutes, 4 selects and 8 unpacks, against 32
//! two-source permutes and 28 selects for 32-entry chunks. Every lane reads the entry of its
//! index, so the bits are those of the scalar lookup.

use super::emit::Emitter;

/// A byte permute of one 64-byte table by the low 6 bits of each index byte.
const VPERMB: &str = "llvm.x86.avx512.permvar.qi.512";
/// A byte permute of two 64-byte tables by the low 7 bits of each index byte.
const VPERMI2B: &str = "llvm.x86.avx512.vpermi2var.qi.512";

/// The largest table the planes hold.
pub(super) const PLANE_TABLE: usize = 256;

/// `<64 x i32>` shuffle mask text of `f(q)` for `q` in `0..64`.
fn mask(f: impl Fn(u32) -> u32) -> String {
    let items: Vec<String> = (0..64).map(|q| format!("i32 {}", f(q))).collect();
    format!("<64 x i32> <{}>", items.join(", "))
}

/// The unpack of two `<64 x i8>` vectors within 128-bit lanes in units of `w` bytes (1: bytes,
/// 2: 16-bit words), the low (`high = false`) or high half of each lane's units: as a shuffle
/// mask over the 128 bytes of both operands.
fn unpack(w: u32, high: bool) -> String {
    mask(|q| {
        let (lane, at) = (q / 16, q % 16);
        let (unit, byte) = (at / w, at % w);
        let per_lane = 16 / w;
        let src = (unit / 2) + if high { per_lane / 2 } else { 0 };
        let from_b = unit % 2 == 1;
        16 * lane + src * w + byte + if from_b { 64 } else { 0 }
    })
}

impl Emitter<'_> {
    /// `data[index]` on `lanes` lanes (a multiple of 32; `index`: `i32` lanes already clamped
    /// to the table of 65 to [`PLANE_TABLE`] entries; smaller tables work too, but two-source
    /// dword permutes serve them as cheaply), 64 lanes at a time (see the module
    /// docs).
    pub(super) fn plane_lookup(&mut self, data: &[u32], index: &str, lanes: u32) -> String {
        let bt = "<64 x i8>";
        let entry = |j: usize| data[j.min(data.len() - 1)];
        let plane = |p: u32, from: usize| {
            let items: Vec<String> = (from..from + 64)
                .map(|j| format!("i8 {}", (entry(j) >> (8 * p)) as u8 as i8))
                .collect();
            format!("<{}>", items.join(", "))
        };
        let sigma: Vec<String> = (0..64u32)
            .map(|q| format!("i8 {}", 16 * ((q / 4) % 4) + 4 * (q / 16) + q % 4))
            .collect();
        let sigma = format!("<{}>", sigma.join(", "));
        let mut parts = Vec::new();
        for c in 0..lanes.div_ceil(64) {
            let n = (lanes - 64 * c).min(64);
            let idx = self.lanes_of(index, lanes, 64 * c, n);
            let narrow = self.ins(format!("trunc <{n} x i32> {idx} to <{n} x i8>"));
            let bytes = if n == 64 {
                narrow
            } else {
                let m: Vec<String> = (0..64).map(|q| format!("i32 {}", q.min(n))).collect();
                self.ins(format!(
                    "shufflevector <{n} x i8> {narrow}, <{n} x i8> zeroinitializer, <64 x i32> <{}>",
                    m.join(", ")
                ))
            };
            let at = self.call(VPERMB, bt, &[(bt, &bytes), (bt, &sigma)]);
            let high = (data.len() > 128)
                .then(|| self.ins(format!("icmp slt {bt} {at}, zeroinitializer")));
            let planes: Vec<String> = (0..4)
                .map(|p| {
                    if data.len() <= 64 {
                        let t = plane(p, 0);
                        return self.call(VPERMB, bt, &[(bt, &t), (bt, &at)]);
                    }
                    let (a, b) = (plane(p, 0), plane(p, 64));
                    let low = self.call(VPERMI2B, bt, &[(bt, &a), (bt, &at), (bt, &b)]);
                    match &high {
                        None => low,
                        Some(h) => {
                            let (a, b) = (plane(p, 128), plane(p, 192));
                            let up = self.call(VPERMI2B, bt, &[(bt, &a), (bt, &at), (bt, &b)]);
                            self.ins(format!("select <64 x i1> {h}, {bt} {up}, {bt} {low}"))
                        }
                    }
                })
                .collect();
            let shuffle = |e: &mut Self, x: &str, y: &str, m: &str| {
                e.ins(format!("shufflevector {bt} {x}, {bt} {y}, {m}"))
            };
            let (lo, hi) = (unpack(1, false), unpack(1, true));
            let w01 = [&lo, &hi].map(|m| shuffle(self, &planes[0], &planes[1], m));
            let w23 = [&lo, &hi].map(|m| shuffle(self, &planes[2], &planes[3], m));
            let (lo, hi) = (unpack(2, false), unpack(2, true));
            let mut words = Vec::new();
            for h in 0..2 {
                for m in [&lo, &hi] {
                    let d = shuffle(self, &w01[h], &w23[h], m);
                    words.push(self.ins(format!("bitcast {bt} {d} to <16 x i32>")));
                }
            }
            words.truncate(n as usize / 16);
            parts.push(self.concat(words, 16));
        }
        self.concat(parts, 64)
    }
}
