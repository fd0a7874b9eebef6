//! Support for `tests/golden.rs`: loading the bitsandbytes golden vectors, independent host
//! models of bitsandbytes' CPU quantizers and of our canonical (CUDA-like) semantics, and the
//! per-category mismatch counters.
#![allow(dead_code, clippy::neg_cmp_op_on_partial_ord)] // `!(v <= m)`: the NaN-aware rule

use std::collections::BTreeMap;
use std::path::PathBuf;

use qforge::ir::DType;
use qforge::kernels::{maps, BlockwiseMap, QuantType};
use qforge::runtime::HostTensor;
use safetensors::{Dtype, SafeTensors};

mod torch_mean;
#[allow(unused_imports)] // used by tests/golden.rs only
pub use torch_mean::torch_mean_model;

/// The golden directory, or `None` (after printing why) when it is missing and optional here.
/// Panics when it is missing and required (`qforge_testkit`: CI, `QFORGE_REQUIRE`).
pub fn golden_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/golden");
    if dir.join("manifest.json").is_file() {
        return Some(dir);
    }
    qforge_testkit::unavailable(
        "golden",
        format!("golden vectors not found at {}", dir.display()),
    );
    None
}

/// One stored tensor.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Element type.
    pub dtype: Dtype,
    /// Shape as stored.
    pub shape: Vec<usize>,
    /// Raw little-endian bytes.
    pub data: Vec<u8>,
}

impl Tensor {
    /// The IR dtype of a float tensor.
    pub fn float_dtype(&self) -> DType {
        match self.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => panic!("not a float tensor: {other:?}"),
        }
    }

    /// Elements widened to `f32` (exact for f16/bf16).
    pub fn f32s(&self) -> Vec<f32> {
        self.host().to_f32().expect("float tensor")
    }

    /// As a host tensor of the stored shape.
    pub fn host(&self) -> HostTensor {
        HostTensor::new(self.float_dtype(), self.shape.clone(), self.data.clone())
            .expect("consistent tensor")
    }

    /// `u8` elements.
    pub fn u8s(&self) -> Vec<u8> {
        assert_eq!(self.dtype, Dtype::U8);
        self.data.clone()
    }

    /// `i64` elements.
    pub fn i64s(&self) -> Vec<i64> {
        assert_eq!(self.dtype, Dtype::I64);
        self.data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
}

/// A golden case: its tensors by field name and its manifest entry.
#[derive(Debug)]
pub struct Case {
    /// Field name -> tensor.
    pub fields: BTreeMap<String, Tensor>,
    /// The manifest's `params` object.
    pub params: serde_json::Value,
}

impl Case {
    /// The field called `name`.
    pub fn field(&self, name: &str) -> &Tensor {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("missing field {name}"))
    }

    /// An integer parameter.
    pub fn param_u32(&self, name: &str) -> u32 {
        self.params[name]
            .as_u64()
            .unwrap_or_else(|| panic!("missing param {name}")) as u32
    }

    /// A string parameter.
    pub fn param_str(&self, name: &str) -> &str {
        self.params[name]
            .as_str()
            .unwrap_or_else(|| panic!("missing param {name}"))
    }
}

/// Every case of `file` (e.g. `nf4.safetensors`), by case name.
pub fn load_cases(file: &str) -> Option<BTreeMap<String, Case>> {
    let dir = golden_dir()?;
    let bytes = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("manifest json");
    let st = SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut cases: BTreeMap<String, Case> = BTreeMap::new();
    for (name, view) in st.tensors() {
        let (case, field) = name
            .split_once('/')
            .unwrap_or_else(|| panic!("tensor name {name}"));
        let entry = cases.entry(case.to_string()).or_insert_with(|| Case {
            fields: BTreeMap::new(),
            params: manifest["files"][file]["cases"][case]["params"].clone(),
        });
        entry.fields.insert(
            field.to_string(),
            Tensor {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            },
        );
    }
    Some(cases)
}

