//! Optimizer state as safetensors: tensors `<param>.<suffix>` (`state1` to `state3`, as many
//! as the rule keeps, each followed by `absmax1` to `absmax3` for 8-bit state) plus one JSON metadata entry
//! ([`STATE_METADATA_KEY`]) with the format version, options, groups (rule, width, parameter
//! names, hyperparameters with their exact `f64` bits) and per-parameter step count, state
//! layout and shape.

use std::collections::{BTreeMap, HashMap};

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};
use serde_json::{json, Value};

use crate::MomentScheme;

use super::clip::GNORM_HISTORY;
use super::group::{bits_number, ParamGroup};
use super::state::{Layout, StateTensor};
use super::Optimizer;
use qforge_runtime::{Error, Result};

/// The safetensors metadata key holding the optimizer's JSON description.
pub const STATE_METADATA_KEY: &str = "qforge.optimizer";

/// Version of the state format written by [`Optimizer::state_dict`].
pub const STATE_FORMAT_VERSION: u64 = 1;

const FORMAT: &str = "qforge-optimizer";

/// Suffix of a parameter's percentile-clipping history tensor (`<param>.gnorm_vec`, `f32[100]`).
const GNORM_SUFFIX: &str = "gnorm_vec";

/// A parameter's step count, shape, state and first-moment scheme read from a file.
type LoadedParam = (
    u32,
    Option<Vec<usize>>,
    Option<super::state::ParamState>,
    Option<MomentScheme>,
);

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("optimizer state: {msg}"))
}

impl safetensors::View for &StateTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn describe(e: SafeTensorError) -> String {
    match e {
        SafeTensorError::HeaderTooSmall => {
            "not a safetensors file: shorter than the 8-byte header length (truncated?)".into()
        }
        SafeTensorError::InvalidHeaderLength => {
            "truncated or not a safetensors file: the header length points past the end".into()
        }
        SafeTensorError::HeaderTooLarge => {
            "not a safetensors file: implausibly large header length".into()
        }
        SafeTensorError::InvalidHeader | SafeTensorError::InvalidHeaderStart => {
            "not a safetensors file: the header is not UTF-8 JSON".into()
        }
        SafeTensorError::InvalidHeaderDeserialization | SafeTensorError::JsonError(_) => {
            "not a safetensors file: malformed header JSON".into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor '{name}' has data offsets outside the file (truncated?)")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            "truncated (or trailing bytes): tensor data does not cover the file exactly".into()
        }
        other => format!("invalid safetensors file: {other:?}"),
    }
}

fn hyper_json(group: &ParamGroup) -> (Value, Value) {
    let mut values = serde_json::Map::new();
    let mut bits = serde_json::Map::new();
    for (name, v) in group.hyperparameters() {
        values.insert(name.into(), json!(v));
        bits.insert(name.into(), json!(format!("{:016x}", v.to_bits())));
    }
    (Value::Object(values), Value::Object(bits))
}

fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

