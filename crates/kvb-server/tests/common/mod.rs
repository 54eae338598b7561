//! A `kvb serve` process for tests: started on a free loopback port, read back from its log line,
//! stopped by signal or killed on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A ChatML template for the tiny model (its fixture has none).
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The `kvb` binary, looking for the default model where the workspace's other tests do
/// (`$KVB_MODELS_DIR`, else `models/` at the workspace root) rather than under this crate,
/// where a fetched model would land beside the sources.
pub fn kvb() -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvb"));
    cmd.env("KVB_MODELS_DIR", kvb_model::fetch::models_dir_in(&root));
    cmd
}

/// The tiny Llama fixture copied into a temporary folder, with a chat template added.
pub fn tiny_model() -> (tempfile::TempDir, PathBuf) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("tiny");
    std::fs::create_dir(&dst).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dst.join(f.file_name().unwrap())).unwrap();
    }
    let cfg_path = dst.join("tokenizer_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = CHATML.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    (dir, dst)
}

/// `kvb serve` on the tiny model (served as `tiny`), with `extra` arguments.
pub fn tiny_server(extra: &[&str]) -> (tempfile::TempDir, Server) {
    let (dir, model) = tiny_model();
    let mut args = vec![
        "--model",
        model.to_str().unwrap(),
        "--served-model-name",
        "tiny",
    ];
    args.extend_from_slice(extra);
    let s = Server::start(&args);
    (dir, s)
}

/// `n` made-up words from a seed (`w0`..`w96`), a deterministic text for the tiny model.
pub fn words(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("w{}", (seed * 31 + i * 7) % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A running server.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// `kvb serve --port 0 ARGS`, once it listens.
    pub fn start(args: &[&str]) -> Server {
        let mut child = kvb()
            .arg("serve")
            .args(["--port", "0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting kvb serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let base = match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(b) => b,
            Err(_) => {
                let _ = child.kill();
                panic!("kvb serve did not start:\n{}", log.lock().unwrap());
            }
        };
        Server { child, base, log }
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET /v1/stats`.
    pub fn stats(&self) -> serde_json::Value {
        client()
            .get(self.url("/v1/stats"))
            .send()
            .unwrap()
            .json()
            .unwrap()
    }

    /// `GET /metrics`: the Prometheus text.
    pub fn metrics(&self) -> String {
        client()
            .get(self.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    /// Waits until no sequence runs or waits, and returns the stats then.
    pub fn idle(&self) -> serde_json::Value {
        for _ in 0..500 {
            let st = self.stats();
            if st["pool"]["running"] == 0 && st["pool"]["waiting"] == 0 {
                return st;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the server never went idle: {}", self.stats());
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends SIGTERM and waits (up to `within`) for the exit.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let end = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < end,
                "kvb serve did not exit after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking HTTP client with a generous timeout.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

/// `body` posted to `path` with `"stream": true`: the response, its events not yet read.
pub fn post_streaming(
    s: &Server,
    path: &str,
    body: &serde_json::Value,
) -> reqwest::blocking::Response {
    let mut body = body.clone();
    body["stream"] = serde_json::json!(true);
    client().post(s.url(path)).json(&body).send().unwrap()
}

/// The `data:` payloads of a server-sent event body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim_start().to_string())
        .collect()
}
