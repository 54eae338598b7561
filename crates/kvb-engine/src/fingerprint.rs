//! The identity of a model: a blake3 digest of its config and every byte of its weights, so that
//! cached K/V can never be served to another model, or to the same architecture with other weights.

use crate::EngineError;
use kvb_model::{ModelConfig, ModelFormat, WeightPrecision};
use std::path::{Path, PathBuf};

fn weight_files(path: &Path, format: ModelFormat) -> Result<Vec<PathBuf>, EngineError> {
    match format {
        ModelFormat::Gguf => Ok(vec![path.to_path_buf()]),
        ModelFormat::HfFolder => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| EngineError::Io {
                    what: format!("listing {}", path.display()),
                    source: e,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            Ok(files)
        }
    }
}

/// Digest of `config` and the weight files of the model at `path` (hashing ~540 MB of SmolLM2's
/// f32 weights takes ~0.3 s, once per engine).
pub fn model_fingerprint(
    path: &Path,
    format: ModelFormat,
    config: &ModelConfig,
    precision: WeightPrecision,
) -> Result<[u8; 32], EngineError> {
    let mut h = blake3::Hasher::new_derive_key("kvb 2026-11 model fingerprint");
    h.update(config.to_hf_json().to_string().as_bytes());
    // Weights kept as stored and weights expanded to f32 compute the same bits (see
    // kvb_model::packed), so they share one cache; a lossy precision gets its own.
    if precision.is_lossy() {
        h.update(format!("weights {precision}").as_bytes());
    }
    for file in weight_files(path, format)? {
        let f = std::fs::File::open(&file).map_err(|e| EngineError::Io {
            what: format!("opening {}", file.display()),
            source: e,
        })?;
        let len = f.metadata().map_err(|e| EngineError::Io {
            what: format!("reading the size of {}", file.display()),
            source: e,
        })?;
        h.update(&len.len().to_le_bytes());
        // Read, not mapped: a mapped file's pages count as the process's memory while they are
        // hashed, which for a 1 GB GGUF doubled the peak resident size of a load (the digest is
        // the same either way; a concurrent writer could at worst change it: a miss, never a
        // wrong hit). Each piece is hashed on every core (blake3's tree: the same digest).
        hash_all(&mut h, f).map_err(|e| EngineError::Io {
            what: format!("reading {}", file.display()),
            source: e,
        })?;
    }
    Ok(*h.finalize().as_bytes())
}

/// Feeds everything `f` holds to `h`, 8 MiB at a time, each piece hashed in parallel.
fn hash_all(h: &mut blake3::Hasher, mut f: impl std::io::Read) -> std::io::Result<()> {
    let mut piece = vec![0u8; 8 << 20];
    loop {
        match f.read(&mut piece) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                h.update_rayon(&piece[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces hashed in parallel give the digest of the whole read at once, across piece ends.
    #[test]
    fn pieces_hash_as_the_whole() {
        let bytes: Vec<u8> = (0..(8usize << 20) * 2 + 12_345)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect();
        let mut pieces = blake3::Hasher::new();
        hash_all(&mut pieces, bytes.as_slice()).unwrap();
        assert_eq!(pieces.finalize(), blake3::hash(&bytes));
    }
}
