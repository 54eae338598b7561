//! `cargo xtask fuzz`: every libFuzzer target of `fuzz/` for a bounded time, one after another,
//! then a table of executions and findings; then the running server as a whole under
//! schemathesis ([`api`]). Needs a nightly toolchain and cargo-fuzz; both are
//! installed through rustup and cargo when missing. The build has its own target folder (nightly
//! and coverage instrumentation share nothing with the release build), and each target's corpus
//! grows between runs in `<target dir>/fuzz-corpus/<target>`, beside the committed seeds.

mod api;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const USAGE: &str = "usage: cargo xtask fuzz [--time SECONDS] [--targets a,b] [--api-time SECONDS]
                        [--no-api | --api-only]
  runs each fuzz target for SECONDS (default 60); a crash leaves its input in
  fuzz/artifacts/<target>/ (copy it to fuzz/regressions/<target>/ once fixed); then
  schemathesis against kvb serve's /openapi.json for --api-time SECONDS (default 120)";

/// One target's run.
struct Outcome {
    target: String,
    runs: Option<u64>,
    seconds: f64,
    corpus: usize,
    crashed: bool,
}

pub fn run(args: &[String]) -> Result<()> {
    let mut seconds = 60u64;
    let mut api_seconds = 120u64;
    let (mut targets_on, mut api_on) = (true, true);
    let mut wanted: Option<Vec<String>> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--api-time" => {
                api_seconds = it
                    .next()
                    .context("--api-time needs a number of seconds")?
                    .parse()
                    .context("--api-time needs a number of seconds")?
            }
            "--no-api" => api_on = false,
            "--api-only" => targets_on = false,
            "--time" => {
                seconds = it
                    .next()
                    .context("--time needs a number of seconds")?
                    .parse()
                    .context("--time needs a number of seconds")?
            }
            "--targets" => {
                let list = it.next().context("--targets needs a list")?;
                wanted = Some(list.split(',').map(String::from).collect());
            }
            _ => bail!("{USAGE}"),
        }
    }
    if targets_on {
        run_targets(wanted, seconds)?;
    }
    if api_on {
        api::run(api_seconds, &super::kvb_binary()?)?;
    }
    Ok(())
}

/// Runs `wanted` (every target when `None`) for `seconds` each.
fn run_targets(wanted: Option<Vec<String>>, seconds: u64) -> Result<()> {
    ensure_tools()?;
    let all = list_targets()?;
    let chosen = match wanted {
        None => all,
        Some(w) => {
            if let Some(bad) = w.iter().find(|t| !all.contains(t)) {
                bail!("unknown fuzz target `{bad}`; the targets are {all:?}");
            }
            w
        }
    };
    let target_dir = fuzz_target_dir();
    // One build for every target: libFuzzer's coverage instrumentation, no sanitizer (the targets
    // are safe Rust; libFuzzer's RSS limit catches unbounded allocations), debug assertions on,
    // so arithmetic overflow is a crash.
    super::run(&mut fuzz_command("build", &target_dir))?;
    let mut outcomes = Vec::new();
    for target in chosen {
        outcomes.push(run_target(target, seconds, &target_dir)?);
    }
    print_table(&outcomes);
    if let Some(bad) = outcomes.iter().find(|o| o.crashed) {
        bail!(
            "the fuzz target {} crashed: its input is in fuzz/artifacts/{}/",
            bad.target,
            bad.target
        );
    }
    Ok(())
}

/// The targets `fuzz/Cargo.toml` declares, as `cargo fuzz list` names them (the crate's own
/// tests check that they and its bodies agree).
fn list_targets() -> Result<Vec<String>> {
    let out = Command::new("cargo")
        .args(["fuzz", "list", "--fuzz-dir", "fuzz"])
        .output()
        .context("running cargo fuzz list")?;
    if !out.status.success() {
        bail!(
            "cargo fuzz list failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// Installs nightly (rustup) and cargo-fuzz (cargo install) if either is missing.
fn ensure_tools() -> Result<()> {
    let has = |cmd: &mut Command| {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has(Command::new("cargo").args(["+nightly", "--version"])) {
        super::run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    if !has(Command::new("cargo").args(["fuzz", "--version"])) {
        super::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
    }
    Ok(())
}

fn fuzz_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("fuzz")
}

/// `cargo +nightly fuzz <verb>` with the build settings every call shares.
fn fuzz_command(verb: &str, target_dir: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.args(["+nightly", "fuzz", verb, "--fuzz-dir", "fuzz"])
        .args(["--features", "libfuzzer", "--sanitizer", "none"])
        .arg("--debug-assertions")
        .env("CARGO_TARGET_DIR", target_dir);
    c
}

fn run_target(target: String, seconds: u64, target_dir: &Path) -> Result<Outcome> {
    let corpus = target_dir.join("fuzz-corpus").join(&target);
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let seeds = Path::new("fuzz/seeds").join(&target);
    let mut cmd = fuzz_command("run", target_dir);
    cmd.arg(&target)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .args(["-rss_limit_mb=2048", "-timeout=20", "-print_final_stats=1"]);
    eprintln!("$ {cmd:?}");
    let start = Instant::now();
    let out = cmd
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting the fuzz target {target}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    // The tail of libFuzzer's log says how it ended; the whole log is too long to echo.
    let tail: Vec<&str> = log.lines().rev().take(25).collect();
    for line in tail.iter().rev() {
        eprintln!("  {line}");
    }
    // libFuzzer's last line: `Done N runs in S second(s)`.
    let done = log.lines().rev().find_map(|l| {
        let rest = l.trim().strip_prefix("Done ")?;
        let mut words = rest.split_whitespace();
        let runs: u64 = words.next()?.parse().ok()?;
        let seconds: f64 = words.nth(2)?.parse().ok()?;
        Some((runs, seconds))
    });
    Ok(Outcome {
        target,
        runs: done.map(|d| d.0),
        seconds: done.map_or(start.elapsed().as_secs_f64(), |d| d.1.max(1.0)),
        corpus: std::fs::read_dir(&corpus).map_or(0, |d| d.count()),
        crashed: !out.status.success(),
    })
}

fn print_table(outcomes: &[Outcome]) {
    println!("\n| target | executions | exec/s | corpus | result |\n|---|---:|---:|---:|---|");
    for o in outcomes {
        let runs = o.runs.map_or("?".into(), |r| r.to_string());
        let rate = o
            .runs
            .map_or("?".into(), |r| format!("{:.0}", r as f64 / o.seconds));
        let result = if o.crashed { "CRASH" } else { "clean" };
        println!(
            "| {} | {runs} | {rate} | {} | {result} |",
            o.target, o.corpus
        );
    }
}
