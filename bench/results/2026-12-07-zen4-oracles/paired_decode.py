#!/usr/bin/env python3
"""kvb --activations q8 and llama.cpp decoding the same file in turn, pair after pair, so that
each pair meets the host's read rate of the same minute: the median of the pairs' ratios holds
where one median of each engine, taken minutes apart, does not.

    python3 paired_decode.py KVB GGUF PAIRS [NEW_TOKENS]

Run with a Python that has llama-cpp-python (the shapes venv). Each engine is a fresh process
with 2 threads: a 15-token prompt, then NEW_TOKENS greedy tokens; its decode is the time of the
tokens after the first over their count (kvb: its `decode_ms`).
"""

import json
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "The history of the city begins with a small settlement by the river, where"

LLAMA = r'''
import sys, time, numpy as np, llama_cpp
gguf, n = sys.argv[1], int(sys.argv[2])
llm = llama_cpp.Llama(model_path=gguf, n_ctx=4096, n_batch=512, n_threads=2, n_threads_batch=2,
                      logits_all=False, verbose=False)
def next_token():
    logits = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),))))
llm.eval(llm.tokenize(sys.argv[3].encode(), add_bos=False, special=True))
token = next_token()
start = time.perf_counter()
for _ in range(n - 1):
    llm.eval([token])
    token = next_token()
print((time.perf_counter() - start) * 1e3 / (n - 1))
'''


def kvb_ms(kvb, gguf, n):
    with tempfile.TemporaryDirectory() as d:
        req, out = f"{d}/r.jsonl", f"{d}/o.jsonl"
        open(req, "w").write(json.dumps({"id": "d", "prompt": PROMPT, "max_new_tokens": n,
                                         "reset": True}) + "\n")
        subprocess.run([kvb, "replay", "--model", gguf, "--activations", "q8", "--requests", req,
                        "--out", out], check=True, capture_output=True,
                       env={"RAYON_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"})
        r = json.loads(open(out).readline())
        return r["stages"]["decode_ms"] / (n - 1)


def llama_ms(gguf, n):
    out = subprocess.run([sys.executable, "-c", LLAMA, gguf, str(n), PROMPT], check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip())


def main():
    kvb, gguf, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    ratios = []
    print("| pair | kvb q8, ms/token | llama.cpp, ms/token | llama.cpp / kvb q8 |")
    print("|---:|---:|---:|---:|")
    for p in range(pairs):
        # Alternate which engine goes first, so that neither always meets the later seconds.
        if p % 2 == 0:
            k, l = kvb_ms(kvb, gguf, n), llama_ms(gguf, n)
        else:
            l, k = llama_ms(gguf, n), kvb_ms(kvb, gguf, n)
        ratios.append(l / k)
        print(f"| {p + 1} | {k:.1f} | {l:.1f} | {l / k:.2f} |", flush=True)
    print(f"\nmedian of {pairs} pairs: llama.cpp / kvb q8 = {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f}), {time.strftime('%Y-%m-%d %H:%M')}")


if __name__ == "__main__":
    main()
