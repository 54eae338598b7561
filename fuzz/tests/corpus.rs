//! Runs every fuzz target on stable: over its committed seeds, over every input that once made
//! it fail (`regressions/<target>/`), and over random mutations of the seeds (the short fuzzing
//! CI can afford; `cargo xtask fuzz` runs libFuzzer for longer).

use kvb_fuzz::TARGETS;
use kvb_model::gguf::GgufModel;
use kvb_model::weights::TensorSource;
use kvb_model::{Model, Tokenizer, WeightPrecision};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

/// As under libFuzzer, any panic is a failure, even one the code under test catches (a caught
/// panic still means a parser broke): it is printed, then the process aborts.
fn fail_on_any_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            std::process::abort();
        }));
    });
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The files of `folder/<target>/`, sorted (none if the folder is absent).
fn inputs(folder: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = root().join(folder).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

#[test]
fn every_target_has_seeds_and_runs_clean_on_them_and_on_its_regressions() {
    fail_on_any_panic();
    for (target, body) in TARGETS {
        let seeds = inputs("seeds", target);
        assert!(!seeds.is_empty(), "no seed for the target {target}");
        for (path, bytes) in seeds.iter().chain(&inputs("regressions", target)) {
            eprintln!("{target}: {}", path.display());
            body(bytes);
        }
    }
}

#[test]
fn every_target_has_a_libfuzzer_binary_and_every_binary_a_target() {
    // `cargo xtask fuzz` runs the binaries `cargo fuzz list` names: they and TARGETS must agree.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut bins: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("name = ")))
        .map(|n| n.trim_matches('"'))
        .collect();
    let mut names: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
    bins.sort();
    names.sort();
    assert_eq!(bins, names);
    for name in names {
        assert!(
            root().join(format!("fuzz_targets/{name}.rs")).is_file(),
            "{name}"
        );
    }
}

#[test]
fn the_gguf_seeds_load_as_whole_models() {
    // A seed that failed early would leave the deeper code (tokenizer, weights, the model) unfuzzed.
    for (path, bytes) in inputs("seeds", "gguf") {
        let file = GgufModel::from_bytes(&path, &bytes).unwrap();
        let config = file.config(true).unwrap();
        let tokenizer = Tokenizer::from_json(&file.tokenizer_json().unwrap().to_string()).unwrap();
        assert!(tokenizer.vocab_size() <= config.vocab_size);
        assert!(!file.names().is_empty());
        Model::<kvb_model::backends::Cpu>::load_with(
            &config,
            &file,
            WeightPrecision::Auto,
            &Default::default(),
            &mut |_, _| {},
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

#[test]
fn the_request_seeds_are_accepted() {
    for (path, bytes) in inputs("seeds", "server_body") {
        let (route, body) = bytes.split_first().unwrap();
        kvb_server::serve::read_body(kvb_fuzz::body_route(*route), body)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let mixed = std::fs::read_to_string(root().join("seeds/replay_lines/mixed.jsonl")).unwrap();
    let requests =
        kvb_server::commands::replay::requests::parse_requests(&mixed, "mixed.jsonl").unwrap();
    assert_eq!(requests.len(), 4);
}

#[test]
fn the_store_seeds_are_what_the_store_writes_today() {
    // The store's seeds are made by its own writers; a format change must refresh them
    // (`cargo test -p kvb-fuzz -- --ignored write_store_seeds`).
    for (target, name, bytes) in kvb_store::fuzzing::seeds() {
        let path = root().join("seeds").join(target).join(name);
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(committed == bytes, "{} is stale", path.display());
    }
}

#[test]
#[ignore = "writes the store's seed files; run after a format change"]
fn write_store_seeds() {
    for (target, name, bytes) in kvb_store::fuzzing::seeds() {
        let dir = root().join("seeds").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// A seed changed by a few random edits: bytes flipped, inserted, removed, or the end cut.
fn mutated(seed: &[u8], edits: &[(u8, usize, u8)]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for &(kind, at, value) in edits {
        let at = if out.is_empty() { 0 } else { at % out.len() };
        match kind % 4 {
            0 if !out.is_empty() => out[at] ^= value | 1,
            1 => out.insert(at, value),
            2 if !out.is_empty() => {
                out.drain(at..(at + usize::from(value) % 16 + 1).min(out.len()));
            }
            3 => out.truncate(at),
            _ => {}
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn mutated_seeds_never_crash_a_target(
        seed in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..12),
    ) {
        fail_on_any_panic();
        for (target, body) in TARGETS {
            let seeds = inputs("seeds", target);
            let (_, bytes) = &seeds[seed.index(seeds.len())];
            body(&mutated(bytes, &edits));
        }
    }
}
