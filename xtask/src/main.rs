//! `cargo xtask`: project automation. It only orchestrates cargo and the `kvb` binary, and shares
//! one release build (one feature set) across every step, so CI compiles burn once.

mod bench;
mod doc_links;
mod fuzz;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Features of the one build every step shares: all backends compiled, so CI proves that `wgpu`
/// and `cuda` build (CUDA needs no toolkit to compile with burn 0.21) and runs the wgpu tests.
const FEATURES: &str = "kvb-model/wgpu,kvb-model/cuda,kvb-server/wgpu,kvb-server/cuda";
/// The same feature set, spelled for commands that select only kvb-model.
const MODEL_FEATURES: &str = "kvb-model/wgpu,kvb-model/cuda";

const USAGE: &str = "usage: cargo xtask <command>

commands:
  demo          a scripted chat and a moved document on the default model: TTFT cold vs warm
  fetch-model   fetch the default model (SmolLM2-135M-Instruct) into models/
  ci            format check, build, fetch the model, all tests, an end-to-end generate
  bench         the end-to-end benchmark: 7 workloads x Baseline, PrefixCache, ChunkReuse
                (selective, cacheblend, int8); tables, JSON and SVG plots in bench/results/<date>/,
                and the results section of docs/benchmarks.md. Options: --quick (a smoke run, < 5 min),
                --reps N (default 3), --model PATH (a tiny model gets cut-down workloads), --out DIR
  bench concurrency  only the concurrency workload: 1, 4 and 16 clients (8-turn chats behind one
                ~1,000-token system prompt) at once; output tokens/s, TTFT, pool memory.
                Options: --reps N, --model PATH, --out DIR, --activations q8
  bench server  `kvb serve` on loopback under 1, 16 and 64 concurrent chat clients (4 turns behind
                one system prompt, streamed over HTTP): TTFT p50/p99, tokens/s, errors; tables and
                plots in bench/results/<date>-server/. Options: --quick, --clients 1,16,64,
                --turns N, --max-tokens N, --time-limit S, --model PATH, --out DIR,
                --activations q8, --serve-args FLAGS (more kvb serve flags in one quoted
                argument, e.g. --prefill-tokens-while-decoding 128), --json-schema (each
                client count again with every answer constrained to a JSON schema: the cost
                of structured output), --temperature T (sampled answers, seed per client;
                0, greedy, by default)
  bench soak    `kvb serve` under steady mixed load (chat turns, completions, warms, dropped
                streams, malformed bodies) for a bounded time: no request may fail, resident
                memory may grow < 5% after warm-up, the pool must return to its resident cache.
                Options: --duration S (600), --clients N (8), --max-tokens N, --model PATH, --out DIR
  bench fidelity  moved documents (7 documents x start/middle/end, warmed alone or inside another
                prompt) through `kvb verify` per repair setting (none, selective, CacheBlend 5-50%,
                adaptive thresholds) beside the noise floor (KIVI int8/int4 K/V, bf16 forward, q8 activations):
                teacher-forced top-1, KL, identical answers, share recomputed; in
                bench/results/<date>-fidelity/ (table, plots). Options: --max-new-tokens N (32),
                --only a,b, --no-run (report from the JSON lines already there), --model PATH, --out DIR
  bench shared  two `kvb serve` replicas sharing one Redis (started here) and a Baseline server:
                documents spread over the replicas; TTFT of a replica's first request for a
                document the other one read, vs Baseline and a local hit, and the share served from
                the shared tier; in bench/results/<date>-shared/. Options: --quick, --reps N (3),
                --max-tokens N (8), --model PATH, --out DIR
  bench model   prefill/decode speed of the default model vs the machine's matmul rate
  bench peers   kvb beside PyTorch (f32, bf16) and llama.cpp (with and without its prompt cache)
                on the same weights and threads: full prefill of ~512 and ~3,000 tokens, decode,
                warm questions; ratios from one run, in bench/results/<date>-peers/. Optional,
                never in CI: pip-installs its peers into $KVB_PEERS_DIR (~/.cache/kvb/peers).
                Options: --reps N (3), --threads N (all cores), --peers a,b, --out DIR,
                --activations q8 (kvb with 8-bit activations).
                With --model-shape NAME [--quant Q4_K_M]: a real-shaped model with random weights
                (smollm2-1.7b, llama3.2-1b, qwen2.5-1.5b, llama3-8b, smollm2-135m; made once by
                xtask/shapes/make_shape.py into $KVB_SHAPES_DIR, ~/.cache/kvb/shapes), kvb (f32
                and q8 activations) beside llama.cpp and its prompt cache: load, weights, peak
                RSS, prefill of ~512 and ~2,048 tokens, decode after each, a warm question, and
                the machine's streaming bandwidth with decode's share of it
  bench attn    the CubeCL attention kernel vs the reference ops on one device (causal prefill,
                suffix after cached K/V, CacheBlend's scattered rows, decode): time, GFLOP/s,
                speed-up; then the default model's prefill and decode with either attention
                (kvb replay). In bench/results/<date>-attn-<backend>/. Options: --backend
                wgpu|cuda (wgpu), --quick (small shapes and prompts, for lavapipe)
  bench cache   key hashing, KIVI quantize/dequantize, store lookups (100k chunks), disk tier
  fuzz          every fuzz target of fuzz/ under libFuzzer for a bounded time (nightly and
                cargo-fuzz, installed if missing); executions and crashes per target.
                Options: --time SECONDS (60 each), --targets a,b";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
    {
        println!("{USAGE}");
        return Ok(());
    }
    let root = workspace_root()?;
    std::env::set_current_dir(&root).with_context(|| format!("cd {}", root.display()))?;
    match args.first().map(String::as_str) {
        Some("fetch-model") => fetch_model(),
        Some("demo") => run(&mut kvb(&["demo"])),
        Some("ci") => ci(),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            bail!("unknown or missing command");
        }
    }
}

