//! A 2-d tensor read in place from a file's memory map, a row at a time: an untied token
//! embedding, of which a request touches a few rows. Only those rows' pages are ever read into
//! memory, and they are the page cache's, shared with every process that maps the same file.

use crate::error::{FileError, Result};
use crate::gguf::{dequantize, GgmlType};
use memmap2::Mmap;
use std::ops::Range;
use std::sync::Arc;

/// `rows` rows of `cols` values stored as `ggml_type` blocks at `range` of `map`.
#[derive(Clone)]
pub struct MappedRows {
    map: Arc<Mmap>,
    range: Range<usize>,
    ggml_type: GgmlType,
    rows: usize,
    cols: usize,
}

impl std::fmt::Debug for MappedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedRows({:?} [{}, {}], {} bytes)",
            self.ggml_type,
            self.rows,
            self.cols,
            self.range.len()
        )
    }
}

impl MappedRows {
    /// The tensor at `range` of `map`; an error unless the range lies in the map and holds
    /// exactly `rows` rows of whole blocks.
    pub fn new(
        map: Arc<Mmap>,
        range: Range<usize>,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let (per_block, block_bytes) = ggml_type.block();
        let whole = per_block > 0 && cols.is_multiple_of(per_block);
        let expected = whole.then(|| rows * (cols / per_block) * block_bytes);
        if expected != Some(range.len()) || range.end > map.len() {
            return Err(FileError::Weights(format!(
                "a mapped {ggml_type:?} tensor of [{rows}, {cols}] cannot be {} bytes at {}..{} of \
                 a {}-byte map",
                range.len(),
                range.start,
                range.end,
                map.len()
            )));
        }
        Ok(MappedRows {
            map,
            range,
            ggml_type,
            rows,
            cols,
        })
    }

    /// Row `r`'s values, as [`dequantize`] gives them for the whole tensor; `None` past the
    /// last row.
    pub fn row(&self, r: usize) -> Option<Vec<f32>> {
        if r >= self.rows {
            return None;
        }
        let row_bytes = self.range.len() / self.rows;
        let at = self.range.start + r * row_bytes;
        Some(dequantize(self.ggml_type, &self.map[at..at + row_bytes]))
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The block type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Bytes of the file the rows are read from.
    pub fn mapped_bytes(&self) -> usize {
        self.range.len()
    }
}
