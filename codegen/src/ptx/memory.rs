//! Global loads and stores, constant-table lookups and reductions.

use qforge_ir::{
    DType, NanMode, ParamId, ParamKind, ReduceKind, ReduceOrder, Rounding, TableId, Value,
};

use super::emit::{table_symbol, Emitter};
use super::ops::rounding;
use super::BACKEND;
use crate::error::{Error, Result};

impl Emitter<'_> {
    /// The dtype of buffer parameter `buf`.
    fn dtype(&self, buf: ParamId) -> Result<DType> {
        match &self.kernel.params[buf].kind {
            ParamKind::Buffer { dtype, .. } => Ok(*dtype),
            ParamKind::Scalar(_) => Err(Error::Backend {
                backend: BACKEND,
                message: format!(
                    "parameter '{}' is a scalar, not a buffer",
                    self.kernel.params[buf].name
                ),
            }),
        }
    }

    /// A 64-bit register with the global address of element `idx` (a `u32` register) of `buf`.
    fn element_address(&mut self, buf: ParamId, dtype: DType, idx: &str) -> String {
        let (off, addr) = (self.rd(), self.rd());
        let size = dtype.size_bytes();
        if size == 1 {
            self.line(format!("cvt.u64.u32 {off}, {idx};"));
        } else {
            self.line(format!("mul.wide.u32 {off}, {idx}, {size};"));
        }
        let base = Self::base_reg(buf.index());
        self.line(format!("add.s64 {addr}, {base}, {off};"));
        addr
    }

    /// `dst = buf[idx]`, widened exactly as [`qforge_ir::Op::Load`] says.
    pub(super) fn load(&mut self, dst: &str, buf: ParamId, idx: &str) -> Result<()> {
        let dtype = self.dtype(buf)?;
        let addr = self.element_address(buf, dtype, idx);
        match dtype {
            DType::F32 => self.line(format!("ld.global.f32 {dst}, [{addr}];")),
            DType::F16 => {
                // Every f16 (subnormals, inf, NaN) is exact in f32; no .ftz.
                let h = self.h();
                self.line(format!("ld.global.b16 {h}, [{addr}];"));
                self.line(format!("cvt.f32.f16 {dst}, {h};"));
            }
            DType::BF16 => {
                // bf16 is the upper half of an f32: widening is a 16-bit shift, exact for
                // every pattern and independent of the target.
                let t = self.tr();
                self.line(format!("ld.global.u16 {t}, [{addr}];"));
                self.line(format!("shl.b32 {t}, {t}, 16;"));
                self.line(format!("mov.b32 {dst}, {t};"));
            }
            DType::U8 => self.line(format!("ld.global.u8 {dst}, [{addr}];")),
            DType::I8 => self.line(format!("ld.global.s8 {dst}, [{addr}];")),
            DType::U32 => self.line(format!("ld.global.u32 {dst}, [{addr}];")),
            DType::I32 => self.line(format!("ld.global.s32 {dst}, [{addr}];")),
        }
        Ok(())
    }

    /// `buf[index] = value`, narrowed as [`qforge_ir::Stmt::Store`] says.
    pub(super) fn store(
        &mut self,
        buf: ParamId,
        index: Value,
        value: Value,
        rnd: Option<Rounding>,
    ) -> Result<()> {
        let dtype = self.dtype(buf)?;
        let (idx, v) = (self.reg(index), self.reg(value));
        let narrow = |name: &str| -> Result<Rounding> {
            rnd.ok_or_else(|| Error::Backend {
                backend: BACKEND,
                message: format!("store to {name} buffer without a rounding"),
            })
        };
        // Convert before computing the address so an unsupported rounding emits nothing.
        let half = match dtype {
            DType::F16 => {
                let r = narrow("f16")?;
                let h = self.h();
                self.line(format!("cvt.{}.f16.f32 {h}, {v};", rounding(r)));
                Some(h)
            }
            DType::BF16 => {
                let r = narrow("bf16")?;
                let rr = match r {
                    Rounding::NearestEven | Rounding::TowardZero => rounding(r),
                    Rounding::Down | Rounding::Up => {
                        return Err(Error::Unsupported {
                            backend: BACKEND,
                            op: format!("store to bf16 with rounding {}", r.name()),
                        })
                    }
                };
                let h = self.h();
                self.line(format!("cvt.{rr}.bf16.f32 {h}, {v};"));
                Some(h)
            }
            DType::F32 | DType::U8 | DType::I8 | DType::U32 | DType::I32 => None,
        };
        let addr = self.element_address(buf, dtype, &idx);
        match (dtype, half) {
            (DType::F16 | DType::BF16, Some(h)) => {
                self.line(format!("st.global.b16 [{addr}], {h};"))
            }
            (DType::F32, _) => self.line(format!("st.global.f32 [{addr}], {v};")),
            // The low 8 bits of the value.
            (DType::U8 | DType::I8, _) => self.line(format!("st.global.u8 [{addr}], {v};")),
            (DType::U32 | DType::I32, _) => self.line(format!("st.global.b32 [{addr}], {v};")),
            (DType::F16 | DType::BF16, None) => {
                return Err(Error::Backend {
                    backend: BACKEND,
                    message: "narrow store lost its conversion".into(),
                })
            }
        }
        Ok(())
    }

    /// `dst = table[min(index, len - 1)]` from the module's `.const` array.
    pub(super) fn lookup(&mut self, dst: &str, table: TableId, index: Value) {
        let t = &self.kernel.tables[table];
        let last = t.data.len().saturating_sub(1);
        let ty = match t.ty {
            qforge_ir::ScalarType::F32 => "f32",
            qforge_ir::ScalarType::U32
            | qforge_ir::ScalarType::I32
            | qforge_ir::ScalarType::Bool => "b32",
        };
        let sym = table_symbol(self.kernel, table.index());
        let idx = self.reg(index);
        let (c, base, off, addr) = (self.tr(), self.rd(), self.rd(), self.rd());
        self.line(format!("min.u32 {c}, {idx}, {last};"));
        self.line(format!("mov.u64 {base}, {sym};"));
        self.line(format!("mul.wide.u32 {off}, {c}, 4;"));
        self.line(format!("add.s64 {addr}, {base}, {off};"));
        self.line(format!("ld.const.{ty} {dst}, [{addr}];"));
    }

    /// `dst = reduce(buf[start .. start + len])` in the order of [`ReduceOrder`].
    pub(super) fn reduce(
        &mut self,
        dst: &str,
        kind: ReduceKind,
        buf: ParamId,
        start: Value,
        len: Value,
        order: ReduceOrder,
    ) -> Result<()> {
        let (s, n) = (self.reg(start), self.reg(len));
        let (i, p) = (self.tr(), self.tp());
        let head = self.label("reduce");
        let done = self.label("endreduce");
        match kind {
            ReduceKind::Sum => match order {
                ReduceOrder::Sequential => {
                    self.line("// sum, sequential; identity -0.0");
                    self.line(format!("mov.b32 {dst}, 0f80000000;"));
                    self.line(format!("mov.b32 {i}, 0;"));
                    self.line(format!("{head}:"));
                    self.line(format!("setp.ge.u32 {p}, {i}, {n};"));
                    self.line(format!("@{p} bra {done};"));
                    let x = self.element(buf, &s, &i)?;
                    self.line(format!("add.rn.f32 {dst}, {dst}, {x};"));
                    self.line(format!("add.u32 {i}, {i}, 1;"));
                    self.line(format!("bra {head};"));
                    self.line(format!("{done}:"));
                }
                ReduceOrder::Strided(ways) => {
                    let ways = ways.clamp(1, 64);
                    self.line(format!(
                        "// sum, strided over {ways} accumulators; identity -0.0"
                    ));
                    let acc: Vec<String> = (0..ways).map(|_| self.tf()).collect();
                    for a in &acc {
                        self.line(format!("mov.b32 {a}, 0f80000000;"));
                    }
                    self.line(format!("mov.b32 {i}, 0;"));
                    self.line(format!("{head}:"));
                    // Element i + j goes to acc[j]; stop at the first index >= len (no wrap:
                    // i + j <= len holds whenever it is computed).
                    let k = self.tr();
                    for (j, a) in acc.iter().enumerate() {
                        self.line(format!("add.u32 {k}, {i}, {j};"));
                        self.line(format!("setp.ge.u32 {p}, {k}, {n};"));
                        self.line(format!("@{p} bra {done};"));
                        let x = self.element(buf, &s, &k)?;
                        self.line(format!("add.rn.f32 {a}, {a}, {x};"));
                    }
                    self.line(format!("add.u32 {i}, {i}, {ways};"));
                    self.line(format!("bra {head};"));
                    self.line(format!("{done}:"));
                    let mut w = acc.len();
                    while w > 1 {
                        w /= 2;
                        for j in 0..w {
                            let (a, b) = (&acc[j], &acc[j + w]);
                            self.line(format!("add.rn.f32 {a}, {a}, {b};"));
                        }
                    }
                    self.line(format!("mov.f32 {dst}, {};", acc[0]));
                }
            },
            ReduceKind::AbsMax(nan) => {
                self.line(format!("// absmax, NaN {nan:?}; starts at +0.0"));
                let seen = self.tp();
                self.line(format!("mov.b32 {dst}, 0f00000000;"));
                self.line(format!("mov.b32 {i}, 0;"));
                self.line(format!("setp.ne.b32 {seen}, {i}, {i};"));
                self.line(format!("{head}:"));
                self.line(format!("setp.ge.u32 {p}, {i}, {n};"));
                self.line(format!("@{p} bra {done};"));
                let x = self.element(buf, &s, &i)?;
                let (a, gt) = (self.tf(), self.tp());
                self.line(format!("and.b32 {a}, {x}, 0x7FFFFFFF;"));
                self.line(format!("setp.gt.f32 {gt}, {a}, {dst};"));
                self.line(format!("@{gt} mov.f32 {dst}, {a};"));
                match nan {
                    NanMode::Propagate => {
                        self.line(format!("setp.nan.f32 {gt}, {a}, {a};"));
                        self.line(format!("or.pred {seen}, {seen}, {gt};"));
                    }
                    NanMode::Ignore => {}
                }
                self.line(format!("add.u32 {i}, {i}, 1;"));
                self.line(format!("bra {head};"));
                self.line(format!("{done}:"));
                match nan {
                    NanMode::Propagate => {
                        self.line(format!("selp.f32 {dst}, 0f7FC00000, {dst}, {seen};"))
                    }
                    NanMode::Ignore => {}
                }
            }
        }
        Ok(())
    }

    /// Loads element `start + i` of float buffer `buf` widened to `f32` into a fresh temporary.
    fn element(&mut self, buf: ParamId, start: &str, i: &str) -> Result<String> {
        let (idx, x) = (self.tr(), self.tf());
        self.line(format!("add.u32 {idx}, {start}, {i};"));
        self.load(&x, buf, &idx)?;
        Ok(x)
    }
}