/// Same bits, or both NaN.
pub fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

// ----- error bounds that a NaN cannot pass -----

/// `|got - reference| / bound` for one output, written so that no NaN or infinity can pass a
/// `<= 1` check: infinite where `got` is NaN or infinite but the reference is finite, and where
/// the reference is not finite but `got` is not the same value (any NaN matches a NaN); 0 where
/// both are the same non-finite value. A NaN `bound` gives NaN (which fails `<= 1` as well).
pub fn error_ratio(got: f64, reference: f64, bound: f64) -> f64 {
    match (reference.is_finite(), got.is_finite()) {
        (true, true) => (got - reference).abs() / bound,
        (true, false) => f64::INFINITY,
        (false, _) if got == reference || (got.is_nan() && reference.is_nan()) => 0.0,
        (false, _) => f64::INFINITY,
    }
}

/// The largest of `ratios` (0 for none), NaN as soon as one of them is NaN: `f64::max` and
/// `fold(0.0, f64::max)` drop a NaN, which would let it pass a bound.
pub fn nan_max(ratios: impl IntoIterator<Item = f64>) -> f64 {
    ratios.into_iter().fold(0.0, |worst, r| {
        if worst.is_nan() || r.is_nan() {
            f64::NAN
        } else {
            worst.max(r)
        }
    })
}

/// Distance in units in the last place between two finite `f32`s (signed: `a - b`).
pub fn ulp_diff(a: f32, b: f32) -> i64 {
    let key = |x: f32| {
        let b = x.to_bits() as i64;
        if b & 0x8000_0000 != 0 {
            0x8000_0000 - b
        } else {
            b
        }
    };
    key(a) - key(b)
}

/// The 4-bit code of element `i` of a packed buffer (first element in the high nibble).
pub fn nibble(packed: &[u8], i: usize) -> u8 {
    if i.is_multiple_of(2) {
        packed[i / 2] >> 4
    } else {
        packed[i / 2] & 15
    }
}

// ----- scaling models -----

/// `x * (1 / max(absmax, 1e-38))` in f32 (canonical; bitsandbytes' full blocks).
pub fn scale_mul(x: f32, absmax: f32) -> f32 {
    let c = if absmax.is_nan() {
        absmax
    } else {
        absmax.max(1e-38)
    };
    x * (1.0 / c)
}

/// `x / max(absmax, 1e-38)` in f32 (bitsandbytes' CPU tail block).
pub fn scale_div(x: f32, absmax: f32) -> f32 {
    let c = if absmax.is_nan() {
        absmax
    } else {
        absmax.max(1e-38)
    };
    x / c
}

// ----- 4-bit models -----

/// bitsandbytes' CPU 4-bit code: `order[searchsorted(mids, clamp(v, -1, 1), left)]` over the
/// golden midpoints of the sorted table, NaN sorting last.
pub fn bnb_code4(mids: &[f32], order: &[i64], v: f32) -> u8 {
    let bucket = if v.is_nan() {
        mids.len()
    } else {
        mids.iter().filter(|m| **m < v.clamp(-1.0, 1.0)).count()
    };
    order[bucket] as u8
}

/// Our canonical 4-bit code (written independently of the kernels).
pub fn canonical_code4(qt: QuantType, v: f32) -> u8 {
    match qt {
        QuantType::Nf4 => maps::nf4_midpoints().iter().filter(|m| !(v <= **m)).count() as u8,
        QuantType::Fp4 => {
            if v.is_nan() {
                return 3;
            }
            let a = v.abs();
            let neg = v.is_sign_negative();
            let mids = maps::fp4_midpoints();
            let mag = mids
                .iter()
                .filter(|m| if neg { **m <= a } else { **m < a })
                .count();
            maps::FP4_MAGNITUDE_CODES[mag] as u8 | if neg { 8 } else { 0 }
        }
    }
}

// ----- 8-bit models -----

