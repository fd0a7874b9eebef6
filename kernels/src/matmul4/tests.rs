//! The fused 4-bit matmul kernels on the interpreter against a plain Rust model written from
//! the module docs (decode `table[nibble] * absmax`, `mul_add` into partial `i % 16` forward
//! and one running sum backward, halving tree, bias, one rounding), and the tile property: every tile
//! gives the same bits.

use crate::matmul4::panels::{panels_of, scale_chunk, scales_of};
use crate::matmul4::{Direction, Matmul4, TileConfig};
use crate::test_util::{bytes, floats, round};
use crate::{doublequant, QuantType};
use qforge_ir::OwnedArg;
use qforge_ir::{DType, Scalar};

/// Deterministic pseudo-random 32-bit values.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 - 1.0
    }
}

/// One problem: shapes and host data (f32 values already rounded to the dtype).
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    act: Vec<f32>,
    packed: Vec<u8>,
    absmax: Vec<f32>,
    qabsmax: Vec<u8>,
    nested_absmax: Vec<f32>,
    offset: f32,
    bias: Vec<f32>,
}

fn decode(dtype: DType, b: &[u8]) -> Vec<u32> {
    floats(dtype, b).iter().map(|v| v.to_bits()).collect()
}

impl Problem {
    fn new(spec: &Matmul4, m: usize, n: usize, k: usize, seed: u64) -> Problem {
        let mut r = Rng(seed);
        let act_len = match spec.direction {
            Direction::Forward { .. } => m * k,
            Direction::BackwardInput { .. } => m * n,
        };
        let act = (0..act_len)
            .map(|_| round(spec.dtype, r.f32() * 3.0))
            .collect();
        let elems = n * k;
        let n_blocks = elems.div_ceil(spec.blocksize as usize);
        Problem {
            m,
            n,
            k,
            act,
            packed: (0..elems.div_ceil(2)).map(|_| r.next() as u8).collect(),
            absmax: (0..n_blocks).map(|_| r.f32().abs() * 2.0).collect(),
            qabsmax: (0..n_blocks).map(|_| r.next() as u8).collect(),
            nested_absmax: (0..n_blocks.div_ceil(256))
                .map(|_| r.f32().abs() + 0.5)
                .collect(),
            offset: 0.125,
            bias: (0..n).map(|_| round(spec.dtype, r.f32())).collect(),
        }
    }

    /// The host ops' quant state of the weight (an `f32` state of `spec`'s quant type,
    /// blocksize and absmax kind).
    fn state(&self, spec: &Matmul4) -> crate::quant4::host::QuantState4 {
        use crate::quant4::host::{Absmax4, QuantState4};
        let absmax = if spec.nested {
            Absmax4::Nested {
                qabsmax: self.qabsmax.clone(),
                nested_absmax: self.nested_absmax.clone(),
                nested_code: doublequant::NESTED_MAP.code().to_vec(),
                offset: self.offset,
                nested_blocksize: 256,
            }
        } else {
            Absmax4::Plain(self.absmax.clone())
        };
        QuantState4 {
            quant_type: spec.quant_type,
            blocksize: spec.blocksize as usize,
            dtype: DType::F32,
            shape: vec![self.n, self.k],
            absmax,
        }
    }

    /// The dequantized weight element `(row, col)` of the `[N, K]` weight.
    fn w(&self, spec: &Matmul4, row: usize, col: usize) -> f32 {
        let e = row * self.k + col;
        let byte = self.packed[e / 2];
        let nib = if e.is_multiple_of(2) {
            byte >> 4
        } else {
            byte & 15
        };
        let block = e / spec.blocksize as usize;
        let absmax = if spec.nested {
            let code = doublequant::NESTED_MAP.code()[self.qabsmax[block] as usize];
            code * self.nested_absmax[block / 256] + self.offset
        } else {
            self.absmax[block]
        };
        round(
            spec.weight_dtype,
            spec.quant_type.dequant_table()[nib as usize] * absmax,
        )
    }

