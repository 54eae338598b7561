//! Resolving `--model` (default: the embedded model) and loading it with a progress bar.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use kvb_engine::{model_fingerprint, Engine, EngineConfig};
use kvb_model::fetch::{ensure_default_model, models_dir};
use kvb_model::{
    load_pretrained, ActivationPrecision, FloatDtype, LoadOptions, ModelBackend, Pretrained,
    Tokenizer, WeightPrecision,
};
use std::path::{Path, PathBuf};

/// The model path to use: the given one, or the default model (fetched if absent).
pub fn resolve(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    match model {
        Some(p) => Ok(p.to_path_buf()),
        None => {
            let dir = models_dir();
            let paths = ensure_default_model(&dir, &mut |line| eprintln!("{line}"))
                .context("preparing the default model (pass --model PATH to use another)")?;
            // The GGUF as shipped: its Q4_1 weights stay packed (see kvb_model::packed).
            Ok(paths.gguf)
        }
    }
}

/// Loads `path` on `device`, showing a progress bar on stderr.
pub fn load<B: ModelBackend>(
    path: &Path,
    options: LoadOptions,
    device: &B::Device,
) -> anyhow::Result<Pretrained<B>> {
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} blocks")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    );
    let m = load_pretrained::<B>(path, options, device, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .with_context(|| format!("loading {}", path.display()));
    bar.finish_and_clear();
    m
}

/// Loads `path` and wraps it in an engine with `config`, with the chat template in file
/// `chat_template` in place of the model's.
pub fn load_engine<B: ModelBackend>(
    path: &Path,
    config: EngineConfig,
    chat_template: Option<&Path>,
    device: &B::Device,
) -> anyhow::Result<Engine<B>> {
    let options = LoadOptions {
        strict: config.strict,
        weights: config.weights,
        activations: config.activations,
    };
    let mut m = load::<B>(path, options, device)?;
    if let Some(file) = chat_template {
        m.tokenizer = with_template_file(m.tokenizer, file)?;
    }
    let fingerprint =
        model_fingerprint(path, m.format, m.model.config(), m.model.weight_precision())
            .context("fingerprinting the model")?;
    let (held, mapped) = (m.model.weight_bytes(), m.model.mapped_weight_bytes());
    eprintln!(
        "weights: {:.0} MB ({}{}{}{}{})",
        held as f64 / 1e6,
        match m.model.weight_precision() {
            WeightPrecision::Auto if B::runs_packed_weights() => "as stored",
            // A GPU backend multiplies dense tensors: GGUF blocks are expanded at load.
            WeightPrecision::Auto => "as stored, expanded to the backend's float type",
            WeightPrecision::F32 => "f32",
            WeightPrecision::Bf16 => "bf16",
            WeightPrecision::Q8_0 => "q8_0",
        },
        match m.model.activation_precision() {
            ActivationPrecision::F32 => String::new(),
            ActivationPrecision::Q8 => format!(", 8-bit activations on {}", q8_kernel()),
        },
        match FloatDtype::native::<B>() {
            FloatDtype::F32 => String::new(),
            float => format!(", computed in {float}"),
        },
        // What keeping (or widening) the file's blocks costs against the file itself.
        match m.stored_matrix_bytes {
            Some(file)
                if m.model.weight_precision() == WeightPrecision::Auto
                    && B::runs_packed_weights()
                    && (held + mapped) as f64 > 1.05 * file as f64 =>
            {
                format!(
                    "; the file's matrices: {:.0} MB, held at {:.2}x: some blocks are held \
                     wider, exactly (Q5_0 and Q5_1 as bytes for 8-bit activations, parts \
                     that must share a projection's cells; docs/models.md)",
                    file as f64 / 1e6,
                    (held + mapped) as f64 / file as f64
                )
            }
            Some(file) => format!("; the file's matrices: {:.0} MB", file as f64 / 1e6),
            None => String::new(),
        },
        match mapped {
            0 => String::new(),
            _ => format!(
                "; of them, the untied embedding's {:.0} MB read in place from the file",
                mapped as f64 / 1e6
            ),
        }
    );
    let explicit = config.max_pool_bytes.is_some();
    let engine = Engine::new(m.model, m.tokenizer, &fingerprint, config)?;
    let p = engine.paged_stats();
    eprintln!(
        "K/V pool: {:.2} GiB of {}, {} blocks of {} tokens ({} tokens of K/V){}",
        p.bytes_total() as f64 / (1u64 << 30) as f64,
        engine.pool_precision(),
        p.blocks_total,
        p.block_size,
        p.blocks_total * p.block_size,
        if explicit {
            ""
        } else {
            "; a quarter of this machine's memory, --max-pool-bytes to change"
        }
    );
    Ok(engine)
}

/// `tokenizer` with the chat template in `file`, checked by rendering a user message.
fn with_template_file(tokenizer: Tokenizer, file: &Path) -> anyhow::Result<Tokenizer> {
    let template = std::fs::read_to_string(file)
        .with_context(|| format!("reading the chat template {}", file.display()))?;
    let (bos, eos) = (
        tokenizer.bos_token().map(String::from),
        tokenizer.eos_token().map(String::from),
    );
    let tokenizer = tokenizer.with_chat_template(Some(template), bos, eos);
    tokenizer
        .apply_chat_template(&[kvb_model::ChatMessage::new("user", "Hello")], true)
        .with_context(|| format!("the chat template {}", file.display()))?;
    Ok(tokenizer)
}

/// What the 8-bit products run on (only the CPU backend runs them).
fn q8_kernel() -> &'static str {
    #[cfg(feature = "ndarray")]
    {
        kvb_model::model::int8::kernel_name()
    }
    #[cfg(not(feature = "ndarray"))]
    {
        "the CPU"
    }
}
