//! Loading a model and its tokenizer from a HuggingFace folder or a GGUF file.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufModel;
use crate::model::{ActivationPrecision, Model, ModelBackend, WeightPrecision};
use crate::tokenizer::Tokenizer;
use crate::weights::SafetensorsDir;
use std::path::{Path, PathBuf};

/// The two on-disk forms kvb reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A folder with `config.json`, `*.safetensors` and `tokenizer.json`.
    HfFolder,
    /// A single `.gguf` file.
    Gguf,
}

/// How to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Refuse unknown architectures (on by default).
    pub strict: bool,
    /// The precision weights are held in (default: as stored).
    pub weights: WeightPrecision,
    /// How products quantize their input rows (default: f32, the exact products).
    pub activations: ActivationPrecision,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            strict: true,
            weights: WeightPrecision::Auto,
            activations: ActivationPrecision::F32,
        }
    }
}

/// A model ready to run, with its tokenizer.
#[derive(Debug, Clone)]
pub struct Pretrained<B: ModelBackend> {
    /// The weights on the backend.
    pub model: Model<B>,
    /// The tokenizer and chat template.
    pub tokenizer: Tokenizer,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// In which form.
    pub format: ModelFormat,
    /// Bytes of the file's matrices as stored (a GGUF's 2-d tensors), to say at load what
    /// keeping or widening them costs; `None` for a folder.
    pub stored_matrix_bytes: Option<usize>,
}

/// Tells the form of `path`: a `.gguf` file or a model folder.
pub fn detect_format(path: &Path) -> Result<ModelFormat> {
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(kvb_modelfile::FileError::Config {
                path: path.join("config.json"),
                reason: "the model folder has no config.json".into(),
            }
            .into());
        }
        Ok(ModelFormat::HfFolder)
    } else if path.is_file() {
        Ok(ModelFormat::Gguf)
    } else {
        Err(ModelError::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no model file or folder here"),
        ))
    }
}

/// Reads only the configuration of the model at `path`.
pub fn load_config(path: &Path, options: LoadOptions) -> Result<ModelConfig> {
    match detect_format(path)? {
        ModelFormat::HfFolder => Ok(ModelConfig::from_file(
            &path.join("config.json"),
            options.strict,
        )?),
        ModelFormat::Gguf => Ok(GgufModel::open(path)?.config(options.strict)?),
    }
}

/// Loads the model at `path` (folder or `.gguf`) onto `device`; `progress(done, total)` reports
/// how many blocks are built.
pub fn load_pretrained<B: ModelBackend>(
    path: &Path,
    options: LoadOptions,
    device: &B::Device,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Pretrained<B>> {
    let format = detect_format(path)?;
    let mut stored_matrix_bytes = None;
    let (model, tokenizer) = match format {
        ModelFormat::HfFolder => {
            let config = ModelConfig::from_file(&path.join("config.json"), options.strict)?;
            let tokenizer = Tokenizer::from_dir(path)?;
            check_vocabulary(tokenizer.vocab_size(), &config)?;
            let weights = SafetensorsDir::open(path)?;
            (
                Model::load_with(&config, &weights, options.weights, device, progress)?,
                tokenizer,
            )
        }
        ModelFormat::Gguf => {
            let gguf = GgufModel::open(path)?;
            let config = gguf.config(options.strict)?;
            check_vocabulary(gguf.vocabulary_len(), &config)?;
            // Building a 128k-token vocabulary takes one core half a second: it runs beside the
            // weights' repack.
            let (tokenizer, model) = std::thread::scope(|s| {
                let tokenizer = s.spawn(|| gguf_tokenizer(&gguf));
                let model = Model::load_with(&config, &gguf, options.weights, device, progress);
                let tokenizer = tokenizer.join().unwrap_or_else(|panic| {
                    std::panic::resume_unwind(panic);
                });
                (tokenizer, model)
            });
            let (tokenizer, model) = (tokenizer?, model?);
            check_vocabulary(tokenizer.vocab_size(), &config)?;
            stored_matrix_bytes = Some(
                gguf.header()
                    .tensors
                    .values()
                    .filter(|t| t.shape.len() == 2)
                    .map(|t| t.range.len())
                    .sum(),
            );
            (model, tokenizer)
        }
    };
    let model = model.with_activations(options.activations)?;
    // Reading and re-laying the tensors freed temporaries on the host, whatever the backend: on
    // an 8B-shaped Q4_K_M file, under the `kvb` binary's policy of keeping freed heap, they put
    // the peak RSS 6 MB over issue 40's target; released, it fell by 99 MB.
    crate::release_freed_host_memory();
    Ok(Pretrained {
        model,
        tokenizer,
        path: path.to_path_buf(),
        format,
        stored_matrix_bytes,
    })
}

/// The tokenizer of a GGUF file: its vocabulary, merges and chat template.
fn gguf_tokenizer(gguf: &GgufModel) -> Result<Tokenizer> {
    Ok(
        Tokenizer::from_json_value(gguf.tokenizer_json()?)?.with_chat_template(
            gguf.chat_template(),
            gguf.special_token("tokenizer.ggml.bos_token_id"),
            gguf.special_token("tokenizer.ggml.eos_token_id"),
        ),
    )
}

/// A tokenizer of `tokens` tokens whose ids run past the model's embedding rows belongs to another
/// model: its tokens would index rows that do not exist. Checked before any weight is read.
fn check_vocabulary(tokens: usize, config: &ModelConfig) -> Result<()> {
    if tokens > config.vocab_size {
        return Err(ModelError::Tokenizer(format!(
            "the tokenizer has {tokens} tokens but the model's vocabulary has {} rows: the \
             tokenizer belongs to another model",
            config.vocab_size
        )));
    }
    Ok(())
}
