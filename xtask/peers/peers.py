"""The peers of `cargo xtask bench peers`: PyTorch/transformers (f32, bf16) and llama.cpp
(llama-cpp-python, without and with its prompt cache) on the workloads kvb runs, same model
weights, same threads, greedy.

Run by the xtask in a virtual environment of its own (it pip-installs torch, transformers and
llama-cpp-python there): `python peers.py JOB.json PEER OUT.json`, one process per peer so that
its peak memory is its own. JOB holds the model folder (for transformers), the GGUF (for
llama.cpp), the thread count, the repetitions and the workloads; OUT gets one record per
workload and repetition, and the process's peak resident memory.

Each workload is a list of requests (text prompts and tokens to generate). A workload whose
`warm` is true is timed on its last request, after the others ran in the same process: what a
prompt cache can reuse. TTFT is measured from the call with the prompt's text to the first
sampled token (tokenizing included); the decode rate is the tokens after the first over the
time after it.
"""

import json
import resource
import sys
import time


def now():
    return time.perf_counter()


class Torch:
    """transformers' model in `dtype`, a plain greedy loop with its K/V cache (no cache across
    requests: transformers has no prompt cache)."""

    def __init__(self, folder, threads, dtype_name):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch = torch
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        self.name = f"pytorch-{dtype_name}"

    def request(self, prompt, max_new_tokens):
        torch = self.torch
        with torch.inference_mode():
            start = now()
            ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
            out = self.model(ids, use_cache=True)
            token = out.logits[0, -1].argmax()
            ttft = now() - start
            past, generated = out.past_key_values, [int(token)]
            for _ in range(max_new_tokens - 1):
                out = self.model(token.view(1, 1), past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[0, -1].argmax()
                generated.append(int(token))
            total = now() - start
        return ids.shape[1], generated, ttft, total


class LlamaCpp:
    """llama.cpp on the GGUF. With `prompt_cache`, a request continues the K/V of the previous
    one from their longest common token prefix (llama.cpp's in-context prompt cache, as
    `llama-server` and llama-cpp-python's own `generate` reuse it); without, it starts over."""

    def __init__(self, gguf, threads, prompt_cache, context):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=gguf, n_ctx=context, n_batch=512, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False,
        )
        self.prompt_cache = prompt_cache
        self.name = "llama.cpp+cache" if prompt_cache else "llama.cpp"

    def next_token(self):
        """The greedy token after the last one evaluated (llama-cpp-python keeps logits only
        with logits_all, so they are read from the context)."""
        import numpy as np

        logits = self.llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.llm.n_vocab(),))))

    def request(self, prompt, max_new_tokens):
        llm = self.llm
        start = now()
        tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        keep = 0
        if self.prompt_cache:
            cached = llm.input_ids[: llm.n_tokens]
            while keep < min(len(cached), len(tokens)) and cached[keep] == tokens[keep]:
                keep += 1
            # The last prompt token runs again for its logits.
            keep = min(keep, len(tokens) - 1)
        llm.n_tokens = keep
        llm.eval(tokens[keep:])
        token = self.next_token()
        ttft = now() - start
        generated = [token]
        for _ in range(max_new_tokens - 1):
            llm.eval([token])
            token = self.next_token()
            generated.append(token)
        total = now() - start
        return len(tokens), generated, ttft, total


def peer(name, job):
    threads = job["threads"]
    if name == "pytorch-f32":
        return Torch(job["hf_folder"], threads, "f32")
    if name == "pytorch-bf16":
        return Torch(job["hf_folder"], threads, "bf16")
    if name == "llama.cpp":
        return LlamaCpp(job["gguf"], threads, False, job["context"])
    if name == "llama.cpp+cache":
        return LlamaCpp(job["gguf"], threads, True, job["context"])
    raise SystemExit(f"unknown peer {name}")


def main():
    job, name = json.load(open(sys.argv[1])), sys.argv[2]
    records, loads = [], []
    for rep in range(job["reps"]):
        # A fresh peer per repetition: nothing carries over between repetitions.
        start = now()
        p = peer(name, job)
        loads.append((now() - start) * 1e3)
        for w in job["workloads"]:
            if w["warm"] and name.startswith("pytorch"):
                continue  # no prompt cache: its warm request is its cold one
            for i, r in enumerate(w["requests"]):
                prompt_tokens, generated, ttft, total = p.request(r["prompt"], r["max_new_tokens"])
                if i + 1 < len(w["requests"]):
                    continue
                decode = (len(generated) - 1) / (total - ttft) if len(generated) > 1 else None
                records.append({
                    "peer": name, "workload": w["name"], "rep": rep,
                    "prompt_tokens": prompt_tokens, "generated": len(generated),
                    "ttft_ms": ttft * 1e3, "decode_tokens_per_sec": decode, "tokens": generated,
                })
                print(f"{name} rep {rep} {w['name']}: {prompt_tokens} tokens, "
                      f"TTFT {ttft * 1e3:.1f} ms", file=sys.stderr, flush=True)
        del p
    # Peak resident memory of this process (KiB on Linux).
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dump({"peer": name, "peak_rss_bytes": peak, "load_ms": loads, "runs": records},
              open(sys.argv[3], "w"), indent=1)


if __name__ == "__main__":
    main()
