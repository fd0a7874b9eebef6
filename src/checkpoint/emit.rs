//! Writing a converted checkpoint: the output tensors of every input tensor are grouped into
//! shards of at most `--max-shard-size` (a quantized weight's tensors stay together), each shard is
//! streamed by a [`StWriter`], and the outputs are renamed into place only when all are complete:
//! a model folder (shards, `model.safetensors.index.json`, `config.json`, the input folder's other
//! files) through a temporary folder, a single file (and its `config.json`) through temporary
//! files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::model_in::{INDEX, SINGLE};
use super::out::{self, FolderLock, OutFolder, TempFile};
use super::st_write::{file_size_bound, OutTensor, StWriter, Trailing};
use crate::error::{Error, Result};

/// The output tensors of one input tensor.
pub struct Item {
    /// The input tensor.
    pub name: String,
    /// Output tensors of known length.
    pub outputs: Vec<OutTensor>,
    /// Trailing output tensors (JSON quant states).
    pub trailing: Vec<Trailing>,
}

impl Item {
    fn bound(&self) -> u64 {
        self.outputs.iter().map(|t| t.len).sum::<u64>()
            + self.trailing.iter().map(|t| t.max_len).sum::<u64>()
            // header entries
            + 150 * (self.outputs.len() + self.trailing.len()) as u64
    }
}

/// Where the checkpoint goes. Both forms hold the lock of the folder the output goes into, taken
/// before anything about the output (an existing folder or `config.json`) was looked at, so the
/// decisions and the writes of one run are not interleaved with another's.
pub enum Target {
    /// A model folder (created; replaced only with `overwrite`).
    Folder {
        /// The folder.
        path: PathBuf,
        /// Replace an existing folder.
        overwrite: bool,
        /// The input folder whose other files are copied (tokenizer, generation config...).
        companions: Option<(PathBuf, Vec<PathBuf>)>,
        /// `config.json` text, if any.
        config: Option<String>,
        /// The lock of the output's parent folder.
        lock: FolderLock,
    },
    /// A single safetensors file, and optionally a `config.json` to write beside it.
    File {
        /// The file (a symlink is written through).
        path: PathBuf,
        /// `(path, text)` of a `config.json` to write with it.
        config: Option<(PathBuf, String)>,
        /// The lock of the output's folder.
        lock: FolderLock,
    },
}

/// Streams one item's tensors into a shard's writer and returns its trailing tensors' bytes.
pub type RunItem<'a> = dyn FnMut(usize, &mut StWriter) -> Result<Vec<(String, Vec<u8>)>> + 'a;

/// What was written.
pub struct Written {
    /// The files of the model (shards), final paths.
    pub files: Vec<PathBuf>,
    /// Their total size in bytes.
    pub bytes: u64,
    /// The `config.json` written, if any.
    pub config: Option<PathBuf>,
    /// Other files copied from the input folder.
    pub copied_files: usize,
}

/// Groups items into shards of at most `max` bytes (an item larger than `max` gets a shard of its
/// own, as transformers does).
fn shard_plan(items: &[Item], max: u64, metadata: &BTreeMap<String, String>) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = vec![vec![]];
    let mut size = 0u64;
    for (i, item) in items.iter().enumerate() {
        let b = item.bound();
        if !shards.last().expect("one shard").is_empty() && size + b > max {
            shards.push(vec![]);
            size = 0;
        }
        shards.last_mut().expect("one shard").push(i);
        size += b;
    }
    let _ = metadata;
    shards
}

fn shard_name(i: usize, n: usize) -> String {
    if n == 1 {
        SINGLE.to_string()
    } else {
        format!("model-{:05}-of-{n:05}.safetensors", i + 1)
    }
}

/// Writes one shard: `run(item, writer)` streams item's tensors and returns its trailing bytes.
fn write_shard(
    path: &Path,
    items: &[Item],
    members: &[usize],
    metadata: &BTreeMap<String, String>,
    run: &mut RunItem<'_>,
) -> Result<u64> {
    let outputs: Vec<OutTensor> = members
        .iter()
        .flat_map(|&i| items[i].outputs.iter().cloned())
        .collect();
    let trailing: Vec<Trailing> = members
        .iter()
        .flat_map(|&i| items[i].trailing.iter().cloned())
        .collect();
    let mut w = StWriter::create(path, &outputs, &trailing, metadata.clone())?;
    let mut tail = Vec::new();
    for &i in members {
        tail.extend(run(i, &mut w)?);
    }
    w.finish(&tail)
}

