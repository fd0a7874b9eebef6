//! A checkpoint to read: one safetensors file, or a Hugging Face model folder (`config.json` with
//! `model.safetensors` or the sharded `model.safetensors.index.json` and its shards). Every shard is
//! memory-mapped; the index is checked against the shards (each tensor in exactly one shard, as the
//! index says).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::st_read::{pickle_name, StFile, TensorInfo, PICKLE};
use crate::error::{Error, Result};

/// The index file of a sharded checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";
/// The single-file checkpoint of a model folder.
pub const SINGLE: &str = "model.safetensors";

/// A checkpoint being read.
pub struct ModelIn {
    /// The model folder (for a single file: the folder it is in).
    pub dir: PathBuf,
    /// True when the input named a folder or an index (the output is a folder then).
    pub is_folder: bool,
    /// `config.json` of the folder, if any.
    pub config: Option<Map<String, Value>>,
    /// The shards (one for a single file).
    pub shards: Vec<StFile>,
    /// The index's `metadata` (sharded checkpoints).
    pub index_metadata: Map<String, Value>,
    /// Which shard holds each tensor.
    pub location: BTreeMap<String, usize>,
    /// Files of the folder that are part of the checkpoint itself (shards, index, config).
    pub own_files: Vec<PathBuf>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a JSON object file.
///
/// # Errors
/// [`Error::Io`] or [`Error::Usage`] naming the file.
pub fn read_json(path: &Path) -> Result<Map<String, Value>> {
    let text = std::fs::read(path).map_err(io(path))?;
    match serde_json::from_slice(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(Error::Usage(format!(
            "{}: not a JSON object",
            path.display()
        ))),
        Err(e) => Err(Error::Usage(format!(
            "{}: not valid JSON: {e}",
            path.display()
        ))),
    }
}

impl ModelIn {
    /// Opens `path`: a safetensors file, a model folder or an index file.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing path; [`Error::Usage`] for a folder without a safetensors
    /// checkpoint (with [`PICKLE`] when it only has a pickle one), an index naming a missing
    /// shard or a tensor its shard lacks, a shard tensor the index does not list, or a tensor in
    /// two shards; every error of [`StFile::open`].
    pub fn open(path: &Path) -> Result<ModelIn> {
        let meta = std::fs::metadata(path).map_err(io(path))?;
        if meta.is_dir() {
            let index = path.join(INDEX);
            if index.is_file() {
                return ModelIn::from_index(&index);
            }
            let single = path.join(SINGLE);
            if single.is_file() {
                return ModelIn::single(&single, true);
            }
            let mut st = Vec::new();
            let mut pickles = Vec::new();
            for e in std::fs::read_dir(path).map_err(io(path))?.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "safetensors") {
                    st.push(p);
                } else if p.is_file() && pickle_name(&p) {
                    pickles.push(p);
                }
            }
            st.sort();
            return match (st.len(), pickles.first()) {
                (1, _) => ModelIn::single(&st[0], true),
                (0, Some(p)) => Err(Error::Usage(format!("{}: {PICKLE}", p.display()))),
                (0, None) => Err(Error::Usage(format!(
                    "{}: no {SINGLE} or {INDEX} in this folder",
                    path.display()
                ))),
                (n, _) => Err(Error::Usage(format!(
                    "{}: {n} safetensors files but no {INDEX} saying which tensor is where",
                    path.display()
                ))),
            };
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".index.json") {
            if name.contains(".bin.") {
                return Err(Error::Usage(format!("{}: {PICKLE}", path.display())));
            }
            return ModelIn::from_index(path);
        }
        ModelIn::single(path, false)
    }

    fn parent(path: &Path) -> PathBuf {
        path.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."))
    }

    fn config_of(dir: &Path) -> Result<Option<Map<String, Value>>> {
        let p = dir.join("config.json");
        if p.is_file() {
            read_json(&p).map(Some)
        } else {
            Ok(None)
        }
    }

    fn single(path: &Path, is_folder: bool) -> Result<ModelIn> {
        let file = StFile::open(path)?;
        let dir = ModelIn::parent(path);
        let location = file.tensors.keys().map(|n| (n.clone(), 0)).collect();
        Ok(ModelIn {
            config: ModelIn::config_of(&dir)?,
            own_files: vec![path.to_path_buf(), dir.join("config.json")],
            dir,
            is_folder,
            shards: vec![file],
            index_metadata: Map::new(),
            location,
        })
    }

    fn from_index(index: &Path) -> Result<ModelIn> {
        let dir = ModelIn::parent(index);
        let json = read_json(index)?;
        let bad = |m: String| Error::Usage(format!("{}: {m}", index.display()));
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("has no 'weight_map' object".into()))?;
        let mut shard_names: Vec<String> = Vec::new();
        let mut wanted: BTreeMap<String, usize> = BTreeMap::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("weight_map entry '{tensor}' is not a file name")))?;
            if file.contains('/') || file.contains('\\') || file == ".." {
                return Err(bad(format!(
                    "weight_map entry '{tensor}' names '{file}', which is not a file of this folder"
                )));
            }
            let i = match shard_names.iter().position(|s| s == file) {
                Some(i) => i,
                None => {
                    shard_names.push(file.to_string());
                    shard_names.len() - 1
                }
            };
            wanted.insert(tensor.clone(), i);
        }
        let mut shards = Vec::new();
        let mut own_files = vec![index.to_path_buf(), dir.join("config.json")];
        for name in &shard_names {
            let p = dir.join(name);
            if !p.is_file() {
                return Err(bad(format!("names shard '{name}', which is missing")));
            }
            own_files.push(p.clone());
            shards.push(StFile::open(&p)?);
        }
        let mut location = BTreeMap::new();
        for (i, shard) in shards.iter().enumerate() {
            for name in shard.tensors.keys() {
                match wanted.get(name) {
                    Some(&w) if w == i => {}
                    Some(&w) => {
                        return Err(bad(format!(
                            "tensor '{name}' is in {} but the index says {}",
                            shard.path.display(),
                            shard_names[w]
                        )))
                    }
                    None => {
                        return Err(bad(format!(
                            "tensor '{name}' of {} is not in the index's weight_map",
                            shard.path.display()
                        )))
                    }
                }
                location.insert(name.clone(), i);
            }
        }
        if let Some(name) = wanted.keys().find(|n| !location.contains_key(*n)) {
            return Err(bad(format!(
                "lists tensor '{name}' but its shard {} does not have it",
                shard_names[wanted[name]]
            )));
        }
        Ok(ModelIn {
            config: ModelIn::config_of(&dir)?,
            dir,
            is_folder: true,
            shards,
            index_metadata: json
                .get("metadata")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            location,
            own_files,
        })
    }

    /// The tensor `name` and the shard holding it.
    pub fn get(&self, name: &str) -> Option<(&StFile, &TensorInfo)> {
        let &i = self.location.get(name)?;
        let shard = &self.shards[i];
        Some((shard, &shard.tensors[name]))
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.location.keys()
    }

    /// The `model_type` of the config.
    pub fn model_type(&self) -> Option<&str> {
        self.config.as_ref()?.get("model_type")?.as_str()
    }

    /// The checkpoint's total size in bytes.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(StFile::file_len).sum()
    }

    /// The `__metadata__` of the first shard (transformers writes `{"format": "pt"}` in each).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.shards
            .first()
            .map(|s| s.metadata.clone())
            .unwrap_or_default()
    }

    /// A short name for messages: the folder, or the file of a single-file checkpoint.
    pub fn display(&self) -> String {
        if self.is_folder || self.shards.len() != 1 {
            self.dir.display().to_string()
        } else {
            self.shards[0].path.display().to_string()
        }
    }

    /// The path of the shard holding `name` (for errors).
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.get(name)
            .map(|(s, _)| s.path.clone())
            .unwrap_or_else(|| self.dir.clone())
    }
}
