"""llama.cpp's batched decode on this machine: how much faster 16 sequences decode than one.

Issue 9 asks kvb for 16 clients' aggregate decode at 8 times one client's. This measures what the
reference CPU engine does with the same GGUF file, threads and context, so the ratio kvb reaches
(`cargo xtask bench model --activations q8 --batched-only`) can be read beside it.

Each sequence holds SHARED tokens of one common prefix (prefilled once and shared, as kvb's pool
shares it) and OWN tokens of its own; then steps of one new token per sequence are timed
(median of STEPS). Run with a Python that has llama-cpp-python (bench peers installs one):

    python bench/analysis/llama_cpp_batched_decode.py MODEL.gguf [--threads 2] [--kv-unified]
"""

import argparse
import statistics
import time

import llama_cpp as L


def seq_cp(ctx, src, dst):
    """Shares src's cells with dst (the API was renamed across llama.cpp versions)."""
    if hasattr(L, "llama_memory_seq_cp"):
        L.llama_memory_seq_cp(L.llama_get_memory(ctx), src, dst, -1, -1)
    elif hasattr(L, "llama_kv_self_seq_cp"):
        L.llama_kv_self_seq_cp(ctx, src, dst, -1, -1)
    else:
        L.llama_kv_cache_seq_cp(ctx, src, dst, -1, -1)


def decode(ctx, batch, entries):
    """One llama_decode of (token, position, sequence, wants logits) entries."""
    batch.n_tokens = len(entries)
    for i, (tok, pos, seq, logits) in enumerate(entries):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits
    rc = L.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def run(model, threads, sequences, shared, own, steps, kv_unified):
    cp = L.llama_context_default_params()
    cp.n_ctx = sequences * (shared + own + steps) + 256
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_seq_max = sequences
    cp.n_threads = threads
    cp.n_threads_batch = threads
    # One K/V buffer for all sequences (llama-server's --kv-unified), or one per sequence.
    cp.kv_unified = kv_unified
    ctx = L.llama_new_context_with_model(model, cp)
    if not ctx:
        raise RuntimeError("llama_new_context_with_model failed")
    batch = L.llama_batch_init(512, 0, sequences)
    tok = 1000  # any ordinary token: the timing does not depend on the text
    for start in range(0, shared, 512):
        n = min(512, shared - start)
        decode(ctx, batch, [(tok + (start + i) % 500, start + i, 0, False) for i in range(n)])
    for s in range(1, sequences):
        seq_cp(ctx, 0, s)
    for s in range(sequences):
        for start in range(0, own, 512):
            n = min(512, own - start)
            decode(ctx, batch, [(tok + (s + start + i) % 500, shared + start + i, s,
                                 start + i == own - 1) for i in range(n)])
    times = []
    for step in range(steps):
        pos = shared + own + step
        t = time.perf_counter()
        decode(ctx, batch, [(tok + step, pos, s, True) for s in range(sequences)])
        times.append(time.perf_counter() - t)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    return statistics.median(times[2:])


# The shapes of kvb's `bench model --batched-only` table.
SHAPES = [(0, 32), (1024, 128), (1024, 1024)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=34)
    ap.add_argument("--kv-unified", action="store_true",
                    help="one K/V buffer shared by every sequence (default: one per sequence)")
    args = ap.parse_args()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_load_model_from_file(args.model.encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    print("| sequences | shared prefix | own tokens each | step | tokens/s | vs one sequence |")
    print("|---:|---:|---:|---:|---:|---:|")
    for shared, own in SHAPES:
        one = None
        for sequences in [1, 4, 16]:
            step = run(model, args.threads, sequences, shared, own, args.steps, args.kv_unified)
            rate = sequences / step
            one = one or rate
            print(f"| {sequences} | {shared} | {own} | {step * 1e3:.1f} ms | {rate:.1f} | {rate / one:.1f}x |",
                  flush=True)
    L.llama_free_model(model)


if __name__ == "__main__":
    main()