/// Writes `items` to `target` (see the module documentation). `run(item, writer)` computes and
/// appends item's tensors and returns its trailing tensors' bytes.
///
/// # Errors
/// Whatever `run` or a write returns; the target is then left as it was.
pub fn write(
    items: &[Item],
    target: Target,
    metadata: &BTreeMap<String, String>,
    max_shard: u64,
    run: &mut RunItem<'_>,
) -> Result<Written> {
    match target {
        Target::Folder {
            path,
            overwrite,
            companions,
            config,
            lock,
        } => {
            let folder = OutFolder::prepare(&path, overwrite, lock)?;
            let shards = shard_plan(items, max_shard, metadata);
            let n = shards.len();
            let mut bytes = 0;
            let mut weight_map = Map::new();
            let mut files = Vec::new();
            for (s, members) in shards.iter().enumerate() {
                let name = shard_name(s, n);
                bytes += write_shard(&folder.temp.join(&name), items, members, metadata, run)?;
                for &i in members {
                    for t in &items[i].outputs {
                        weight_map.insert(t.name.clone(), json!(name));
                    }
                    for t in &items[i].trailing {
                        weight_map.insert(t.name.clone(), json!(name));
                    }
                }
                files.push(path.join(&name));
            }
            if n > 1 {
                let total: u64 = items
                    .iter()
                    .flat_map(|i| i.outputs.iter().map(|t| t.len))
                    .sum();
                let mut sorted: Vec<(String, Value)> = weight_map.into_iter().collect();
                sorted.sort_by(|a, b| a.0.cmp(&b.0));
                let index = json!({
                    "metadata": {"total_size": total},
                    "weight_map": Map::from_iter(sorted),
                });
                let text = serde_json::to_string_pretty(&index).expect("JSON serializes") + "\n";
                write_text(&folder.temp.join(INDEX), &text)?;
            }
            let mut wrote_config = None;
            if let Some(text) = config {
                write_text(&folder.temp.join("config.json"), &text)?;
                wrote_config = Some(path.join("config.json"));
            }
            let mut copied_files = 0;
            if let Some((from, skip)) = companions {
                copied_files = out::copy_companions(&from, &folder.temp, &skip)?;
            }
            folder.commit()?;
            Ok(Written {
                files,
                bytes,
                config: wrote_config,
                copied_files,
            })
        }
        Target::File { path, config, lock } => {
            let _lock = lock;
            let target = super::io::output_target(&path)?;
            let dir = out::parent_of(&target);
            let all: Vec<usize> = (0..items.len()).collect();
            let tmp = TempFile::new(&dir);
            let bytes = write_shard(&tmp.path, items, &all, metadata, run)?;
            let mut conf_tmp = None;
            if let Some((cpath, text)) = &config {
                let t = TempFile::new(&out::parent_of(cpath));
                write_text(&t.path, text)?;
                conf_tmp = Some((t, cpath.clone()));
            }
            tmp.commit(&target)?;
            let mut wrote_config = None;
            if let Some((t, cpath)) = conf_tmp {
                t.commit(&cpath)?;
                wrote_config = Some(cpath);
            }
            Ok(Written {
                files: vec![path],
                bytes,
                config: wrote_config,
                copied_files: 0,
            })
        }
    }
}

/// The largest size any file of `items` may reach (for messages).
pub fn bound(items: &[Item], metadata: &BTreeMap<String, String>) -> u64 {
    let outputs: Vec<OutTensor> = items.iter().flat_map(|i| i.outputs.clone()).collect();
    let trailing: Vec<Trailing> = items.iter().flat_map(|i| i.trailing.clone()).collect();
    file_size_bound(&outputs, &trailing, metadata)
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Parses a shard size: bytes, or a number with `KB`, `MB`, `GB` (powers of 1000, as
/// transformers' `max_shard_size`) or `KiB`, `MiB`, `GiB`.
///
/// # Errors
/// [`Error::Usage`] for anything else or 0.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => 0,
    };
    let v: f64 = num.parse().unwrap_or(0.0);
    let bytes = (v * mult as f64) as u64;
    if mult == 0 || bytes == 0 {
        return Err(Error::Usage(format!(
            "--max-shard-size '{s}' is not a size (e.g. 5GB, 500MB, 2GiB, 1000000)"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_transformers() {
        assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
        assert_eq!(parse_size("200KB").unwrap(), 200_000);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("0").is_err());
    }
}
