//! Weights from `*.safetensors`: one file, or shards listed in `model.safetensors.index.json`.

use super::{HostTensor, StoredTensor, TensorSource};
use crate::error::{FileError, Result};
use crate::gguf::GgmlType;
use crate::BlockTensor;
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The safetensors files of a model folder, memory-mapped; headers are validated at open.
pub struct SafetensorsDir {
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name -> (file index, dtype, shape, absolute byte range).
    index: HashMap<String, (usize, Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

impl SafetensorsDir {
    /// Opens the safetensors files of `dir`: the shards named by `model.safetensors.index.json` when
    /// present, else every `*.safetensors` file.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let paths: Vec<PathBuf> = if index_path.exists() {
            let text =
                std::fs::read_to_string(&index_path).map_err(|e| FileError::io(&index_path, e))?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                FileError::Weights(format!("{}: invalid JSON: {e}", index_path.display()))
            })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| {
                    FileError::Weights(format!("{} has no `weight_map`", index_path.display()))
                })?;
            let mut shards: Vec<String> = map
                .values()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            shards.sort();
            shards.dedup();
            shards.into_iter().map(|s| dir.join(s)).collect()
        } else {
            let entries = std::fs::read_dir(dir).map_err(|e| FileError::io(dir, e))?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            found
        };
        if paths.is_empty() {
            return Err(FileError::Weights(format!(
                "no *.safetensors file in {}",
                dir.display()
            )));
        }
        let mut dir = SafetensorsDir {
            files: Vec::new(),
            index: HashMap::new(),
        };
        for path in paths {
            let file = File::open(&path).map_err(|e| FileError::io(&path, e))?;
            // SAFETY: the map is read-only; a file changed underneath us can only yield wrong
            // values, which the shape and size checks below and in `read` bound.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| FileError::io(&path, e))?;
            dir.add_file(path, mmap)?;
        }
        Ok(dir)
    }

    /// One safetensors file held in memory (`name` appears in errors), read as [`Self::open`]
    /// reads a file.
    pub fn from_bytes(name: &Path, bytes: &[u8]) -> Result<Self> {
        let mmap = super::map_bytes(bytes).map_err(|e| FileError::io(name, e))?;
        let mut dir = SafetensorsDir {
            files: Vec::new(),
            index: HashMap::new(),
        };
        dir.add_file(name.to_path_buf(), mmap)?;
        Ok(dir)
    }

    /// Validates the header of the file `mmap` and indexes its tensors.
    fn add_file(&mut self, path: PathBuf, mmap: Mmap) -> Result<()> {
        let (header_len, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            FileError::Weights(format!(
                "{}: invalid safetensors header: {e}",
                path.display()
            ))
        })?;
        let data_start = 8 + header_len;
        let i = self.files.len();
        for (name, info) in meta.tensors() {
            let (a, b) = info.data_offsets;
            self.index.insert(
                name,
                (
                    i,
                    info.dtype,
                    info.shape.clone(),
                    data_start + a..data_start + b,
                ),
            );
        }
        self.files.push((path, mmap));
        Ok(())
    }
}

impl TensorSource for SafetensorsDir {
    fn names(&self) -> Vec<String> {
        self.index.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.index.get(name).map(|(_, _, s, _)| s.clone())
    }

    fn read(&self, name: &str) -> Result<HostTensor> {
        let (dtype, shape, bytes) = self.tensor_bytes(name)?;
        let data = match dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        };
        Ok(HostTensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// A 2-d f16 or bf16 tensor as stored (the model keeps it at 16 bits), anything else as f32.
    fn read_stored(&self, name: &str) -> Result<StoredTensor> {
        let (dtype, shape, bytes) = self.tensor_bytes(name)?;
        let ggml_type = match dtype {
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::Bf16,
            _ => return self.read(name).map(StoredTensor::F32),
        };
        let &[rows, cols] = shape else {
            return self.read(name).map(StoredTensor::F32);
        };
        Ok(StoredTensor::Blocks(BlockTensor {
            ggml_type,
            rows,
            cols,
            bytes: bytes.to_vec(),
        }))
    }
}

impl SafetensorsDir {
    /// The dtype, shape and bytes of `name`, checked to be a dtype kvb reads with as many bytes
    /// as its shape needs.
    fn tensor_bytes(&self, name: &str) -> Result<(Dtype, &[usize], &[u8])> {
        let (file, dtype, shape, range) = self
            .index
            .get(name)
            .ok_or_else(|| FileError::Weights(format!("tensor `{name}` is missing")))?;
        let (path, mmap) = &self.files[*file];
        let bytes = mmap.get(range.clone()).ok_or_else(|| {
            FileError::Weights(format!(
                "{}: tensor `{name}` lies outside the file (bytes {range:?})",
                path.display()
            ))
        })?;
        let count: usize = shape.iter().product();
        let width = match dtype {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            other => {
                return Err(FileError::Weights(format!(
                    "tensor `{name}` has dtype {other:?}; kvb reads F32, F16 and BF16"
                )))
            }
        };
        if bytes.len() != count * width {
            return Err(FileError::Weights(format!(
                "tensor `{name}`: {} bytes for shape {shape:?} of {dtype:?}",
                bytes.len()
            )));
        }
        Ok((*dtype, shape, bytes))
    }
}