impl Optimizer {
    /// The state as safetensors bytes: see the module docs and `docs/optimizers.md`.
    ///
    /// # Errors
    /// [`Error::Invalid`] while a parameter holds one rank's shard of its state
    /// ([`Optimizer::step_sharded`]; [`Optimizer::gather_state`] makes it whole), or if
    /// safetensors rejects the tensors (a bug, reported, not a panic).
    pub fn state_dict(&self) -> Result<Vec<u8>> {
        if let Some(slot) = self.slots.iter().find(|s| s.shard.is_some()) {
            return Err(err(format!(
                "parameter '{}' holds one rank's shard of its state: call gather_state on \
                 every rank first",
                slot.name
            )));
        }
        let groups: Vec<Value> = self
            .groups
            .iter()
            .map(|g| {
                let (hyper, hyper_bits) = hyper_json(g);
                let mut v = json!({
                    "kind": g.kind.name(),
                    "bits": bits_number(g.bits),
                    "params": g.params,
                    "hyper": hyper,
                    "hyper_bits": hyper_bits,
                });
                if let Some(c) = g.kind.qadam() {
                    v["m1_scheme"] = json!(c.m1.name());
                    v["m2_scheme"] = json!(c.m2.name());
                }
                v
            })
            .collect();
        let mut tensors = Vec::new();
        let mut params = Vec::new();
        for slot in &self.slots {
            let layout = slot.state.as_ref().map(|s| s.layout().name());
            params.push(json!({
                "name": slot.name,
                "step": slot.step,
                "state": layout,
                "shape": slot.shape,
                "m1_scheme": slot.m1_scheme.map(|s| s.name()),
            }));
            if let (Some(state), Some(shape)) = (&slot.state, &slot.shape) {
                for t in state.tensors(shape) {
                    tensors.push((format!("{}.{}", slot.name, t.suffix), t));
                }
            }
            if let Some(h) = &slot.gnorm_vec {
                let t = StateTensor {
                    suffix: GNORM_SUFFIX,
                    dtype: Dtype::F32,
                    shape: vec![h.len()],
                    data: qforge_runtime::f32_bytes(h),
                };
                tensors.push((format!("{}.{GNORM_SUFFIX}", slot.name), t));
            }
        }
        let meta = json!({
            "format": FORMAT,
            "version": STATE_FORMAT_VERSION,
            "min_8bit_size": self.options.min_8bit_size,
            "seed": self.options.seed,
            "groups": groups,
            "params": params,
        });
        let metadata = Some(HashMap::from([(
            STATE_METADATA_KEY.to_string(),
            meta.to_string(),
        )]));
        safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), &metadata)
            .map_err(|e| err(describe(e)))
    }

    /// Replaces the state (step counts, moments, seed) with one from [`Optimizer::state_dict`].
    /// The file must have been written by an optimizer with the same groups (rules, widths,
    /// parameter names in order, hyperparameters bit for bit) and `min_8bit_size`; the seed is
    /// taken from the file. Nothing changes on error.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the problem: truncated or not safetensors, no or malformed
    /// metadata, another format version, settings that differ, an unknown or missing
    /// parameter, a missing or unexpected tensor, a tensor of the wrong dtype or shape.
    pub fn load_state_dict(&mut self, bytes: &[u8]) -> Result<()> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| err(describe(e)))?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| err(describe(e)))?;
        let text = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(STATE_METADATA_KEY))
            .ok_or_else(|| {
                err(format!(
                    "not an optimizer state: no metadata entry '{STATE_METADATA_KEY}'"
                ))
            })?;
        let meta: Value = serde_json::from_str(text)
            .map_err(|e| err(format!("metadata '{STATE_METADATA_KEY}' is not JSON: {e}")))?;
        if meta["format"] != FORMAT {
            return Err(err(format!(
                "metadata format is {}, not '{FORMAT}'",
                meta["format"]
            )));
        }
        if meta["version"].as_u64() != Some(STATE_FORMAT_VERSION) {
            return Err(err(format!(
                "format version {} is not supported (this build reads version {STATE_FORMAT_VERSION})",
                meta["version"]
            )));
        }
        self.check_settings(&meta)?;
        let seed = meta["seed"]
            .as_u64()
            .ok_or_else(|| err("metadata has no valid 'seed'"))?;
        let loaded = self.read_params(&meta, &st)?;
        for (slot, ((step, shape, state, m1), gnorm)) in self.slots.iter_mut().zip(loaded) {
            slot.step = step;
            slot.shape = shape;
            slot.state = state;
            slot.shard = None;
            slot.m1_scheme = m1;
            slot.gnorm_vec = gnorm;
        }
        self.options.seed = seed;
        Ok(())
    }

    /// Compares parameter names, groups and options with this optimizer's.
    fn check_settings(&self, meta: &Value) -> Result<()> {
        let groups = meta["groups"]
            .as_array()
            .ok_or_else(|| err("metadata has no 'groups' list"))?;
        let mut file_names = Vec::new();
        for g in groups {
            let names = g["params"]
                .as_array()
                .ok_or_else(|| err("a group in the metadata has no 'params' list"))?;
            for n in names {
                file_names.push(
                    n.as_str()
                        .ok_or_else(|| err("a parameter name is not a string"))?,
                );
            }
        }
        let mine = self.param_names();
        if let Some(n) = file_names.iter().find(|n| !mine.contains(n)) {
            return Err(err(format!(
                "unknown parameter '{n}': the file has state for it, this optimizer does not have it"
            )));
        }
        if let Some(n) = mine.iter().find(|n| !file_names.contains(n)) {
            return Err(err(format!("parameter '{n}' is missing from the file")));
        }
        if groups.len() != self.groups.len() {
            return Err(err(format!(
                "settings differ: the file has {} parameter group(s), this optimizer has {}",
                groups.len(),
                self.groups.len()
            )));
        }
        for (i, (f, g)) in groups.iter().zip(&self.groups).enumerate() {
            let differ = |what: &str, file: &Value, here: String| {
                Err(err(format!(
                    "settings differ: group {i} {what} is {file} in the file, {here} here"
                )))
            };
            if f["kind"] != g.kind.name() {
                return differ("algorithm", &f["kind"], g.kind.name().into());
            }
            if f["bits"].as_u64() != Some(bits_number(g.bits)) {
                return differ("state bits", &f["bits"], bits_number(g.bits).to_string());
            }
            if f["params"] != json!(g.params) {
                return differ("parameter list", &f["params"], json!(g.params).to_string());
            }
            if let Some(c) = g.kind.qadam() {
                for (key, s) in [("m1_scheme", c.m1), ("m2_scheme", c.m2)] {
                    if f[key] != s.name() {
                        return differ(key, &f[key], s.name().into());
                    }
                }
            }
            let hyper = g.hyperparameters();
            let option_differs = |name: &str, file: Option<f64>, here: Option<f64>| {
                Err(err(format!(
                    "settings differ: group {i} hyperparameter {name} is {} in the file, {} here",
                    describe_hyper(name, file),
                    describe_hyper(name, here)
                )))
            };
            for (name, v) in &hyper {
                let bits = format!("{:016x}", v.to_bits());
                let in_file = f["hyper_bits"][*name].as_str();
                if in_file == Some(bits.as_str()) {
                    continue;
                }
                // The bits are what the file records exactly; its `hyper` entry is for reading.
                let Some(file) = in_file.and_then(|b| u64::from_str_radix(b, 16).ok()) else {
                    return Err(err(format!(
                        "group {i} hyperparameter {name}: its exact value (hyper_bits) is missing \
                         or malformed in the file"
                    )));
                };
                return option_differs(name, Some(f64::from_bits(file)), Some(*v));
            }
            // A group option recorded in the file but off here.
            for name in ["max_unorm", "skip_zeros", "percentile_clipping"] {
                if !hyper.iter().any(|(n, _)| *n == name) && !f["hyper"][name].is_null() {
                    return option_differs(name, f["hyper"][name].as_f64(), None);
                }
            }
        }
        if meta["min_8bit_size"].as_u64() != Some(self.options.min_8bit_size as u64) {
            return Err(err(format!(
                "settings differ: min_8bit_size is {} in the file, {} here",
                meta["min_8bit_size"], self.options.min_8bit_size
            )));
        }
        Ok(())
    }

    /// Reads every parameter's step count, shape and state, checking every tensor.
    fn read_params(
        &self,
        meta: &Value,
        st: &SafeTensors<'_>,
    ) -> Result<Vec<(LoadedParam, Option<Vec<f32>>)>> {
        let entries = meta["params"]
            .as_array()
            .ok_or_else(|| err("metadata has no 'params' list"))?;
        let mut by_name: BTreeMap<&str, &Value> = BTreeMap::new();
        for e in entries {
            let name = e["name"]
                .as_str()
                .ok_or_else(|| err("a 'params' entry has no name"))?;
            if by_name.insert(name, e).is_some() {
                return Err(err(format!("parameter '{name}' is listed twice")));
            }
        }
        let mut expected = std::collections::HashSet::new();
        let mut out = Vec::new();
        for slot in &self.slots {
            let name = &slot.name;
            let e = by_name
                .get(name.as_str())
                .ok_or_else(|| err(format!("parameter '{name}' has no entry in 'params'")))?;
            let step = e["step"]
                .as_u64()
                .filter(|&s| s <= i32::MAX as u64)
                .map(|s| s as u32)
                .ok_or_else(|| {
                    err(format!(
                        "parameter '{name}': invalid step {} (a step count is 0..=2147483647)",
                        e["step"]
                    ))
                })?;
            let m1 = match &e["m1_scheme"] {
                Value::Null => None,
                Value::String(s) => Some(
                    MomentScheme::parse(s)
                        .map_err(|x| err(format!("parameter '{name}': m1_scheme: {x}")))?,
                ),
                other => {
                    return Err(err(format!(
                        "parameter '{name}': invalid m1_scheme {other}"
                    )))
                }
            };
            if step == 0 {
                if !e["state"].is_null() {
                    return Err(err(format!("parameter '{name}': state recorded at step 0")));
                }
                out.push(((0, None, None, m1), None));
                continue;
            }
            let shape: Vec<usize> = e["shape"]
                .as_array()
                .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
                .ok_or_else(|| err(format!("parameter '{name}': invalid shape {}", e["shape"])))?;
            let numel = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .filter(|&n| n > 0)
                .ok_or_else(|| err(format!("parameter '{name}': invalid shape {shape:?}")))?;
            let group = &self.groups[slot.group];
            let want = Layout::choose(
                &group.kind,
                group.bits,
                numel,
                self.options.min_8bit_size,
                m1,
            );
            if e["state"].as_str() != Some(want.name().as_str()) {
                return Err(err(format!(
                    "parameter '{name}': state layout {} in the file, this optimizer uses {} for {numel} elements",
                    e["state"],
                    want.name()
                )));
            }
            let mut datas = Vec::new();
            for (suffix, dtype, tshape) in want.tensors(&shape) {
                let tname = format!("{name}.{suffix}");
                let view = st
                    .tensor(&tname)
                    .map_err(|_| err(format!("missing tensor '{tname}'")))?;
                if view.dtype() != dtype {
                    return Err(err(format!(
                        "tensor '{tname}' has dtype {}, expected {}",
                        dtype_name(view.dtype()),
                        dtype_name(dtype)
                    )));
                }
                if view.shape() != tshape.as_slice() {
                    return Err(err(format!(
                        "tensor '{tname}' has the wrong shape {:?}, expected {tshape:?}",
                        view.shape()
                    )));
                }
                datas.push(view.data());
                expected.insert(tname);
            }
            if let Some(old) = &slot.shape {
                if *old != shape {
                    return Err(err(format!(
                        "parameter '{name}' has the wrong shape {shape:?} in the file, {old:?} here"
                    )));
                }
            }
            // Percentile clipping's norm history (groups that clip, from step 1 on).
            let gnorm = if group.clips() {
                let tname = format!("{name}.{GNORM_SUFFIX}");
                let view = st
                    .tensor(&tname)
                    .map_err(|_| err(format!("missing tensor '{tname}'")))?;
                if view.dtype() != Dtype::F32 || view.shape() != [GNORM_HISTORY] {
                    return Err(err(format!(
                        "tensor '{tname}' has dtype {} and shape {:?}, expected F32 \
                         [{GNORM_HISTORY}]",
                        dtype_name(view.dtype()),
                        view.shape()
                    )));
                }
                expected.insert(tname);
                Some(qforge_runtime::bytes_f32(view.data()))
            } else {
                None
            };
            let loaded = (step, Some(shape), Some(want.state_from(&datas)), m1);
            out.push((loaded, gnorm));
        }
        if let Some(extra) = st
            .names()
            .into_iter()
            .find(|n| !expected.contains(n.as_str()))
        {
            return Err(err(format!("unexpected tensor '{extra}'")));
        }
        Ok(out)
    }
}

/// A hyperparameter's value for a "settings differ" message (`None`: not recorded, i.e. the
/// option is off or the rule has no such hyperparameter).
fn describe_hyper(name: &str, value: Option<f64>) -> String {
    match (name, value) {
        ("max_unorm", None) => "0 (off)".into(),
        ("max_unorm", Some(v)) => format!("{v:?}"),
        ("skip_zeros", v) => (v.unwrap_or(0.0) != 0.0).to_string(),
        ("percentile_clipping", None) => "100 (off)".into(),
        ("percentile_clipping", Some(v)) => format!("{v}"),
        (_, None) => "absent".into(),
        (_, Some(v)) => format!("{v}"),
    }
}
