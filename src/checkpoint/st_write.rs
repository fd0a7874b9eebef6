//! A safetensors file written tensor by tensor. The layout is fixed when the file is created: every
//! tensor's dtype, shape and byte length is known in advance, except a few small trailing `U8`
//! tensors (the JSON quant states, whose length depends on a computed number) that are placed after
//! all others and written at the end with the header. Tensor bytes are written at their final
//! positions as they are computed, so nothing but the part being written is held in memory.
//!
//! Layout: the 8-byte header length, the header JSON padded with spaces to a length reserved in
//! advance (a multiple of 8; the format allows trailing spaces), then the tensors sorted by
//! alignment (8-byte dtypes first) and name as the safetensors crate sorts them, so every tensor
//! starts at a multiple of its element size, then the trailing tensors.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::st_read::StDtype;
use crate::error::{Error, Result};

/// A tensor of the file: name, dtype, shape and byte length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutTensor {
    /// Name.
    pub name: String,
    /// Dtype.
    pub dtype: StDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte length.
    pub len: u64,
}

/// A trailing `U8` tensor of at most `max_len` bytes whose bytes are given to [`StWriter::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trailing {
    /// Name.
    pub name: String,
    /// The most bytes it may have.
    pub max_len: u64,
}

/// The bytes a file of these tensors takes at most (header included).
pub fn file_size_bound(
    tensors: &[OutTensor],
    trailing: &[Trailing],
    metadata: &BTreeMap<String, String>,
) -> u64 {
    let (layout, _) = Layout::new(tensors, trailing);
    8 + layout.reserved(metadata)
        + layout.fixed_end
        + trailing.iter().map(|t| t.max_len).sum::<u64>()
}

struct Layout {
    /// Fixed tensors in file order with their begin offsets.
    order: Vec<(OutTensor, u64)>,
    fixed_end: u64,
    trailing: Vec<Trailing>,
}

impl Layout {
    fn new(tensors: &[OutTensor], trailing: &[Trailing]) -> (Layout, HashMap<String, usize>) {
        let mut sorted: Vec<&OutTensor> = tensors.iter().collect();
        sorted.sort_by(|a, b| {
            b.dtype
                .alignment()
                .cmp(&a.dtype.alignment())
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut at = 0u64;
        let mut order = Vec::with_capacity(sorted.len());
        let mut index = HashMap::new();
        for t in sorted {
            index.insert(t.name.clone(), order.len());
            order.push((t.clone(), at));
            at += t.len;
        }
        (
            Layout {
                order,
                fixed_end: at,
                trailing: trailing.to_vec(),
            },
            index,
        )
    }

    /// The header JSON with the trailing tensors' lengths.
    fn header(&self, metadata: &BTreeMap<String, String>, trailing_lens: &[u64]) -> String {
        let mut map = Map::new();
        if !metadata.is_empty() {
            map.insert("__metadata__".into(), json!(metadata));
        }
        for (t, begin) in &self.order {
            map.insert(
                t.name.clone(),
                json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [begin, begin + t.len]}),
            );
        }
        let mut at = self.fixed_end;
        for (t, &len) in self.trailing.iter().zip(trailing_lens) {
            map.insert(
                t.name.clone(),
                json!({"dtype": "U8", "shape": [len], "data_offsets": [at, at + len]}),
            );
            at += len;
        }
        serde_json::to_string(&Value::Object(map)).expect("JSON values always serialize")
    }

    /// Header bytes reserved: the header with every trailing tensor at its largest, rounded up
    /// to a multiple of 8 (offsets and lengths only shrink, so the real header fits).
    fn reserved(&self, metadata: &BTreeMap<String, String>) -> u64 {
        let max: Vec<u64> = self.trailing.iter().map(|t| t.max_len).collect();
        (self.header(metadata, &max).len() as u64).div_ceil(8) * 8
    }
}