/// Exact nearest code of `v` among the sorted `code` values (f64 brute force; ties to the lower
/// index; NaN to 0). Asserts that every near tie it decides is computed exactly in f64.
pub fn exact_nearest8(code: &[f32], v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    let dist = |c: f32| -> (f64, bool) {
        let (a, b) = (v as f64, -(c as f64));
        let s = a + b;
        let bb = s - a;
        (s.abs(), (a - (s - bb)) + (b - bb) == 0.0)
    };
    let (mut best, (mut best_d, mut best_exact)) = (0usize, dist(code[0]));
    for (k, c) in code.iter().enumerate().skip(1) {
        let (d, exact) = dist(*c);
        if (d - best_d).abs() <= best_d * 1e-12 {
            assert!(exact && best_exact, "near tie at {v:e} is not exact in f64");
        }
        if d < best_d {
            (best, best_d, best_exact) = (k, d, exact);
        }
    }
    best as u8
}

/// bitsandbytes' native CPU 8-bit quantizer (model from the golden README): a 65536-entry LUT
/// `lut[i] = #{f32 midpoints 0.5f*(c[k]+c[k+1]) < -1 + 2i/65535}` indexed by
/// `trunc(fma((clamp(v,-1,1)+1)*0.5, 65535, 0.5))` (NaN to index 0); absmax ignores NaN; a zero
/// block gets code 0 everywhere; `inv = 1/absmax` without clamp.
pub struct Lut8 {
    lut: Vec<u8>,
}

impl Lut8 {
    /// Builds the LUT of a code table.
    pub fn new(code: &[f32]) -> Lut8 {
        let mids: Vec<f32> = code.windows(2).map(|w| (w[0] + w[1]) * 0.5).collect();
        let lut = (0..65536u32)
            .map(|i| {
                let val = -1.0f32 + (2.0f32 * i as f32) / 65535.0;
                mids.iter().filter(|m| **m < val).count() as u8
            })
            .collect();
        Lut8 { lut }
    }

    /// The code of a value already scaled by `inv`.
    pub fn code(&self, v: f32) -> u8 {
        let t = (v.clamp(-1.0, 1.0) + 1.0) * 0.5;
        let u = t.mul_add(65535.0, 0.5);
        let idx = if u.is_nan() { 0 } else { u.floor() as usize };
        self.lut[idx.min(65535)]
    }

    /// Codes and absmax of a whole block.
    pub fn quantize_block(&self, block: &[f32]) -> (Vec<u8>, f32) {
        let am = block
            .iter()
            .filter(|x| !x.is_nan())
            .fold(0.0f32, |m, x| m.max(x.abs()));
        if am == 0.0 {
            return (vec![0; block.len()], am);
        }
        let inv = 1.0 / am;
        (block.iter().map(|x| self.code(x * inv)).collect(), am)
    }
}

/// The 8-bit map a blockwise8 case used, from the manifest's `code` parameter.
pub fn map_of(code_param: &str) -> BlockwiseMap {
    if code_param.starts_with("create_dynamic_map(signed=True)") {
        BlockwiseMap::Dynamic
    } else if code_param.starts_with("create_dynamic_map(signed=False)") {
        BlockwiseMap::DynamicUnsigned
    } else if code_param.starts_with("create_linear_map(signed=True)") {
        BlockwiseMap::Linear
    } else {
        panic!("unknown code parameter {code_param}")
    }
}

/// Mismatch counters per category, in a stable order.
#[derive(Default, Debug)]
pub struct Counts(pub BTreeMap<String, usize>);

impl Counts {
    /// Adds `k` to category `name`.
    pub fn add(&mut self, name: &str, k: usize) {
        *self.0.entry(name.to_string()).or_default() += k;
    }

    /// The count of `name`.
    pub fn get(&self, name: &str) -> usize {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// Prints one line per category.
    pub fn print(&self, title: &str) {
        println!("== {title}");
        for (k, v) in &self.0 {
            println!("   {k:<58} {v:>8}");
        }
    }
}
