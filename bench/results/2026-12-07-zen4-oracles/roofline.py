#!/usr/bin/env python3
"""The exact (f32) prefill's floor on K-quant files: each prefill's multiply-adds at the cores'
f32 FMA peak, beside llama.cpp's measured time from the peers bench's results.

    python3 roofline.py GFLOPS RESULTS_DIR...

GFLOPS: the f32 peak measured on the host (fma_peak.c). Each RESULTS_DIR is a
`bench peers --model-shape` run; its shape comes from the folder's name. A prefill of T tokens
costs 2 T flops per weight of the blocks' matrices, the attention's 2 T (T + 1) head_dim per q
head and layer (causal: half of T^2 scores and half of T^2 value rows, 2 flops each), and one row
of the LM head.
"""

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../xtask/shapes"))
from make_shape import SHAPES  # noqa: E402

VOCAB = {"smollm2-1.7b": 49152}


def prefill_flops(s, tokens):
    hd, h = s["head_dim"], s["hidden"]
    per_layer = h * (s["heads"] + 2 * s["kv_heads"]) * hd + s["heads"] * hd * h + 3 * h * s["ffn"]
    vocab = s["vocab"] or 49152
    matrices = 2 * tokens * per_layer * s["layers"]
    attention = 2 * tokens * (tokens + 1) * hd * s["heads"] * s["layers"]
    return matrices + attention + 2 * h * vocab


def engines(readme):
    """{engine: (ttft_short_ms, ttft_long_ms)} and the two token counts of a results README."""
    text = open(readme).read()
    counts = [int(t) for t in re.findall(r"TTFT (\d+) tokens", text)[:2]]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 9 and cells[0] in ("kvb", "kvb q8", "llama.cpp", "llama.cpp+cache"):
            rows.setdefault(cells[0], (float(cells[4]), float(cells[6])))
    return counts, rows


def main():
    peak = float(sys.argv[1]) * 1e9
    print("| file | tokens | f32 floor, s | kvb f32, s | llama.cpp, s | floor / llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|")
    for d in sys.argv[2:]:
        name = os.path.basename(d.rstrip("/"))
        m = re.match(r"\d{4}-\d\d-\d\d-peers-(.+?)-(q\d_k(?:_m)?)-", name)
        if not m:
            continue
        shape, quant = m.group(1), m.group(2).upper()
        counts, rows = engines(os.path.join(d, "README.md"))
        for i, t in enumerate(counts):
            floor = prefill_flops(SHAPES[shape], t) / peak
            kvb, llama = rows["kvb"][i] / 1e3, rows["llama.cpp"][i] / 1e3
            print(f"| {shape} {quant} | {t:,} | {floor:.2f} | {kvb:.2f} | {llama:.2f} | "
                  f"{floor / llama:.2f} |")


if __name__ == "__main__":
    main()
