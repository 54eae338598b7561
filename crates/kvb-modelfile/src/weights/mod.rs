//! Where weights come from: safetensors folders and GGUF files, behind one trait.
//!
//! Every source hands out tensors by their HuggingFace name, in the HF layout, as f32 on the host
//! (or, from GGUF, as quantized blocks the model can keep packed); the model builder converts them
//! to the backend's float type. [`WeightLoader`] keeps count of what
//! was taken so that a checkpoint with a missing, misshapen or unused tensor is an error naming it.

mod loader;
mod safetensors_dir;

pub use loader::WeightLoader;
pub use safetensors_dir::SafetensorsDir;

use crate::error::Result;
use crate::{BlockTensor, MappedRows};
use memmap2::{Mmap, MmapMut};

/// A tensor on the host: row-major f32 values and their shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first (PyTorch order).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

/// A collection of named weight tensors in the HF layout.
pub trait TensorSource {
    /// Every tensor name the source holds.
    fn names(&self) -> Vec<String>;
    /// The shape of `name`, or `None` if absent.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Reads `name` and converts it to f32.
    fn read(&self, name: &str) -> Result<HostTensor>;
    /// Reads `name` as stored where the model can keep it so (a GGUF's quantized blocks), else
    /// as f32.
    fn read_stored(&self, name: &str) -> Result<StoredTensor> {
        self.read(name).map(StoredTensor::F32)
    }
    /// `name` read in place from a mapped file, a row at a time, where the source can (a GGUF
    /// file's tensor whose rows are stored as the model reads them); `None` elsewhere.
    fn read_mapped(&self, name: &str) -> Result<Option<MappedRows>> {
        let _ = name;
        Ok(None)
    }
}

/// A tensor as a source hands it out: f32 values, or quantized blocks kept as stored.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredTensor {
    /// Values in f32.
    F32(HostTensor),
    /// A GGUF's blocks, or 16-bit floats, as stored ([`crate::BlockTensor`]).
    Blocks(BlockTensor),
}

impl StoredTensor {
    /// The values as f32, whatever the storage.
    pub fn into_f32(self) -> HostTensor {
        match self {
            StoredTensor::F32(t) => t,
            StoredTensor::Blocks(b) => HostTensor {
                shape: vec![b.rows, b.cols],
                data: b.to_f32(),
            },
        }
    }
}

/// `bytes` copied into a read-only anonymous map, so that a model file held in memory is read by
/// exactly the code that reads a mapped file.
pub(crate) fn map_bytes(bytes: &[u8]) -> std::io::Result<Mmap> {
    let mut map = MmapMut::map_anon(bytes.len())?;
    map.copy_from_slice(bytes);
    map.make_read_only()
}