    /// The model output, widened to f32 bits after rounding to the dtype.
    fn model(&self, spec: &Matmul4) -> Vec<u32> {
        let (outs, len) = match spec.direction {
            Direction::Forward { .. } => (self.n, self.k),
            Direction::BackwardInput { .. } => (self.k, self.n),
        };
        let mut y = Vec::new();
        for mi in 0..self.m {
            for o in 0..outs {
                // 16 partials forward (K_ORDER), one running sum backward (DX_ORDER).
                let w_parts = match spec.direction {
                    Direction::Forward { .. } => 16,
                    Direction::BackwardInput { .. } => 1,
                };
                let mut p = [-0.0f32; 16];
                for i in 0..len {
                    let (a, w) = match spec.direction {
                        Direction::Forward { .. } => {
                            (self.act[mi * self.k + i], self.w(spec, o, i))
                        }
                        Direction::BackwardInput { .. } => {
                            (self.act[mi * self.n + i], self.w(spec, i, o))
                        }
                    };
                    p[i % w_parts] = a.mul_add(w, p[i % w_parts]);
                }
                let mut half = w_parts;
                while half > 1 {
                    half /= 2;
                    for j in 0..half {
                        p[j] += p[j + half];
                    }
                }
                let mut v = p[0];
                if matches!(spec.direction, Direction::Forward { bias: true }) {
                    v += self.bias[o];
                }
                y.push(round(spec.dtype, v).to_bits());
            }
        }
        y
    }

    fn args(&self, spec: &Matmul4) -> Vec<OwnedArg> {
        let outs = match spec.direction {
            Direction::Forward { .. } => self.n,
            Direction::BackwardInput { .. } => self.k,
        };
        let u = |v: usize| OwnedArg::Scalar(Scalar::U32(v as u32));
        let n_tiles = outs.div_ceil(spec.tile.tn as usize);
        let mut a = vec![
            u(self.m),
            u(self.n),
            u(self.k),
            u(self.m.div_ceil(spec.tile.tm as usize) * n_tiles),
            u(n_tiles),
        ];
        if spec.nested {
            a.push(OwnedArg::Scalar(Scalar::f32(self.offset)));
        }
        // The input gradient reads the codes and scales in its panel layouts.
        let (codes, absmax, qabsmax) = match spec.direction {
            Direction::Forward { .. } => (
                self.packed.clone(),
                self.absmax.clone(),
                self.qabsmax.clone(),
            ),
            Direction::BackwardInput { chunk } => {
                let (n, k, bs) = (self.n, self.k, spec.blocksize);
                (
                    panels_of(&self.packed, n, k, 2),
                    scales_of(&self.absmax, n, k, bs, chunk),
                    scales_of(&self.qabsmax, n, k, bs, chunk),
                )
            }
        };
        a.extend([u(codes.len()), u(absmax.len())]);
        if spec.nested {
            a.push(u(self.nested_absmax.len()));
        }
        a.push(OwnedArg::Read(bytes(spec.dtype, &self.act)));
        a.push(OwnedArg::Read(codes));
        if spec.nested {
            a.push(OwnedArg::Read(qabsmax));
            a.push(OwnedArg::Read(bytes(DType::F32, &self.nested_absmax)));
            a.push(OwnedArg::Read(bytes(
                DType::F32,
                &doublequant::NESTED_MAP.code(),
            )));
        } else {
            a.push(OwnedArg::Read(bytes(DType::F32, &absmax)));
        }
        if matches!(spec.direction, Direction::Forward { bias: true }) {
            a.push(OwnedArg::Read(bytes(spec.dtype, &self.bias)));
        }
        a.push(OwnedArg::Write(vec![
            0;
            self.m * outs * spec.dtype.size_bytes()
        ]));
        a
    }

    fn run(&self, spec: &Matmul4) -> Vec<u32> {
        let kernel = spec.build().unwrap();
        qforge_ir::verify(&kernel).unwrap();
        let mut args = self.args(spec);
        qforge_ir::interp::run(&kernel, &mut OwnedArg::borrow_all(&mut args))
            .unwrap_or_else(|e| panic!("{}: {e}", kernel.name));
        match args.last() {
            Some(OwnedArg::Write(b)) => decode(spec.dtype, b),
            _ => unreachable!("the output is the last argument"),
        }
    }
}

const DIRECTIONS: [Direction; 3] = [
    Direction::Forward { bias: false },
    Direction::Forward { bias: true },
    Direction::BackwardInput { chunk: 1 },
];