/// The workspace this xtask was run from. `cargo run` names xtask's folder in
/// `CARGO_MANIFEST_DIR` at run time; the compile-time path is only the fallback, because a build
/// is reused after its clone moves (mtimes survive a move, so cargo sees nothing to rebuild) and
/// the old path no longer exists.
fn workspace_root() -> Result<PathBuf> {
    let xtask_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    xtask_dir.parent().map(Path::to_path_buf).with_context(|| {
        format!(
            "CARGO_MANIFEST_DIR={} is not xtask's folder inside the workspace (run `cargo xtask`)",
            xtask_dir.display()
        )
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// The crates below the burn line (issue 41): usable by a runtime that has its own tensors.
const BURN_FREE: [(&str, &[&str]); 9] = [
    ("kvb-hash", &[]),
    ("kvb-chunk", &[]),
    ("kvb-quant", &[]),
    ("kvb-blocks", &[]),
    ("kvb-modelfile", &[]),
    ("kvb-gemm", &[]),
    ("kvb-constrain", &[]),
    ("kvb-store", &[]),
    ("kvb-store", &["--no-default-features"]),
];

/// The library crates on burn, published after the burn-free ones.
const ON_BURN: [&str; 5] = [
    "kvb-attn",
    "kvb-model",
    "kvb-repair",
    "kvb-engine",
    "kvb-server",
];

/// Packages that use the burn-free crates as another runtime would, and must not pull burn
/// either (built and tested with the workspace, never published).
const BURN_FREE_USERS: [&str; 1] = ["candle-chunk-reuse"];

/// Fails if a crate of [`BURN_FREE`] or [`BURN_FREE_USERS`] depends on burn or CubeCL (through
/// any path, with its default features or the listed ones), and checks each crate of
/// [`BURN_FREE`] with those feature sets alone.
fn burn_free() -> Result<()> {
    for (krate, flags) in BURN_FREE {
        no_burn_in_tree(krate, flags)?;
        run(cargo()
            .args(["check", "--release", "-p", krate])
            .args(flags))?;
    }
    for krate in BURN_FREE_USERS {
        no_burn_in_tree(krate, &[])?;
    }
    Ok(())
}

/// `cargo tree -e normal` of `krate` with `flags` holds no burn or CubeCL crate.
fn no_burn_in_tree(krate: &str, flags: &[&str]) -> Result<()> {
    let out = cargo()
        .args([
            "tree", "-p", krate, "-e", "normal", "--prefix", "none", "-f", "{p}",
        ])
        .args(flags)
        .output()
        .with_context(|| format!("cargo tree -p {krate}"))?;
    if !out.status.success() {
        bail!(
            "cargo tree -p {krate} {flags:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tree = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<&str> = tree.lines().filter_map(|l| l.split(' ').next()).collect();
    names.sort_unstable();
    names.dedup();
    let heavy: Vec<&&str> = names
        .iter()
        .filter(|n| n.starts_with("burn") || n.starts_with("cubecl"))
        .collect();
    if !heavy.is_empty() {
        bail!("{krate} {flags:?} must not depend on burn or CubeCL, but pulls {heavy:?}");
    }
    eprintln!(
        "{krate} {flags:?}: {} crates, none of them burn",
        names.len()
    );
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// `cargo <verb> --release -p kvb-server` with the shared feature set.
fn kvb_cargo(verb: &str) -> Command {
    let mut c = cargo();
    c.args([
        verb,
        "--release",
        "--quiet",
        "-p",
        "kvb-server",
        "--features",
        FEATURES,
    ]);
    c
}

/// `cargo run --release -p kvb-server -- <args>` with the shared feature set.
fn kvb(args: &[&str]) -> Command {
    let mut c = kvb_cargo("run");
    c.arg("--").args(args);
    c
}

/// Builds the `kvb` binary (the shared feature set) and returns its path: the benchmark runs it
/// directly, so nothing is rebuilt between its runs. `KVB_BINARY` names another one instead (an
/// older build, to measure two commits in one session).
fn kvb_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("KVB_BINARY").map(PathBuf::from) {
        if !bin.is_file() {
            bail!("KVB_BINARY names {}, which is not a file", bin.display());
        }
        return Ok(bin);
    }
    run(&mut kvb_cargo("build"))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let bin = target
        .join("release")
        .join(format!("kvb{}", std::env::consts::EXE_SUFFIX));
    if !bin.is_file() {
        bail!("the kvb binary was built but is not at {}", bin.display());
    }
    Ok(bin)
}

fn fetch_model() -> Result<()> {
    run(&mut kvb(&["fetch-model"]))
}

fn ci() -> Result<()> {
    let rustfmt_present = Command::new("rustfmt")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if rustfmt_present {
        run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    } else {
        eprintln!("rustfmt is not installed: skipping the format check");
    }
    let broken = doc_links::broken(Path::new("."));
    if !broken.is_empty() {
        bail!("broken links in the docs:\n{}", broken.join("\n"));
    }
    run(cargo().args([
        "build",
        "--release",
        "--workspace",
        "--all-targets",
        "--features",
        FEATURES,
    ]))?;
    burn_free()?;
    // The burn-free crates as crates.io would take them: packaged and built from the packages.
    let mut package = cargo();
    package.args(["package", "--allow-dirty"]);
    for (krate, _) in BURN_FREE.iter().filter(|(_, flags)| flags.is_empty()) {
        package.args(["-p", krate]);
    }
    run(&mut package)?;
    // The crates on burn, packaged together (path dependencies resolved to the packages above):
    // manifests, versions and files as crates.io takes them. Not rebuilt from the packages: that
    // is a second, debug build of burn and its GPU stacks, and the workspace build above compiles
    // the same sources (none reads a file outside its crate).
    let mut package = cargo();
    package.args(["package", "--allow-dirty", "--no-verify"]);
    for (krate, _) in BURN_FREE.iter().filter(|(_, flags)| flags.is_empty()) {
        package.args(["-p", krate]);
    }
    for krate in ON_BURN {
        package.args(["-p", krate]);
    }
    run(&mut package)?;
    fetch_model()?;
    run(cargo().args(["test", "--release", "--workspace", "--features", FEATURES]))?;

    // End to end, as a user: the chat answer to a known question.
    let out = kvb(&[
        "generate",
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-new-tokens",
        "24",
    ])
    .output()
    .context("running kvb generate")?;
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("kvb generate said: {}", text.trim());
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() || !text.contains("Paris") {
        bail!("kvb generate did not answer the capital of France with Paris");
    }
    // The burn-free crates given to candle: its demo tables (the tests assert; this shows).
    run(cargo().args(["run", "--release", "--quiet", "-p", "candle-chunk-reuse"]))?;
    // The benchmark harness, on a tiny model, so it cannot rot: it must run every workload and
    // variant and write well-formed results (times are not checked).
    smoke_bench(
        "kvb-bench-smoke",
        &["--quick", "--model", "fixtures/tiny/llama"],
        bench::run,
        bench::check_output,
    )?;
    // The server benchmark, briefly, on the default model: real HTTP clients, no errors.
    smoke_bench(
        "kvb-bench-server-smoke",
        &["--quick"],
        bench::server::run,
        bench::server::check_output,
    )?;
    // The shared tier's benchmark, briefly: two replicas and a Redis, something read from it.
    smoke_bench(
        "kvb-bench-shared-smoke",
        &["--quick"],
        bench::shared::run,
        bench::shared::check_output,
    )?;
    eprintln!("ci: all steps passed");
    Ok(())
}

/// Runs a benchmark with `flags` and `--out` a fresh temporary folder named `name`, then checks
/// what it wrote.
fn smoke_bench(
    name: &str,
    flags: &[&str],
    run: fn(&[String], &Path) -> Result<()>,
    check: fn(&Path) -> Result<()>,
) -> Result<()> {
    let out = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&out);
    let args: Vec<String> = flags
        .iter()
        .map(|s| s.to_string())
        .chain(["--out".to_string(), out.to_string_lossy().into_owned()])
        .collect();
    run(&args, &kvb_binary()?)?;
    check(&out)
}

/// `cargo xtask bench attn`: kvb-attn's `gpu_attention` bench on the chosen backend, then the
/// default model's prefill and decode with the kernel and with the reference ops.
fn bench_attn(args: &[String]) -> Result<()> {
    let mut backend = "wgpu".to_string();
    let mut dtype = "f32".to_string();
    let mut quick = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => backend = it.next().context("--backend needs wgpu or cuda")?.clone(),
            "--dtype" => dtype = it.next().context("--dtype needs f32, f16 or bf16")?.clone(),
            "--quick" => quick = true,
            other => bail!(
                "unknown option `{other}` (--backend wgpu|cuda, --dtype f32|f16|bf16, --quick)"
            ),
        }
    }
    if backend != "wgpu" && backend != "cuda" {
        bail!("--backend takes wgpu or cuda, not `{backend}`");
    }
    if !["f32", "f16", "bf16"].contains(&dtype.as_str()) || (backend == "wgpu" && dtype == "bf16") {
        bail!("--dtype takes f32 or f16 on wgpu (WGSL has no bf16), f32, f16 or bf16 on cuda, not `{dtype}`");
    }
    let out = workspace_root()?.join("bench/results").join(format!(
        "{}-attn-{backend}{}{}",
        bench::today(),
        if dtype == "f32" {
            String::new()
        } else {
            format!("-{dtype}")
        },
        if quick { "-quick" } else { "" }
    ));
    let mut cmd = cargo();
    cmd.args(["bench", "-p", "kvb-attn", "--features"])
        .arg(&backend)
        .args(["--bench", "gpu_attention"])
        .env("KVB_ATTN_BACKEND", &backend)
        .env("KVB_ATTN_DTYPE", &dtype)
        .env("KVB_BENCH_OUT", &out);
    if quick {
        cmd.env("KVB_BENCH_QUICK", "1");
    }
    run(&mut cmd)?;
    // The default model's prefill and decode with the kernel and with the reference ops.
    let size = if quick {
        &bench::attn_model::Size::QUICK
    } else {
        &bench::attn_model::Size::FULL
    };
    let model = bench::attn_model::run(&kvb_binary()?, &backend, &dtype, size, &out.join("raw"))?;
    let results = out.join("results.md");
    let mut text = std::fs::read_to_string(&results)
        .with_context(|| format!("reading {}", results.display()))?;
    text.push_str(&model);
    std::fs::write(&results, &text).with_context(|| format!("writing {}", results.display()))?;
    eprint!("{model}");
    Ok(())
}

fn bench(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("model") => run(cargo()
            .args([
                "bench",
                "-p",
                "kvb-model",
                "--features",
                MODEL_FEATURES,
                "--bench",
                "model_speed",
                "--",
            ])
            .args(&args[1..])),
        // Criterion benches of the cache crates, with short measurement windows: medians of
        // ~2 s of samples each are stable enough to compare, and the whole run stays near 2 min.
        Some("concurrency") => bench::run_concurrency_only(&args[1..], &kvb_binary()?),
        Some("server") => bench::server::run(&args[1..], &kvb_binary()?),
        Some("soak") => bench::soak::run(&args[1..], &kvb_binary()?),
        Some("shared") => bench::shared::run(&args[1..], &kvb_binary()?),
        Some("fidelity") => bench::fidelity::run(&args[1..], &kvb_binary()?),
        Some("peers") => bench::peers::run(&args[1..], &kvb_binary()?),
        Some("attn") => bench_attn(&args[1..]),
        Some("cache") => run(cargo().args([
            "bench",
            "-p",
            "kvb-hash",
            "-p",
            "kvb-quant",
            "-p",
            "kvb-store",
            "--",
            "--warm-up-time",
            "1",
            "--measurement-time",
            "2",
        ])),
        _ => bench::run(args, &kvb_binary()?),
    }
}
