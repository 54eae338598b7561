"""How well could *any* token selection repair a moved document? (issue 14)

CacheBlend-style repair recomputes a share of a reused span's tokens and leaves the others' K/V as
they were computed elsewhere. This script bounds what such a repair can reach, with PyTorch f32
(transformers) on the default model, by cheating twice in the repair's favour:

- the selected tokens get their *exact* K/V (what a full prefill gives) at every layer, where a
  real repair computes them against the stale K/V of the others;
- the selection knows each token's true deviation (exact minus stale K/V), either at layer 1
  (what CacheBlend's probe measures) or summed over every layer (an oracle no repair has).

For each prompt of the fidelity workload (`requests.jsonl`: `prompt`, and `warm`, the text the
document was cached in) it takes Baseline's greedy answer, assembles the prompt's K/V from the
exact K/V of every token but the document's, whose K/V come from the `warm` run re-rotated to
their new positions (the unselected ones) or exact (the selected ones), runs the rest of the
prompt and the answer on that cache, and reports the answer positions' top-1 agreement and mean
KL(Baseline || assembled), as `kvb verify` does.

Run with the peers' virtual environment (`cargo xtask bench peers` creates it):
    ~/.cache/kvb/peers/bin/python bench/analysis/oracle_selection.py \
        bench/results/2026-11-24-fidelity/requests.jsonl MODEL_FOLDER 0.15 0.3 0.5
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import DynamicCache

ANSWER_TOKENS = 32


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Oracle:
    def __init__(self, folder):
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.layers = self.model.config.num_hidden_layers

    def cos_sin(self, positions):
        dummy = torch.zeros(1, len(positions), self.model.config.head_dim)
        c, s = self.model.model.rotary_emb(dummy, torch.tensor([positions]))
        return c[0][None], s[0][None]

    def unrotate(self, k, positions):
        c, s = self.cos_sin(positions)
        return k * c - rotate_half(k) * s

    def rotate(self, k, positions):
        c, s = self.cos_sin(positions)
        return k * c + rotate_half(k) * s

    def kv(self, ids):
        """Logits and per-layer K (after RoPE) and V, each [kv_heads, tokens, head_dim]."""
        out = self.model(torch.tensor([ids]), use_cache=True)
        layers = out.past_key_values.layers
        return (
            out.logits[0],
            [layers[l].keys[0].clone() for l in range(self.layers)],
            [layers[l].values[0].clone() for l in range(self.layers)],
        )

    def answer_logits(self, full, start, keys, values, prompt_len):
        """Runs `full[start:]` on a cache holding `keys`/`values` of `full[:start]`; returns the
        logits that predict the answer tokens."""
        cache = DynamicCache()
        for l in range(self.layers):
            cache.update(keys[l][None, :, :start], values[l][None, :, :start], l)
        positions = torch.arange(start, len(full))[None]
        out = self.model(
            torch.tensor([full[start:]]), past_key_values=cache, position_ids=positions
        )
        return out.logits[0][prompt_len - 1 - start : len(full) - 1 - start]


def longest_common_run(a, b):
    """(start in a, start in b, length) of the longest run of equal ids."""
    best = (0, 0, 0)
    previous = [0] * (len(b) + 1)
    for i in range(1, len(a) + 1):
        current = [0] * (len(b) + 1)
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                current[j] = previous[j - 1] + 1
                if current[j] > best[2]:
                    best = (i - current[j], j - current[j], current[j])
        previous = current
    return best


def kl_and_agreeing(reference, other):
    """Per-position KL(reference || other) and how many positions' top tokens agree."""
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(other.double(), -1)
    kl = (p.exp() * (p - q)).sum(-1).tolist()
    agreeing = int((reference.argmax(-1) == other.argmax(-1)).sum())
    return kl, agreeing


def main():
    requests, folder = sys.argv[1], sys.argv[2]
    ratios = [float(r) for r in sys.argv[3:]] or [0.15]
    oracle = Oracle(folder)
    rows = {}
    for line in open(requests):
        r = json.loads(line)
        prompt = oracle.tok(r["prompt"], add_special_tokens=False)["input_ids"]
        warm = oracle.tok(r["warm"], add_special_tokens=False)["input_ids"]
        full = oracle.model.generate(
            torch.tensor([prompt]), max_new_tokens=ANSWER_TOKENS, do_sample=False
        )[0].tolist()
        logits, keys, values = oracle.kv(full)
        reference = logits[len(prompt) - 1 : len(full) - 1]
        _, warm_keys, warm_values = oracle.kv(warm)
        # The document: the longest run the prompt (but its last token) shares with the warm text.
        at, warm_at, n = longest_common_run(prompt[:-1], warm)
        here, there = list(range(at, at + n)), list(range(warm_at, warm_at + n))
        exact_k = [oracle.unrotate(keys[l][:, at : at + n], here) for l in range(oracle.layers)]
        stale_k = [
            oracle.unrotate(warm_keys[l][:, warm_at : warm_at + n], there)
            for l in range(oracle.layers)
        ]
        exact_v = [values[l][:, at : at + n] for l in range(oracle.layers)]
        stale_v = [warm_values[l][:, warm_at : warm_at + n] for l in range(oracle.layers)]
        deviation = [
            ((exact_k[l] - stale_k[l]) ** 2).sum((0, 2)) + ((exact_v[l] - stale_v[l]) ** 2).sum((0, 2))
            for l in range(oracle.layers)
        ]
        layer1 = ((exact_k[1] - stale_k[1]) ** 2).sum((0, 2))
        every_layer = sum(deviation)

        def assembled(selected):
            ks, vs = [], []
            for l in range(oracle.layers):
                pick = selected[None, :, None]
                k, v = keys[l].clone(), values[l].clone()
                k[:, at : at + n] = oracle.rotate(torch.where(pick, exact_k[l], stale_k[l]), here)
                v[:, at : at + n] = torch.where(pick, exact_v[l], stale_v[l])
                ks.append(k)
                vs.append(v)
            return oracle.answer_logits(full, at + n, ks, vs, len(prompt))

        def top(score, ratio):
            mask = torch.zeros(n, dtype=torch.bool)
            k = int(round(ratio * n))
            if k:
                mask[torch.topk(score, k).indices] = True
            return mask

        result = {"none": kl_and_agreeing(reference, assembled(top(layer1, 0.0)))}
        for ratio in ratios:
            for name, score in (("layer-1 deviation", layer1), ("every layer's deviation", every_layer)):
                result[f"{ratio:.0%}, {name}"] = kl_and_agreeing(reference, assembled(top(score, ratio)))
        for name, (kl, agreeing) in result.items():
            rows.setdefault(name, []).append((kl, agreeing))
            print(
                f"{r['id']} | {name} | KL {sum(kl) / len(kl):.2e} | top-1 {agreeing}/{len(kl)}",
                file=sys.stderr,
                flush=True,
            )
    # Pooled over every answer position, as `kvb verify` summarises.
    print("| selection (exact K/V for the selected) | prompts | top-1 | mean KL |")
    print("|---|---:|---:|---:|")
    for name, values in rows.items():
        kls = [k for kl, _ in values for k in kl]
        agreeing = sum(a for _, a in values)
        print(f"| {name} | {len(values)} | {agreeing / len(kls):.1%} | {sum(kls) / len(kls):.2e} |")


if __name__ == "__main__":
    main()