/// `direction` with the scale chunk the host op chooses for rows of `k` ([`scale_chunk`]).
fn for_rows(direction: Direction, k: usize, blocksize: u32) -> Direction {
    match direction {
        Direction::BackwardInput { .. } => Direction::BackwardInput {
            chunk: scale_chunk(k, blocksize),
        },
        forward => forward,
    }
}

#[test]
fn library_matmul4_matches_the_model_for_every_variant() {
    let mut seed = 1;
    for quant_type in QuantType::ALL {
        for dtype in crate::FLOAT_DTYPES {
            for nested in [false, true] {
                for direction in DIRECTIONS {
                    for (blocksize, m, n, k) in [
                        (64, 1, 5, 77),
                        (32, 2, 3, 9),
                        (128, 7, 4, 130),
                        (64, 3, 1, 1),
                        (64, 2, 3, 192),
                    ] {
                        let spec = Matmul4 {
                            quant_type,
                            blocksize,
                            dtype,
                            weight_dtype: [DType::F32, DType::F16, DType::BF16][seed as usize % 3],
                            nested,
                            direction: for_rows(direction, k, blocksize),
                            tile: TileConfig { tm: 2, tn: 3 },
                        };
                        seed += 1;
                        let p = Problem::new(&spec, m, n, k, seed);
                        let got = p.run(&spec);
                        let want = p.model(&spec);
                        assert_eq!(got, want, "{} m={m} n={n} k={k}", spec.name());
                    }
                }
            }
        }
    }
}

/// Every tile, with K = 70 (the input gradient's scale chunk 2: most tiles read each column's
/// own scale) and K = 128 (chunk 64: a tile's columns share a scale row).
#[test]
fn library_matmul4_every_tile_gives_the_same_bits() {
    for (direction, k) in DIRECTIONS.iter().flat_map(|d| [(*d, 70), (*d, 128)]) {
        let base = Matmul4 {
            quant_type: QuantType::Nf4,
            blocksize: 64,
            dtype: DType::BF16,
            weight_dtype: DType::BF16,
            nested: k == 70,
            direction: for_rows(direction, k, 64),
            tile: TileConfig { tm: 1, tn: 1 },
        };
        let p = Problem::new(&base, 5, 11, k, 99);
        let want = p.run(&base);
        assert_eq!(want, p.model(&base));
        for (tm, tn) in [
            (1, 4),
            (2, 2),
            (3, 5),
            (4, 8),
            (16, 1),
            (1, 16),
            (5, 3),
            (2, 64),
            (3, 32),
        ] {
            let spec = Matmul4 {
                tile: TileConfig { tm, tn },
                ..base
            };
            assert_eq!(p.run(&spec), want, "{}", spec.name());
        }
    }
}

#[test]
fn library_matmul4_rejects_bad_tiles_and_blocksizes() {
    let mut spec = Matmul4 {
        quant_type: QuantType::Fp4,
        blocksize: 64,
        dtype: DType::F32,
        weight_dtype: DType::F32,
        nested: false,
        direction: Direction::BackwardInput { chunk: 64 },
        tile: TileConfig { tm: 0, tn: 4 },
    };
    let e = spec.build().unwrap_err().to_string();
    assert!(e.contains("tile 0x4"), "{e}");
    spec.tile = TileConfig { tm: 17, tn: 16 };
    assert!(spec.build().unwrap_err().to_string().contains("17x16"));
    spec.tile = TileConfig { tm: 1, tn: 65 };
    assert!(spec.build().unwrap_err().to_string().contains("1x65"));
    for (tm, tn) in [(16, 16), (8, 32), (4, 64)] {
        spec.tile = TileConfig { tm, tn };
        spec.build()
            .expect("256 outputs, sides up to 64, are the largest tiles");
    }
    spec.tile = TileConfig { tm: 1, tn: 1 };
    spec.blocksize = 48;
    assert!(spec.build().unwrap_err().to_string().contains("48"));
    spec.blocksize = 64;
    spec.dtype = DType::U8;
    assert!(spec.build().is_err());
    spec.dtype = DType::F32;
    for chunk in [0, 3, 128] {
        spec.direction = Direction::BackwardInput { chunk };
        let e = spec.build().unwrap_err().to_string();
        assert!(e.contains(&format!("scale chunk {chunk}")), "{e}");
    }
}

