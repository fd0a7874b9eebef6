//! Buffer loads and stores (little endian, `align 1`, with widening and narrowing), table
//! lookups, and the exact f16/bf16 <-> f32 conversions written with integer operations (on
//! scalars or lanes).

use qforge_ir::{DType, ParamId, Rounding, ScalarType, TableId, Value};

use super::emit::{internal, literal, ty, vec_of, Emitter};
use super::BACKEND;
use crate::error::{Error, Result};

/// The LLVM type of one stored element of `dtype`.
pub(super) fn elem_ty(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::I32 | DType::U32 => "i32",
        DType::U8 | DType::I8 => "i8",
        DType::F16 | DType::BF16 => "i16",
    }
}

/// Tables of at most this many entries are looked up in registers (see [`Emitter::lookup`]).
const SMALL_TABLE: usize = 16;

/// Largest table an AVX2 lookup reads with permutes (4 `vpermd` and 3 selects per 8 lanes);
/// a larger one is read one lane at a time.
const AVX2_PERMUTE_TABLE: usize = 32;

impl Emitter<'_> {
    /// A pointer of type `elem*` (`elem` may be a vector type) to element `index` (`i64`) of
    /// the buffer at `base` (`i8*`) holding `dtype` elements.
    pub(super) fn element_ptr(
        &mut self,
        base: &str,
        index: &str,
        dtype: DType,
        elem: &str,
    ) -> String {
        let size = dtype.size_bytes();
        let bytes = if size == 1 {
            index.to_string()
        } else {
            self.ins(format!("mul i64 {index}, {size}"))
        };
        let p = self.ins(format!("getelementptr i8, i8* {base}, i64 {bytes}"));
        self.ins(format!("bitcast i8* {p} to {elem}*"))
    }

    /// Emits the access `emit(pointer)` to element `index` (`i32`) of buffer `buf`; with
    /// bounds checks an index at or past the element count skips the access, reports the work
    /// item and yields `zero` (see [`Emitter::guarded`]).
    fn access(
        &mut self,
        buf: ParamId,
        index: &str,
        result: Option<(&str, &str)>,
        emit: impl FnOnce(&mut Self, String) -> Option<String>,
    ) -> Result<Option<String>> {
        let (base, count, dtype, _) = self.buffer(buf)?;
        let i64x = self.ins(format!("zext i32 {index} to i64"));
        match count {
            Some(count) => {
                let oob = self.ins(format!("icmp uge i64 {i64x}, {count}"));
                let (ty, zero) = result.unzip();
                self.guarded(&oob, ty, zero.unwrap_or(""), |e| {
                    let p = e.element_ptr(&base, &i64x, dtype, elem_ty(dtype));
                    emit(e, p)
                })
            }
            None => {
                let p = self.element_ptr(&base, &i64x, dtype, elem_ty(dtype));
                Ok(emit(self, p))
            }
        }
    }

    /// `buf[index]`, widened to the value type.
    pub(super) fn load(&mut self, buf: ParamId, index: &str) -> Result<String> {
        let (_, _, dtype, _) = self.buffer(buf)?;
        let vt = ty(dtype.value_type(), 1);
        let zero = literal(dtype.value_type(), 1, 0);
        self.access(buf, index, Some((&vt, &zero)), |e, p| {
            let raw = e.ins(format!("load {0}, {0}* {p}, align 1", elem_ty(dtype)));
            Some(e.widen(dtype, &raw, 1))
        })?
        .ok_or_else(|| internal("load without a value"))
    }

    /// `buf[base + index]` (or `buf[index]` without a `base`, all `i32`) without a bounds
    /// check, widened to the value type: only for an index proven in range without wrapping
    /// (see `Emitter::in_range`). The address is `(buf + base) + index` in 64 bits, so a `base`
    /// defined before the loop makes a row pointer that LLVM hoists out of it (one register
    /// per row instead of a 32-bit add and extension per element).
    pub(super) fn load_in_range(
        &mut self,
        buf: ParamId,
        base: Option<&str>,
        index: &str,
    ) -> Result<String> {
        let (mut ptr, _, dtype, _) = self.buffer(buf)?;
        if let Some(base) = base {
            let b64 = self.ins(format!("zext i32 {base} to i64"));
            ptr = self.element_ptr(&ptr, &b64, dtype, "i8");
        }
        let i64x = self.ins(format!("zext i32 {index} to i64"));
        let p = self.element_ptr(&ptr, &i64x, dtype, elem_ty(dtype));
        let raw = self.ins(format!("load {0}, {0}* {p}, align 1", elem_ty(dtype)));
        Ok(self.widen(dtype, &raw, 1))
    }

    /// Widens `lanes` raw elements of `dtype` to the value type: floats exactly to `f32`,
    /// `u8` by zero extension, `i8` by sign extension.
    pub(super) fn widen(&mut self, dtype: DType, raw: &str, lanes: u32) -> String {
        let i32t = vec_of("i32", lanes);
        let src = vec_of(elem_ty(dtype), lanes);
        match dtype {
            DType::F32 | DType::I32 | DType::U32 => raw.to_string(),
            DType::U8 => {
                let wide = self.ins(format!("zext {src} {raw} to {i32t}"));
                if lanes > 1 {
                    self.widened_bytes.insert(wide.clone(), raw.to_string());
                }
                wide
            }
            DType::I8 => self.ins(format!("sext {src} {raw} to {i32t}")),
            DType::F16 => {
                let h = self.ins(format!("zext {src} {raw} to {i32t}"));
                self.f16_to_f32(&h, lanes)
            }
            DType::BF16 => {
                let h = self.ins(format!("zext {src} {raw} to {i32t}"));
                let sixteen = literal(ScalarType::U32, lanes, 16);
                let bits = self.ins(format!("shl {i32t} {h}, {sixteen}"));
                self.ins(format!(
                    "bitcast {i32t} {bits} to {}",
                    vec_of("float", lanes)
                ))
            }
        }
    }

    /// `buf[index] = value`, narrowed to the dtype (`u8`/`i8` keep the low 8 bits, f16/bf16
    /// round as named).
    pub(super) fn store(
        &mut self,
        buf: ParamId,
        index: &str,
        value: &str,
        rounding: Option<Rounding>,
    ) -> Result<()> {
        let (_, _, dtype, _) = self.buffer(buf)?;
        let bits = self.narrow(dtype, rounding, value, 1)?;
        self.access(buf, index, None, |e, p| {
            e.line(format!(
                "store {0} {bits}, {0}* {p}, align 1",
                elem_ty(dtype)
            ));
            None
        })?;
        Ok(())
    }

    /// `lanes` values of the value type narrowed to the stored bits of `dtype` (`u8`/`i8`: the
    /// low 8 bits; f16/bf16: rounded as named).
    pub(super) fn narrow(
        &mut self,
        dtype: DType,
        rounding: Option<Rounding>,
        v: &str,
        lanes: u32,
    ) -> Result<String> {
        let (it, i8t, i16t) = (
            vec_of("i32", lanes),
            vec_of("i8", lanes),
            vec_of("i16", lanes),
        );
        let unsupported = |op: &str, r: Rounding| Error::Unsupported {
            backend: BACKEND,
            op: format!("{op} store with rounding {}", r.name()),
        };
        Ok(match (dtype, rounding) {
            (DType::F32 | DType::I32 | DType::U32, None) => v.to_string(),
            (DType::U8 | DType::I8, None) => self.ins(format!("trunc {it} {v} to {i8t}")),
            (DType::F16, Some(Rounding::NearestEven)) => {
                let h = self.f32_to_f16_rne(v, lanes);
                self.ins(format!("trunc {it} {h} to {i16t}"))
            }
            (DType::BF16, Some(Rounding::NearestEven)) => {
                let h = self.f32_to_bf16_rne(v, lanes);
                self.ins(format!("trunc {it} {h} to {i16t}"))
            }
            (DType::F16, Some(r)) => return Err(unsupported("f16", r)),
            (DType::BF16, Some(r)) => return Err(unsupported("bf16", r)),
            (DType::F16 | DType::BF16, None) => {
                return Err(internal("narrow float store without rounding"))
            }
            (DType::F32 | DType::I32 | DType::U32 | DType::U8 | DType::I8, Some(_)) => {
                return Err(internal("rounding on a store that does not round"))
            }
        })
    }

    /// `table[min(index, len - 1)]` on `lanes` lanes (`index`: `i32` lanes, the IR value
    /// `of`); a vector lookup is a gather from the table, which lies in memory the kernel owns.
    /// The clamp is left out when the ops prove `of < len` (`bounds.rs`; in a vector body,
    /// with its seed unbounded).
    pub(super) fn lookup(
        &mut self,
        table: TableId,
        index: &str,
        of: Value,
        lanes: u32,
    ) -> Result<String> {
        let t = self
            .k
            .tables
            .try_get(table)
            .ok_or_else(|| internal("missing table"))?;
        let last_entry = u32::try_from(t.data.len().saturating_sub(1)).unwrap_or(u32::MAX);
        let out = t.ty;
        if out == ScalarType::Bool {
            return Err(internal("bool table"));
        }
        let base = self
            .tables
            .get(table.index())
            .cloned()
            .ok_or_else(|| internal("missing table pointer"))?;
        let it = vec_of("i32", lanes);
        let clamped = if super::bounds::upper_bound(self.k, of, self.lanes_seed) <= last_entry {
            index.to_string()
        } else {
            let last = literal(ScalarType::U32, lanes, last_entry);
            let over = self.ins(format!("icmp ugt {it} {index}, {last}"));
            self.select(&over, ScalarType::U32, lanes, &last, index)
        };
        let bits = if lanes == 1 {
            let i = self.ins(format!("zext i32 {clamped} to i64"));
            let p = self.ins(format!("getelementptr i32, i32* {base}, i64 {i}"));
            self.ins(format!("load i32, i32* {p}, align 4"))
        } else if self.opts.x86_avx512_vbmi
            && lanes.is_multiple_of(32)
            && (65..=super::planes::PLANE_TABLE).contains(&t.data.len())
        {
            let data = t.data.clone();
            self.plane_lookup(&data, &clamped, lanes)
        } else if self.opts.x86_avx512
            && lanes.is_multiple_of(16)
            && t.data.len() <= super::PERMUTE_TABLE
        {
            let data = t.data.clone();
            self.permute_lookup_wide(&data, &clamped, lanes)
        } else if self.opts.x86_avx2
            && lanes.is_multiple_of(8)
            && t.data.len() <= AVX2_PERMUTE_TABLE
        {
            let data = t.data.clone();
            self.avx2_permute_lookup(&data, &clamped, lanes)
        } else if t.data.len() <= SMALL_TABLE {
            // The table as a vector constant, indexed lane by lane: a variable permute.
            let entries: Vec<String> = (0..SMALL_TABLE)
                .map(|j| format!("i32 {}", t.data[j.min(t.data.len() - 1)] as i32))
                .collect();
            let table_v = format!("<{SMALL_TABLE} x i32> <{}>", entries.join(", "));
            let mut acc = "undef".to_string();
            for l in 0..lanes {
                let at = self.ins(format!("extractelement {it} {clamped}, i32 {l}"));
                let x = self.ins(format!("extractelement {table_v}, i32 {at}"));
                acc = self.ins(format!("insertelement {it} {acc}, i32 {x}, i32 {l}"));
            }
            acc
        } else if !self.opts.x86_avx512 {
            self.lane_loads(&base, &clamped, lanes)
        } else {
            self.gather("i32", &base, &clamped, lanes, None)
        };
        self.bitcast(&bits, ScalarType::U32, out, lanes)
    }

    /// `data[index]` on a multiple of 16 lanes: [`Self::permute_lookup`] on each 16 of them.
    fn permute_lookup_wide(&mut self, data: &[u32], index: &str, lanes: u32) -> String {
        let parts: Vec<String> = (0..lanes / 16)
            .map(|p| {
                let part = self.lanes_of(index, lanes, 16 * p, 16);
                self.permute_lookup(data, &part)
            })
            .collect();
        self.concat(parts, 16)
    }

    /// `data[index]` on 16 lanes (`index`: `i32` lanes, already clamped to the table): each
    /// 32-entry chunk `c` of the table (two vector constants, the tail padded with the last
    /// entry) gives `chunk_c[index & 31]` with one two-source permute (`vpermi2d` ignores the
    /// index bits above 4), and a tree of selects on index bits 5, 6, ... picks chunk
    /// `index >> 5`. An unpaired chunk at the end of a tree level moves up unchanged: every
    /// index that reaches it has that level's bit clear. A table of at most 16 entries is one
    /// single-source permute (`vpermd`), which leaves its table register intact.
    fn permute_lookup(&mut self, data: &[u32], index: &str) -> String {
        const CHUNK: usize = 32;
        let vt = "<16 x i32>";
        let entry = |j: usize| data[j.min(data.len() - 1)] as i32;
        let half = |from: usize| {
            let e: Vec<String> = (from..from + 16)
                .map(|j| format!("i32 {}", entry(j)))
                .collect();
            format!("<{}>", e.join(", "))
        };
        if data.len() <= 16 {
            // One single-source permute (`vpermd`, index bits 0-3), which keeps its table.
            let table = half(0);
            return self.call(
                "llvm.x86.avx512.permvar.si.512",
                vt,
                &[(vt, &table), (vt, index)],
            );
        }
        let level: Vec<String> = (0..data.len().div_ceil(CHUNK))
            .map(|c| {
                let (lo, hi) = (half(c * CHUNK), half(c * CHUNK + 16));
                self.call(
                    "llvm.x86.avx512.vpermi2var.d.512",
                    vt,
                    &[(vt, &lo), (vt, index), (vt, &hi)],
                )
            })
            .collect();
        self.select_chunk(level, index, 16, CHUNK as u32)
    }

    /// The entry of chunk `index / chunk` among `level` (one lookup result per chunk of the
    /// table, `lanes` lanes each): a tree of selects on index bits `chunk`, `2 * chunk`, ...
    /// An unpaired chunk at the end of a tree level moves up unchanged: every index that
    /// reaches it has that level's bit clear.
    fn select_chunk(
        &mut self,
        mut level: Vec<String>,
        index: &str,
        lanes: u32,
        chunk: u32,
    ) -> String {
        let vt = vec_of("i32", lanes);
        let mut bit = chunk;
        while level.len() > 1 {
            let m = literal(ScalarType::U32, lanes, bit);
            let masked = self.ins(format!("and {vt} {index}, {m}"));
            let set = self.ins(format!("icmp ne {vt} {masked}, zeroinitializer"));
            let mut pairs = std::mem::take(&mut level).into_iter();
            while let Some(clear) = pairs.next() {
                level.push(match pairs.next() {
                    Some(with_bit) => self.select(&set, ScalarType::U32, lanes, &with_bit, &clear),
                    None => clear,
                });
            }
            bit <<= 1;
        }
        level.pop().unwrap_or_else(|| "zeroinitializer".into())
    }

    /// `data[index]` on a multiple of 8 lanes with AVX2 (`index`: `i32` lanes, already clamped
    /// to the table), 8 lanes at a time: each 8-entry chunk of the table (a vector constant,
    /// the tail padded with the last entry) gives `chunk[index & 7]` with one permute
    /// (`vpermd`, which ignores the index bits above 2), and [`Self::select_chunk`] picks the
    /// chunk.
    fn avx2_permute_lookup(&mut self, data: &[u32], index: &str, lanes: u32) -> String {
        const CHUNK: usize = 8;
        let vt = "<8 x i32>";
        let parts: Vec<String> = (0..lanes / 8)
            .map(|p| {
                let part = self.lanes_of(index, lanes, 8 * p, 8);
                let level: Vec<String> = (0..data.len().div_ceil(CHUNK))
                    .map(|c| {
                        let e: Vec<String> = (c * CHUNK..(c + 1) * CHUNK)
                            .map(|j| format!("i32 {}", data[j.min(data.len() - 1)] as i32))
                            .collect();
                        let table = format!("<{}>", e.join(", "));
                        self.call("llvm.x86.avx2.permd", vt, &[(vt, &table), (vt, &part)])
                    })
                    .collect();
                self.select_chunk(level, &part, 8, CHUNK as u32)
            })
            .collect();
        self.concat(parts, 8)
    }

    /// `base[index]` on `lanes` lanes as one scalar load per lane (`index`: `i32` lanes). An
    /// index widened from loaded bytes is read from the bytes, so that LLVM loads each lane's
    /// byte as a scalar instead of extracting it from a vector.
    fn lane_loads(&mut self, base: &str, index: &str, lanes: u32) -> String {
        let (src, et) = match self.widened_bytes.get(index) {
            Some(bytes) => (bytes.clone(), "i8"),
            None => (index.to_string(), "i32"),
        };
        let (it, st) = (vec_of("i32", lanes), vec_of(et, lanes));
        let mut acc = "undef".to_string();
        for l in 0..lanes {
            let at = self.ins(format!("extractelement {st} {src}, i32 {l}"));
            let wide = self.ins(format!("zext {et} {at} to i64"));
            let p = self.ins(format!("getelementptr i32, i32* {base}, i64 {wide}"));
            let x = self.ins(format!("load i32, i32* {p}, align 4"));
            acc = self.ins(format!("insertelement {it} {acc}, i32 {x}, i32 {l}"));
        }
        acc
    }

    /// A gather of `lanes` elements of LLVM type `elem` at `base` (`elem*`) + `index` (`i32`
    /// lanes, zero-extended); lanes off in `mask` (all on when `None`) yield 0 and read nothing.
    pub(super) fn gather(
        &mut self,
        elem: &str,
        base: &str,
        index: &str,
        lanes: u32,
        mask: Option<&str>,
    ) -> String {
        let (it, lt) = (vec_of("i32", lanes), vec_of("i64", lanes));
        let wide = self.ins(format!("zext {it} {index} to {lt}"));
        let pt = vec_of(&format!("{elem}*"), lanes);
        let ptrs = self.ins(format!("getelementptr {elem}, {elem}* {base}, {lt} {wide}"));
        let vt = vec_of(elem, lanes);
        let all = literal(ScalarType::Bool, lanes, 1);
        let mask = mask.map_or(all, str::to_string);
        let name = format!(
            "llvm.masked.gather.{}.v{lanes}p0{}",
            super::emit::suffix(elem, lanes),
            super::emit::suffix(elem, 1)
        );
        let mt = vec_of("i1", lanes);
        self.call(
            &name,
            &vt,
            &[
                (&pt, &ptrs),
                ("i32", "1"),
                (&mt, &mask),
                (&vt, "zeroinitializer"),
            ],
        )
    }

    /// Exact f16 (bits in the low half of `i32` lanes) to `f32`: rebias the exponent;
    /// infinities and NaNs get the all-ones exponent (NaN stays NaN); zeros and subnormals are
    /// renormalized by an exact float subtraction of 2^-14.
    pub(super) fn f16_to_f32(&mut self, h: &str, lanes: u32) -> String {
        let u = ScalarType::U32;
        let it = ty(u, lanes);
        let ft = ty(ScalarType::F32, lanes);
        let c = |v: u32| literal(u, lanes, v);
        let mag = self.ins(format!("and {it} {h}, {}", c(0x7fff)));
        let shifted = self.ins(format!("shl {it} {mag}, {}", c(13)));
        let exp = self.ins(format!("and {it} {shifted}, {}", c(0x0f80_0000)));
        let normal = self.ins(format!("add {it} {shifted}, {}", c(112 << 23)));
        let special = self.ins(format!("icmp eq {it} {exp}, {}", c(0x0f80_0000)));
        let infnan = self.ins(format!("add {it} {normal}, {}", c(112 << 23)));
        let tiny = self.ins(format!("icmp eq {it} {exp}, {}", c(0)));
        let biased = self.ins(format!("add {it} {normal}, {}", c(1 << 23)));
        let biased = self.ins(format!("bitcast {it} {biased} to {ft}"));
        let magic = literal(ScalarType::F32, lanes, 113 << 23);
        let sub = self.ins(format!("fsub {ft} {biased}, {magic}"));
        let sub = self.ins(format!("bitcast {ft} {sub} to {it}"));
        let r = self.select(&tiny, u, lanes, &sub, &normal);
        let r = self.select(&special, u, lanes, &infnan, &r);
        let sign = self.ins(format!("and {it} {h}, {}", c(0x8000)));
        let sign = self.ins(format!("shl {it} {sign}, {}", c(16)));
        let r = self.ins(format!("or {it} {r}, {sign}"));
        self.ins(format!("bitcast {it} {r} to {ft}"))
    }

    /// `f32` lanes to f16 bits (in `i32` lanes), round to nearest even: NaN gives a quiet NaN,
    /// magnitudes at or above 65520 give infinity, results below 2^-14 are rounded by an
    /// exact-then-rounded float addition of 0.5, normal results by adding `0xfff + lsb` before
    /// dropping 13 mantissa bits.
    pub(super) fn f32_to_f16_rne(&mut self, v: &str, lanes: u32) -> String {
        let u = ScalarType::U32;
        let it = ty(u, lanes);
        let ft = ty(ScalarType::F32, lanes);
        let c = |v: u32| literal(u, lanes, v);
        let x = self.ins(format!("bitcast {ft} {v} to {it}"));
        let sign = self.ins(format!("and {it} {x}, {}", c(0x8000_0000)));
        let a = self.ins(format!("xor {it} {x}, {sign}"));
        let big = self.ins(format!("icmp uge {it} {a}, {}", c(143 << 23)));
        let is_nan = self.ins(format!("icmp ugt {it} {a}, {}", c(0x7f80_0000)));
        let big_r = self.select(&is_nan, u, lanes, &c(0x7e00), &c(0x7c00));
        let tiny = self.ins(format!("icmp ult {it} {a}, {}", c(113 << 23)));
        let af = self.ins(format!("bitcast {it} {a} to {ft}"));
        let half = literal(ScalarType::F32, lanes, 0.5f32.to_bits());
        let sum = self.ins(format!("fadd {ft} {af}, {half}"));
        let sum = self.ins(format!("bitcast {ft} {sum} to {it}"));
        let tiny_r = self.ins(format!("sub {it} {sum}, {}", c(0x3f00_0000)));
        let lsb = self.ins(format!("lshr {it} {a}, {}", c(13)));
        let lsb = self.ins(format!("and {it} {lsb}, {}", c(1)));
        let bias = ((15u32.wrapping_sub(127)) << 23).wrapping_add(0xfff);
        let n = self.ins(format!("add {it} {a}, {}", c(bias)));
        let n = self.ins(format!("add {it} {n}, {lsb}"));
        let normal_r = self.ins(format!("lshr {it} {n}, {}", c(13)));
        let r = self.select(&tiny, u, lanes, &tiny_r, &normal_r);
        let r = self.select(&big, u, lanes, &big_r, &r);
        let sign = self.ins(format!("lshr {it} {sign}, {}", c(16)));
        self.ins(format!("or {it} {r}, {sign}"))
    }

    /// `f32` lanes to bf16 bits (in `i32` lanes), round to nearest even; NaN stays NaN (quiet
    /// bit set), overflow carries into the exponent and gives infinity.
    pub(super) fn f32_to_bf16_rne(&mut self, v: &str, lanes: u32) -> String {
        let u = ScalarType::U32;
        let it = ty(u, lanes);
        let ft = ty(ScalarType::F32, lanes);
        let c = |v: u32| literal(u, lanes, v);
        let x = self.ins(format!("bitcast {ft} {v} to {it}"));
        let a = self.ins(format!("and {it} {x}, {}", c(0x7fff_ffff)));
        let is_nan = self.ins(format!("icmp ugt {it} {a}, {}", c(0x7f80_0000)));
        let hi = self.ins(format!("lshr {it} {x}, {}", c(16)));
        let lsb = self.ins(format!("and {it} {hi}, {}", c(1)));
        let r = self.ins(format!("add {it} {x}, {}", c(0x7fff)));
        let r = self.ins(format!("add {it} {r}, {lsb}"));
        let r = self.ins(format!("lshr {it} {r}, {}", c(16)));
        let nan_r = self.ins(format!("or {it} {hi}, {}", c(0x40)));
        self.select(&is_nan, u, lanes, &nan_r, &r)
    }
}
