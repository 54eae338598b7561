//! Takes tensors from a source by name, checking shapes and remembering what was used.

use super::{HostTensor, StoredTensor, TensorSource};
use crate::error::{FileError, Result};
use crate::MappedRows;
use std::cell::RefCell;
use std::collections::BTreeSet;

/// Tensors a checkpoint may carry that no forward pass needs (buffers saved by old transformers).
fn is_ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq") || name.ends_with(".masked_bias")
}

/// Hands out tensors by name with their expected shape; [`WeightLoader::finish`] fails if any
/// tensor of the source was never asked for, so a mis-mapped checkpoint cannot load silently.
pub struct WeightLoader<'a> {
    source: &'a dyn TensorSource,
    taken: RefCell<BTreeSet<String>>,
}

impl<'a> WeightLoader<'a> {
    /// Wraps a source.
    pub fn new(source: &'a dyn TensorSource) -> Self {
        WeightLoader {
            source,
            taken: RefCell::new(BTreeSet::new()),
        }
    }

    /// Whether the source holds `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.source.shape(name).is_some()
    }

    /// Reads `name`, which must have exactly `shape`.
    pub fn take(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        self.check_shape(name, shape)?;
        let t = self.source.read(name)?;
        self.taken.borrow_mut().insert(name.to_string());
        Ok(t)
    }

    /// `name`, which must have exactly `shape`, read in place from the source's map where it
    /// can be ([`TensorSource::read_mapped`]); `None` (and `name` not taken) elsewhere.
    pub fn take_mapped(&self, name: &str, shape: &[usize]) -> Result<Option<MappedRows>> {
        self.check_shape(name, shape)?;
        let rows = self.source.read_mapped(name)?;
        if rows.is_some() {
            self.taken.borrow_mut().insert(name.to_string());
        }
        Ok(rows)
    }

    /// Reads `name`, which must have exactly `shape`, as the source stores it (see
    /// [`TensorSource::read_stored`]).
    pub fn take_stored(&self, name: &str, shape: &[usize]) -> Result<StoredTensor> {
        self.check_shape(name, shape)?;
        let t = self.source.read_stored(name)?;
        self.taken.borrow_mut().insert(name.to_string());
        Ok(t)
    }

    fn check_shape(&self, name: &str, shape: &[usize]) -> Result<()> {
        let found = self
            .source
            .shape(name)
            .ok_or_else(|| FileError::Weights(format!("tensor `{name}` is missing")))?;
        if found != shape {
            return Err(FileError::Weights(format!(
                "tensor `{name}` has shape {found:?}, expected {shape:?}"
            )));
        }
        Ok(())
    }

    /// Reads `name` if present (optional biases).
    pub fn take_optional(&self, name: &str, shape: &[usize]) -> Result<Option<HostTensor>> {
        if self.contains(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Fails if the source holds tensors that were never taken.
    pub fn finish(self) -> Result<()> {
        let taken = self.taken.into_inner();
        let mut unused: Vec<String> = self
            .source
            .names()
            .into_iter()
            .filter(|n| !taken.contains(n) && !is_ignorable(n))
            .collect();
        if unused.is_empty() {
            return Ok(());
        }
        unused.sort();
        let shown: Vec<&str> = unused.iter().take(5).map(String::as_str).collect();
        Err(FileError::Weights(format!(
            "{} tensor(s) of the checkpoint are not used by this architecture (e.g. {}): \
             the checkpoint does not match its config",
            unused.len(),
            shown.join(", ")
        )))
    }
}