/// A safetensors file being written (see the module documentation).
pub struct StWriter {
    path: PathBuf,
    file: File,
    layout: Layout,
    index: HashMap<String, usize>,
    written: Vec<u64>,
    data_start: u64,
    reserved: u64,
    metadata: BTreeMap<String, String>,
}

impl StWriter {
    /// Creates `path` (a temporary file the caller renames into place) for these tensors.
    ///
    /// # Errors
    /// [`Error::Io`] naming the path; [`Error::Usage`] for a name given twice.
    pub fn create(
        path: &Path,
        tensors: &[OutTensor],
        trailing: &[Trailing],
        metadata: BTreeMap<String, String>,
    ) -> Result<StWriter> {
        let mut names = std::collections::HashSet::new();
        for n in tensors
            .iter()
            .map(|t| &t.name)
            .chain(trailing.iter().map(|t| &t.name))
        {
            if !names.insert(n.as_str()) {
                return Err(Error::Usage(format!(
                    "{}: tensor '{n}' would be written twice (a quantized weight's companion \
                     tensor collides with an existing tensor)",
                    path.display()
                )));
            }
        }
        let (layout, index) = Layout::new(tensors, trailing);
        let reserved = layout.reserved(&metadata);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
        // Locked while being written: an unlocked temporary file is a killed run's leftover.
        let _ = file.try_lock();
        Ok(StWriter {
            path: path.to_path_buf(),
            file,
            written: vec![0; layout.order.len()],
            layout,
            index,
            data_start: 8 + reserved,
            reserved,
            metadata,
        })
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Appends `bytes` to tensor `name` (its parts are written in order).
    ///
    /// # Errors
    /// [`Error::Usage`] for a tensor not in the layout or more bytes than it has (a bug, reported
    /// rather than written); [`Error::Io`] for a failed write.
    pub fn append(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let i = *self.index.get(name).ok_or_else(|| {
            Error::Usage(format!(
                "{}: tensor '{name}' is not in the planned layout",
                self.path.display()
            ))
        })?;
        let (t, begin) = &self.layout.order[i];
        let done = self.written[i];
        if done + bytes.len() as u64 > t.len {
            return Err(Error::Usage(format!(
                "{}: tensor '{name}' gets more than its planned {} bytes",
                self.path.display(),
                t.len
            )));
        }
        let at = self.data_start + begin + done;
        self.file.write_all_at(bytes, at).map_err(|e| self.io(e))?;
        self.written[i] += bytes.len() as u64;
        Ok(())
    }

    /// Reads back `len` bytes of tensor `name` from byte `offset` (already written).
    ///
    /// # Errors
    /// [`Error::Usage`] for a range not yet written (a bug); [`Error::Io`] for a failed read.
    pub fn read_back(&self, name: &str, offset: usize, len: usize) -> Result<Vec<u8>> {
        let i = *self.index.get(name).ok_or_else(|| {
            Error::Usage(format!(
                "{}: tensor '{name}' is not in the planned layout",
                self.path.display()
            ))
        })?;
        if (offset + len) as u64 > self.written[i] {
            return Err(Error::Usage(format!(
                "{}: tensor '{name}': bytes {offset}..{} read before they were written",
                self.path.display(),
                offset + len
            )));
        }
        let mut buf = vec![0u8; len];
        let at = self.data_start + self.layout.order[i].1 + offset as u64;
        self.file
            .read_exact_at(&mut buf, at)
            .map_err(|e| self.io(e))?;
        Ok(buf)
    }

    /// Writes the trailing tensors (in the order they were planned) and the header, and flushes
    /// the file to disk; returns the file's size.
    ///
    /// # Errors
    /// [`Error::Usage`] when a planned tensor was not completely written or a trailing tensor is
    /// missing or too long (bugs, reported); [`Error::Io`] for a failed write.
    pub fn finish(mut self, trailing: &[(String, Vec<u8>)]) -> Result<u64> {
        for ((t, _), &w) in self.layout.order.iter().zip(&self.written) {
            if w != t.len {
                return Err(Error::Usage(format!(
                    "{}: tensor '{}' got {w} of its {} bytes",
                    self.path.display(),
                    t.name,
                    t.len
                )));
            }
        }
        let mut lens = Vec::new();
        let mut at = self.data_start + self.layout.fixed_end;
        for t in self.layout.trailing.clone() {
            let bytes = trailing
                .iter()
                .find(|(n, _)| *n == t.name)
                .map(|(_, b)| b)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "{}: trailing tensor '{}' missing",
                        self.path.display(),
                        t.name
                    ))
                })?;
            if bytes.len() as u64 > t.max_len {
                return Err(Error::Usage(format!(
                    "{}: trailing tensor '{}' has {} bytes, more than the {} planned",
                    self.path.display(),
                    t.name,
                    bytes.len(),
                    t.max_len
                )));
            }
            self.file.write_all_at(bytes, at).map_err(|e| self.io(e))?;
            at += bytes.len() as u64;
            lens.push(bytes.len() as u64);
        }
        let mut header = self.layout.header(&self.metadata, &lens).into_bytes();
        assert!(
            header.len() as u64 <= self.reserved,
            "reserved header too small"
        );
        header.resize(self.reserved as usize, b' ');
        self.file
            .write_all_at(&(self.reserved).to_le_bytes(), 0)
            .and_then(|_| self.file.write_all_at(&header, 8))
            .and_then(|_| self.file.set_len(at))
            .and_then(|_| self.file.flush())
            .and_then(|_| self.file.sync_all())
            .map_err(|e| self.io(e))?;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::st_read::StFile;

    #[test]
    fn streamed_file_reads_back_aligned() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.safetensors");
        let t = |name: &str, dtype: &str, shape: Vec<usize>, len: u64| OutTensor {
            name: name.into(),
            dtype: StDtype::new(dtype),
            shape,
            len,
        };
        let tensors = vec![
            t("odd", "U8", vec![3], 3),
            t("f", "F32", vec![2], 8),
            t("d", "F64", vec![1], 8),
            t("h", "BF16", vec![3], 6),
        ];
        let trailing = vec![Trailing {
            name: "json".into(),
            max_len: 40,
        }];
        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let mut w = StWriter::create(&p, &tensors, &trailing, meta).unwrap();
        w.append("f", &1f32.to_le_bytes()).unwrap();
        w.append("f", &2f32.to_le_bytes()).unwrap();
        w.append("odd", &[1, 2, 3]).unwrap();
        w.append("d", &3f64.to_le_bytes()).unwrap();
        w.append("h", &[0; 6]).unwrap();
        assert!(w.append("h", &[0]).is_err());
        let size = w
            .finish(&[("json".into(), b"{\"a\": 1}".to_vec())])
            .unwrap();
        assert_eq!(size, std::fs::metadata(&p).unwrap().len());
        let f = StFile::open(&p).unwrap();
        for (name, info) in &f.tensors {
            assert_eq!(info.begin % info.dtype.alignment(), 0, "{name}");
        }
        assert_eq!(f.bytes(&f.tensors["odd"]), [1, 2, 3]);
        assert_eq!(f.bytes(&f.tensors["json"]), b"{\"a\": 1}");
        assert_eq!(f.metadata["format"], "pt");
        // The safetensors crate reads it too.
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(
            st.tensor("f").unwrap().data(),
            [1f32.to_le_bytes(), 2f32.to_le_bytes()].concat()
        );
    }

    #[test]
    fn incomplete_tensors_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("b.safetensors");
        let tensors = vec![OutTensor {
            name: "a".into(),
            dtype: StDtype::new("U8"),
            shape: vec![4],
            len: 4,
        }];
        let mut w = StWriter::create(&p, &tensors, &[], BTreeMap::new()).unwrap();
        w.append("a", &[1, 2]).unwrap();
        let e = w.finish(&[]).unwrap_err().to_string();
        assert!(e.contains("got 2 of its 4 bytes"), "{e}");
    }
}
