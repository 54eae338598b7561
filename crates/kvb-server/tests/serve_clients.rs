//! `kvb serve` driven by the clients its users have: the real `openai` Python package and
//! LangChain (installed with pip into a virtual environment under the build folder when the
//! machine's Python lacks them), and the README's own curl and Python examples, run as written
//! against the default model.

use crate::common::{tiny_model, Server};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// What the client scripts import, and the PyPI packages that give them.
const IMPORTS: &str = "import openai, pydantic, jsonschema, langchain_openai";
const PACKAGES: [&str; 3] = ["openai", "jsonschema", "langchain-openai"];

/// A Python interpreter with the clients' packages (the `openai` SDK, `jsonschema`, LangChain's
/// `langchain-openai`): the machine's, or a virtual environment made once for these tests with
/// pip from PyPI.
fn python_with_openai() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let imports = |python: &Path| {
            Command::new(python)
                .args(["-c", IMPORTS])
                .status()
                .is_ok_and(|s| s.success())
        };
        let system = PathBuf::from("python3");
        if imports(&system) {
            return system;
        }
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
        let python = venv.join("bin/python");
        if !imports(&python) {
            let made = Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv)
                .status()
                .expect("running python3 -m venv");
            assert!(made.success(), "python3 -m venv {} failed", venv.display());
            let installed = Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(PACKAGES)
                .status()
                .expect("running pip");
            assert!(installed.success(), "pip install {PACKAGES:?} failed");
        }
        assert!(imports(&python), "`{IMPORTS}` fails after pip install");
        python
    })
}

/// Runs a command and returns its stdout, failing with everything it said if it fails.
fn output_of(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running a client");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_openai_python_package_chats_completes_streams_and_sees_cached_tokens() {
    let said = run_client("openai_client.py", false);
    assert!(said.contains("openai client: ok"), "{said}");
}

/// Runs a client script against `kvb serve` on the tiny model, or with `default` on the default
/// model (whose context holds tool descriptions); returns what it printed.
fn run_client(script: &str, default: bool) -> String {
    let (_dir, model) = tiny_model();
    let s = if default {
        Server::start(&["--served-model-name", "tiny"])
    } else {
        Server::start(&[
            "--model",
            model.to_str().unwrap(),
            "--served-model-name",
            "tiny",
        ])
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    output_of(
        Command::new(python_with_openai())
            .arg(&script)
            .args([&s.base, "tiny"]),
    )
}

#[test]
fn structured_outputs_validate_against_100_random_schemas_through_the_openai_package() {
    let said = run_client("structured_client.py", false);
    assert!(said.contains("structured client: ok"), "{said}");
}

#[test]
fn langchain_with_structured_output_gets_instances_of_its_model() {
    let said = run_client("langchain_client.py", true);
    assert!(said.contains("langchain client: ok"), "{said}");
}

#[test]
fn forced_tool_calls_fit_their_schema_through_the_openai_package() {
    let said = run_client("tools_client.py", true);
    assert!(said.contains("tools client: ok"), "{said}");
}

/// The fenced block of `lang` that follows the README's first line containing `marker`.
fn readme_block(marker: &str, lang: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("reading README.md");
    let after = &readme[readme
        .find(marker)
        .unwrap_or_else(|| panic!("README lacks {marker}"))..];
    let fence = format!("```{lang}\n");
    let start = after
        .find(&fence)
        .expect("no fenced block after the marker")
        + fence.len();
    let len = after[start..].find("```").expect("an unclosed fence");
    after[start..start + len].to_string()
}

#[test]
fn the_readme_curl_and_python_examples_work_as_written() {
    // As in the README: the default model, under its default served name.
    let s = Server::start(&[]);
    let readme_base = "http://127.0.0.1:8000";

    let curl = readme_block("<!-- example: curl -->", "sh");
    assert!(
        curl.contains(readme_base) && curl.contains("curl "),
        "{curl}"
    );
    let said = output_of(Command::new("sh").args(["-c", &curl.replace(readme_base, &s.base)]));
    let v: serde_json::Value =
        serde_json::from_str(&said).unwrap_or_else(|_| panic!("not JSON: {said}"));
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        answer.contains("Paris"),
        "the curl example's answer: {said}"
    );

    let python = readme_block("<!-- example: python -->", "python");
    assert!(python.contains(readme_base), "{python}");
    let said = output_of(
        Command::new(python_with_openai()).args(["-c", &python.replace(readme_base, &s.base)]),
    );
    assert!(said.contains("Paris"), "the Python example printed: {said}");
}
