//! Where weights come from: safetensors folders and GGUF files, behind one trait.
//!
//! Every source hands out tensors by their HuggingFace name, in the HF layout, as f32 on the host;
//! the model builder converts them to the backend's float type. [`WeightLoader`] keeps count of what
//! was taken so that a checkpoint with a missing, misshapen or unused tensor is an error naming it.

mod loader;
mod safetensors_dir;

pub use loader::WeightLoader;
pub use safetensors_dir::SafetensorsDir;

use crate::error::Result;

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
}
