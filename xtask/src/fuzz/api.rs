//! The server as a whole under schemathesis (PyPI): `kvb serve` on the tiny Llama fixture (a chat
//! template added), and schemathesis generating requests from its `/openapi.json` for a bounded
//! time, valid and invalid, with every check but one: no 5xx, every status, content type, header
//! and body as the document says, and schema-invalid requests rejected. Left out is
//! `positive_data_acceptance` (every schema-valid request accepted): some refusals depend on
//! things a JSON schema cannot state (the served model's name, its context length and
//! vocabulary, `stream_options` only with `stream`), and those are 4xx by design. Afterwards the
//! server must still answer. schemathesis lives in a virtual environment of its own
//! (`$KVB_SCHEMATHESIS_DIR`, else `~/.cache/kvb/schemathesis`), installed with pip on first use.

use crate::bench::server::ServeProcess;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The chat template given to the tiny fixture (it has none).
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub fn run(seconds: u64, kvb: &Path) -> Result<()> {
    let schemathesis = schemathesis()?;
    let scratch = std::env::temp_dir().join("kvb-fuzz-api");
    let _ = std::fs::remove_dir_all(&scratch);
    let model = tiny_model_with_template(&scratch)?;
    let server = ServeProcess::start(kvb, Some(&model), &[], &scratch.join("serve.log"))?;
    let status = crate::run(
        Command::new(&schemathesis)
            .arg("run")
            .arg(format!("{}/openapi.json", server.base))
            .args([
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
            ])
            .args(["--max-time", &seconds.to_string(), "--workers", "2"])
            .args(["--report", "junit", "--report-dir"])
            .arg(scratch.join("report"))
            // schemathesis keeps its own state in the folder it runs in.
            .current_dir(&scratch),
    );
    let health = reqwest::blocking::get(format!("{}/health", server.base))
        .map(|r| r.status().is_success())
        .unwrap_or(false);
    server.stop()?;
    status.context("schemathesis found responses that break the server's document")?;
    if !health {
        bail!("kvb serve stopped answering /health after schemathesis");
    }
    eprintln!(
        "schemathesis: no failures in {seconds} s; log and report in {}",
        scratch.display()
    );
    Ok(())
}

/// The schemathesis command of its virtual environment (created and filled on first use).
fn schemathesis() -> Result<PathBuf> {
    let dir = std::env::var_os("KVB_SCHEMATHESIS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kvb/schemathesis"))
        })
        .context("set KVB_SCHEMATHESIS_DIR (no HOME to put schemathesis under)")?;
    let bin = dir.join("bin/schemathesis");
    let works = |b: &Path| {
        Command::new(b)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&bin) {
        return Ok(bin);
    }
    if !dir.join("bin/python").is_file() {
        crate::run(Command::new("python3").arg("-m").arg("venv").arg(&dir))?;
    }
    crate::run(
        Command::new(dir.join("bin/python"))
            .args(["-m", "pip", "install", "--quiet", "schemathesis"])
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )?;
    if !works(&bin) {
        bail!("schemathesis is still not runnable at {}", bin.display());
    }
    Ok(bin)
}

/// `fixtures/tiny/llama` copied under `scratch`, with [`CHATML`] as its chat template.
fn tiny_model_with_template(scratch: &Path) -> Result<PathBuf> {
    let src = Path::new("fixtures/tiny/llama");
    let dst = scratch.join("tiny");
    std::fs::create_dir_all(&dst).with_context(|| format!("creating {}", dst.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, dst.join(name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    let path = dst.join("tokenizer_config.json");
    let mut config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    config["chat_template"] = CHATML.into();
    std::fs::write(&path, config.to_string()).context("writing the chat template")?;
    Ok(dst)
}
