"""PyTorch SDPA on the shapes of `gpu_attention.rs`, for the issue's yardstick ("at least half of
SDPA's FLOP/s at sequence 4,096, head dim 128, f16, causal"). Run it on the same GPU as
`cargo xtask bench attn --backend cuda`; it needs only torch with CUDA.

    python3 crates/kvb-attn/benches/sdpa_reference.py [--context 4096]

Prints one markdown row per (case, dtype): median time over CUDA events and GFLOP/s counted
the way the Rust bench counts them (4 * q_heads * head_dim per visible (row, key) pair).
"""

import argparse

import torch
import torch.nn.functional as F


def median_ms(fn, reps):
    fn()  # picks the kernel, allocates
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    l, hq, hkv, d = a.context, a.q_heads, a.kv_heads, a.head_dim
    per_key = 4.0 * hq * d
    suffix = min(128, l)
    cases = [
        # name, query rows, flops
        ("prefill, causal", l, per_key * l * (l + 1) / 2),
        ("suffix of 128 after cached K/V", suffix, per_key * sum(x + 1 for x in range(l - suffix, l))),
        ("decode, 8 sequences", 1, per_key * 8 * l),
    ]
    print(f"# PyTorch {torch.__version__} SDPA on {torch.cuda.get_device_name()}")
    print(f"{hq} q heads over {hkv} kv heads, head dim {d}, context {l}, median of {a.reps}.\n")
    print("| case | dtype | time | GFLOP/s |")
    print("|---|---|---:|---:|")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for name, rows, flops in cases:
            batch = 8 if name.startswith("decode") else 1
            q = torch.randn(batch, hq, rows, d, device="cuda", dtype=dtype)
            k = torch.randn(batch, hkv, l, d, device="cuda", dtype=dtype)
            v = torch.randn(batch, hkv, l, d, device="cuda", dtype=dtype)
            if rows == l:
                run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                # Bottom-right causal: row i sees keys up to l - rows + i.
                mask = torch.ones(rows, l, device="cuda", dtype=torch.bool).tril(l - rows)
                run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            ms = median_ms(run, a.reps)
            print(f"| {name} | {str(dtype).removeprefix('torch.')} | {ms:.3f} ms | {flops / ms / 1e6:.0f} |")


if __name__ == "__main__":
    main()
