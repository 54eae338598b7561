"""kvb beside llama.cpp on one GGUF file (a real-shaped model from xtask/shapes/make_shape.py):
weights in memory, peak RSS, prefill of a prompt, and decode ms/token after it, same threads,
same prompt text, medians of REPS runs taken in one interleaved session.

    python bench/analysis/shape_decode.py MODEL.gguf --kvb target/release/kvb [--threads 2]
        [--prompt-file bench/corpus/long_document.md] [--prompt-chars 3500] [--tokens 32]
        [--reps 3] [--kvb-args "--activations q8"]

Run with a Python that has llama-cpp-python (xtask/shapes' environment or bench peers').
Prints one JSON line per run and a summary table (markdown).
"""

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def llama_cpp_run(path, text, threads, tokens):
    """llama.cpp in this process' child: load, prefill, greedy decode; times and peak RSS."""
    code = f"""
import json, resource, time, llama_cpp as L
t0 = time.perf_counter()
m = L.Llama(model_path={path!r}, n_threads={threads}, n_threads_batch={threads}, n_ctx=4096,
            n_batch=512, verbose=False, use_mmap=True)
load = time.perf_counter() - t0
ids = m.tokenize({text!r}.encode(), add_bos=True)
t0 = time.perf_counter(); m.eval(ids); prefill = time.perf_counter() - t0
steps = []
for _ in range({tokens}):
    tok = ids[-1]  # the token does not change a step's time on random weights
    t0 = time.perf_counter(); m.eval([tok]); steps.append(time.perf_counter() - t0)
steps.sort()
print(json.dumps(dict(engine='llama.cpp', load_s=load, prompt_tokens=len(ids), prefill_s=prefill,
    decode_ms=1000 * steps[len(steps) // 2],
    peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def kvb_run(kvb, path, text, threads, tokens, extra):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    cmd = ["/usr/bin/time", "-f", "PEAK_RSS_KB %M", kvb, "generate", "--model", path,
           "--prompt-file", f.name, "--max-new-tokens", str(tokens), "--mode", "baseline"] + extra
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    err = out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"kvb failed: {err[-2000:]}")
    stats = re.search(r"prompt tokens: (\d+).*TTFT: ([\d.]+) ms.*generated: (\d+) tokens \| decode: ([\d.]+) tokens/s", err)
    weights = re.search(r"weights: (\d+) MB", err)
    rss = re.search(r"PEAK_RSS_KB (\d+)", err)
    return dict(engine="kvb " + " ".join(extra), prompt_tokens=int(stats.group(1)),
                prefill_s=float(stats.group(2)) / 1000, decode_ms=1000 / float(stats.group(4)),
                generated=int(stats.group(3)), weights_mb=int(weights.group(1)),
                peak_rss_mb=int(rss.group(1)) / 1024, wall_s=wall)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--kvb", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-file", default="bench/corpus/long_document.md")
    p.add_argument("--prompt-chars", type=int, default=3500)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--kvb-args", action="append", default=[])
    p.add_argument("--skip-llama-cpp", action="store_true")
    a = p.parse_args()
    text = open(a.prompt_file).read()[: a.prompt_chars]
    variants = [v.split() for v in (a.kvb_args or [""])]
    runs = {}
    for rep in range(a.reps):
        for extra in variants:
            r = kvb_run(a.kvb, a.model, text, a.threads, a.tokens, extra)
            print(json.dumps(r), flush=True)
            runs.setdefault(r["engine"], []).append(r)
        if not a.skip_llama_cpp:
            r = llama_cpp_run(a.model, text, a.threads, a.tokens)
            print(json.dumps(r), flush=True)
            runs.setdefault(r["engine"], []).append(r)
    print("\n| engine | prompt tokens | prefill s | decode ms/token | weights MB | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for engine, rs in runs.items():
        med = lambda k: statistics.median(r[k] for r in rs) if k in rs[0] else float("nan")
        print(f"| {engine} | {rs[0]['prompt_tokens']} | {med('prefill_s'):.2f} | "
              f"{med('decode_ms'):.1f} | {med('weights_mb'):.0f} | {med('peak_rss_mb'):.0f} |")


if __name__ == "__main__":
    main()