/// The macro-built kernels are the builder-built ones (`reference.rs`): the same IR, value for
/// value (so the same snapshots and the same speed), for every quant type, blocksize, dtype,
/// weight dtype, scale, direction, bias and a spread of tiles.
#[test]
fn library_matmul4_equals_the_builder_version() {
    let mut count = 0;
    for quant_type in QuantType::ALL {
        for blocksize in crate::BLOCKSIZES_4BIT {
            for dtype in crate::FLOAT_DTYPES {
                for weight_dtype in crate::FLOAT_DTYPES {
                    for nested in [false, true] {
                        for direction in DIRECTIONS {
                            for (tm, tn) in [(1, 1), (2, 3), (1, 16), (8, 4), (2, 16)] {
                                // K = 96: chunks 32 or the blocksize, shared or not by a tile.
                                let spec = Matmul4 {
                                    quant_type,
                                    blocksize,
                                    dtype,
                                    weight_dtype,
                                    nested,
                                    direction: for_rows(direction, 96, blocksize),
                                    tile: TileConfig { tm, tn },
                                };
                                let k = spec.build().unwrap();
                                qforge_ir::verify(&k).unwrap_or_else(|e| panic!("{}: {e}", k.name));
                                let old = crate::matmul4::reference::build(&spec).unwrap();
                                assert!(k == old, "{} differs from the builder version", k.name);
                                assert_eq!(
                                    qforge_ir::text::print(&k),
                                    qforge_ir::text::print(&old),
                                    "{}",
                                    k.name
                                );
                                count += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(count > 1000, "{count}");
    // A typed build of the other direction is refused, naming the kernel.
    let spec = Matmul4 {
        quant_type: QuantType::Nf4,
        blocksize: 64,
        dtype: DType::F32,
        weight_dtype: DType::F32,
        nested: false,
        direction: Direction::BackwardInput { chunk: 64 },
        tile: TileConfig { tm: 1, tn: 1 },
    };
    let e = spec.build_forward().unwrap_err().to_string();
    assert!(e.contains("matmul_4bit_dx_nf4_bs64_f32_c64_t1x1"), "{e}");
    assert!(spec.build_backward_input().is_ok());
}

/// The host ops with 16-bit activations and at least [`super::widen::WIDEN_ROWS`] rows on a
/// CPU (the interpreter is one) widen the activations, run the `f32` kernel and round its
/// output: still the model's bits of the 16-bit kernel, forward with a bias and input
/// gradient, plain and nested absmax, with a partial row tile (65 rows).
#[test]
fn host_ops_with_widened_16_bit_activations_give_the_16_bit_bits() {
    use crate::matmul4::host::{matmul_4bit, matmul_4bit_backward_input};
    use qforge_runtime::{HostTensor, InterpreterDevice};
    let (m, n, k, blocksize) = (65, 6, 128, 64);
    for dtype in [DType::BF16, DType::F16] {
        for nested in [false, true] {
            for direction in [
                Direction::Forward { bias: true },
                Direction::BackwardInput { chunk: 64 },
            ] {
                let spec = Matmul4 {
                    quant_type: QuantType::Nf4,
                    blocksize,
                    dtype,
                    // An f32 weight decodes to the activation dtype.
                    weight_dtype: dtype,
                    nested,
                    direction,
                    tile: TileConfig { tm: 5, tn: 2 },
                };
                let p = Problem::new(&spec, m, n, k, 7 + nested as u64);
                let state = p.state(&spec);
                let dev = InterpreterDevice;
                let out = if matches!(direction, Direction::Forward { .. }) {
                    let x = HostTensor::from_f32_as(dtype, vec![m, k], &p.act).expect("x");
                    let bias = HostTensor::from_f32_as(dtype, vec![n], &p.bias).expect("bias");
                    matmul_4bit(&dev, &x, &p.packed, &state, Some(&bias), None)
                } else {
                    let dy = HostTensor::from_f32_as(dtype, vec![m, n], &p.act).expect("dY");
                    matmul_4bit_backward_input(&dev, &dy, &p.packed, &state, None)
                }
                .expect("host op");
                assert_eq!(out.dtype, dtype);
                assert_eq!(decode(dtype, &out.data), p.model(&spec), "{}", spec.name());
            }
        }
    }
}

/// The decoded plans run where they were measured to pay (`decoded_forward.rs`, `decoded.rs`):
/// on the LLVM backend's 8-lane (AVX2) and 16-lane (AVX-512) CPUs, the forward from 32 rows and
/// `K` a multiple of 16, the input gradient from 32 rows with 8 lanes and from 128 with 16,
/// `K` a multiple of 32; never with 4 lanes (Cranelift) or on a GPU.
#[test]
fn the_decoded_plans_run_where_they_pay() {
    use crate::matmul4::decoded::decoded_plan;
    use crate::matmul4::decoded_forward::forward_plan;
    use crate::matmul4::host::DeviceCaps;
    let cpu = |lanes| DeviceCaps::Cpu { threads: 2, lanes };
    let gpu = DeviceCaps::Gpu {
        parallel_threads: 1 << 16,
    };
    let fwd = |caps, m, k| forward_plan(caps, (m, 4096, k)).is_some();
    let dx = |caps, m, k| decoded_plan(caps, (m, 4096, k)).is_some();
    for (caps, fwd_rows, dx_rows) in [(cpu(8), 32, 32), (cpu(16), 32, 128)] {
        assert!(fwd(caps, fwd_rows, 4096), "{caps:?}");
        assert!(fwd(caps, 2048, 4112), "{caps:?}");
        assert!(!fwd(caps, fwd_rows - 1, 4096), "{caps:?}");
        assert!(!fwd(caps, 512, 4104), "{caps:?}: K not a multiple of 16");
        assert!(dx(caps, dx_rows, 4096), "{caps:?}");
        assert!(dx(caps, 2048, 11008), "{caps:?}");
        assert!(!dx(caps, dx_rows - 1, 4096), "{caps:?}");
        assert!(!dx(caps, 512, 4112), "{caps:?}: K not a multiple of 32");
    }
    for caps in [cpu(4), gpu] {
        assert!(!fwd(caps, 512, 4096) && !dx(caps, 512, 4096), "{caps:?}");
    }
}

/// The input gradient's decoded plan (`decoded.rs`: the weight decoded from bitsandbytes'
/// layout into the GEMM's panels, one strip of columns at a time, then the dense GEMM) gives
/// the model's bits: NF4 and FP4, plain and nested absmax (320 blocks of 32: two nested
/// blocks), blocksizes 32, 64 and 128 (rows of `K = 96` with blocks of 128 across them), GEMM
/// tiles of 8, 16 and 32 columns, strips of one panel and of the whole weight, `f32`
/// activations and widened `bf16` ones (65 rows, the weight rounded to `bf16`).
#[test]
fn the_decoded_input_gradient_gives_the_model_bits() {
    use crate::matmul4::host::{run, Plan};
    use qforge_runtime::{HostTensor, InterpreterDevice};
    let n = 80;
    let one_panel = n * 32 * 4;
    for (quant_type, nested, blocksize, k, dtype, m) in [
        (QuantType::Nf4, false, 64, 128, DType::F32, 5),
        (QuantType::Fp4, true, 32, 128, DType::F32, 3),
        (QuantType::Nf4, true, 128, 96, DType::F32, 4),
        (QuantType::Fp4, false, 128, 128, DType::F32, 2),
        (QuantType::Nf4, true, 64, 64, DType::BF16, 65),
    ] {
        let spec = Matmul4 {
            quant_type,
            blocksize,
            dtype,
            weight_dtype: dtype,
            nested,
            direction: Direction::BackwardInput {
                chunk: scale_chunk(k, blocksize),
            },
            tile: TileConfig { tm: 1, tn: 1 },
        };
        let p = Problem::new(&spec, m, n, k, 11 + k as u64);
        let want = p.model(&spec);
        let dy = HostTensor::from_f32_as(dtype, vec![m, n], &p.act).expect("dY");
        for (tile, strip) in [
            (TileConfig { tm: 2, tn: 16 }, one_panel),
            (TileConfig { tm: 3, tn: 8 }, usize::MAX),
            (TileConfig { tm: 1, tn: 32 }, 2 * one_panel),
        ] {
            let plan = Plan::Decoded(tile, strip);
            let dx = run(
                &InterpreterDevice,
                &dy,
                &p.packed,
                &p.state(&spec),
                None,
                false,
                plan,
            )
            .expect("decoded plan");
            let what = format!("{} {tile:?} strips of {strip} bytes", spec.name());
            assert_eq!(decode(dtype, &dx.data), want, "{what}");
        }
    }
}

/// The forward's decoded plan (`decoded_forward.rs`: `x` and the weight partial-major, the
/// weight decoded once in strips of panels, then the dense GEMM with 16 partials) gives the
/// plain-Rust model's bits: `K_ORDER`'s partials and tree, then the bias: NF4 and FP4, plain and
/// nested absmax (two nested blocks: `N * K / blocksize > 256`), blocks straddling weight rows
/// (`K = 48` with blocksize 32), a strip of one panel, of two, of three and the whole weight, a
/// last strip and panel that are partial (`N = 40`), panels narrower than a decode work item's
/// 16 rows and of two items (the last one all padding), with and without a bias, and widened
/// bf16.
#[test]
fn the_decoded_forward_gives_the_model_bits() {
    use crate::matmul4::host::{run, Plan};
    use qforge_runtime::{HostTensor, InterpreterDevice};
    let n = 40;
    for (quant_type, nested, blocksize, k, dtype, m, bias) in [
        (QuantType::Nf4, false, 64, 128, DType::F32, 5, true),
        (QuantType::Fp4, true, 32, 256, DType::F32, 3, false),
        (QuantType::Nf4, true, 32, 48, DType::F32, 4, true),
        (QuantType::Fp4, false, 128, 64, DType::F32, 2, false),
        (QuantType::Nf4, true, 64, 64, DType::BF16, 65, true),
    ] {
        let spec = Matmul4 {
            quant_type,
            blocksize,
            dtype,
            weight_dtype: dtype,
            nested,
            direction: Direction::Forward { bias },
            tile: TileConfig { tm: 1, tn: 1 },
        };
        let p = Problem::new(&spec, m, n, k, 7 + k as u64);
        let want = p.model(&spec);
        let x = HostTensor::from_f32_as(dtype, vec![m, k], &p.act).expect("x");
        let b = HostTensor::from_f32_as(dtype, vec![n], &p.bias).expect("bias");
        let one_panel = |tn: usize| tn * k * 4;
        for (tile, strip) in [
            (TileConfig { tm: 2, tn: 16 }, one_panel(16)),
            (TileConfig { tm: 3, tn: 8 }, usize::MAX),
            (TileConfig { tm: 1, tn: 4 }, 2 * one_panel(4)),
            (TileConfig { tm: 2, tn: 2 }, 3 * one_panel(2)),
            (TileConfig { tm: 1, tn: 32 }, one_panel(32)),
        ] {
            let plan = Plan::Decoded(tile, strip);
            let state = p.state(&spec);
            let y = run(
                &InterpreterDevice,
                &x,
                &p.packed,
                &state,
                bias.then_some(&b),
                true,
                plan,
            )
            .expect("decoded plan");
            let what = format!("{} {tile:?} strips of {strip} bytes", spec.name());
            assert_eq!(decode(dtype, &y.data), want, "{what}");
        }
    }
}

/// A strip's outputs land in their columns of the whole output with the rows split between
/// threads (an output past the one-thread limit, 2 and 3 threads: runs of rows that do not
/// divide evenly), the other columns untouched.
#[test]
fn a_strip_lands_in_its_columns_on_every_thread_count() {
    use crate::matmul4::decoded::place_columns;
    let (m, total, first, cols) = (301u32, 512u32, 100u32, 128u32);
    let strip: Vec<f32> = (0..m * cols).map(|i| i as f32 + 0.5).collect();
    for threads in [1, 2, 3] {
        let mut dst = vec![0u8; (m * total * 4) as usize];
        place_columns(
            &mut dst,
            &bytes(DType::F32, &strip),
            (m, total),
            (first, cols),
            threads,
        );
        let got = floats(DType::F32, &dst);
        for r in 0..m {
            for c in 0..total {
                let want = if (first..first + cols).contains(&c) {
                    (r * cols + c - first) as f32 + 0.5
                } else {
                    0.0
                };
                assert_eq!(
                    got[(r * total + c) as usize],
                    want,
                    "row {r} column {c}, {threads} threads"
                );
            }
        }
    }
}
