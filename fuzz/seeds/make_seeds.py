#!/usr/bin/env python3
"""Writes the model-file seeds of the fuzz targets: tiny but complete GGUF files (one per tokenizer
kind and weight type) and safetensors files. Deterministic; run from any folder:
`python3 fuzz/seeds/make_seeds.py`. The store seeds come from `cargo test -p kvb-fuzz -- --ignored`."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 32, 2, 1, 32, 1
HEAD_DIM = HIDDEN // HEADS
F32, F16, Q8_0 = 0, 1, 8


def values(n, salt):
    """n deterministic values in [-0.5, 0.5)."""
    return [((i * 2654435761 + salt * 40503) % 1000) / 1000.0 - 0.5 for i in range(n)]


def q8_0(vals):
    out = b""
    for b in range(0, len(vals), 32):
        block = vals[b:b + 32]
        scale = max(abs(v) for v in block) / 127 or 1.0
        out += struct.pack("<e", scale) + bytes((round(v / scale) & 0xFF) for v in block)
    return out


def tensor_bytes(kind, vals):
    if kind == F32:
        return struct.pack(f"<{len(vals)}f", *vals)
    if kind == F16:
        return struct.pack(f"<{len(vals)}e", *vals)
    return q8_0(vals)


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(v):
    """(type id, bytes) of a metadata value."""
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, int):
        return 4, struct.pack("<I", v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, str):
        return 8, gguf_string(v)
    elem = [gguf_value(x) for x in v]
    kind = elem[0][0] if elem else 8
    return 9, struct.pack("<IQ", kind, len(v)) + b"".join(e[1] for e in elem)


def gguf(tokenizer, matrix_kind):
    vocab = len(tokenizer["tokenizer.ggml.tokens"])
    meta = {
        "general.architecture": "llama",
        "general.alignment": 32,
        "llama.context_length": 64,
        "llama.embedding_length": HIDDEN,
        "llama.block_count": LAYERS,
        "llama.feed_forward_length": FF,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
        "tokenizer.chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}",
        **tokenizer,
    }
    tensors = [("token_embd.weight", [vocab, HIDDEN], matrix_kind), ("output_norm.weight", [HIDDEN], F32)]
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensors += [
            (p + "attn_norm.weight", [HIDDEN], F32),
            (p + "attn_q.weight", [HIDDEN, HIDDEN], matrix_kind),
            (p + "attn_k.weight", [KV_HEADS * HEAD_DIM, HIDDEN], matrix_kind),
            (p + "attn_v.weight", [KV_HEADS * HEAD_DIM, HIDDEN], matrix_kind),
            (p + "attn_output.weight", [HIDDEN, HIDDEN], matrix_kind),
            (p + "ffn_norm.weight", [HIDDEN], F32),
            (p + "ffn_gate.weight", [FF, HIDDEN], matrix_kind),
            (p + "ffn_up.weight", [FF, HIDDEN], matrix_kind),
            (p + "ffn_down.weight", [HIDDEN, FF], matrix_kind),
        ]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, v in meta.items():
        kind, body = gguf_value(v)
        out += gguf_string(k) + struct.pack("<I", kind) + body
    data, offsets = b"", []
    for salt, (name, shape, kind) in enumerate(tensors):
        offsets.append(len(data))
        n = 1
        for d in shape:
            n *= d
        data += tensor_bytes(kind, values(n, salt))
        data += b"\0" * (-len(data) % 32)
    for (name, shape, kind), off in zip(tensors, offsets):
        out += gguf_string(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in reversed(shape))
        out += struct.pack("<IQ", kind, off)
    out += b"\0" * (-len(out) % 32)
    return out + data


BPE = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b", "\u0120", "ab", "h", "i"],
    "tokenizer.ggml.token_type": [3, 3, 1, 1, 1, 1, 1, 1],
    "tokenizer.ggml.merges": ["a b"],
    "tokenizer.ggml.bos_token_id": 0,
    "tokenizer.ggml.eos_token_id": 1,
}
SPM = {
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "<0x41>"],
    "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -1.5, -3.0],
    "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 6],
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.unknown_token_id": 0,
}


def safetensors(tensors):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def write(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, name), "wb") as f:
        f.write(data)


write("gguf", "tiny-bpe-q8_0.gguf", gguf(BPE, Q8_0))
write("gguf", "tiny-spm-f16.gguf", gguf(SPM, F16))
write("safetensors", "three-dtypes.safetensors", safetensors({
    "a.weight": ("F32", [2, 3], tensor_bytes(F32, values(6, 1))),
    "b.weight": ("F16", [4, 2], tensor_bytes(F16, values(8, 2))),
    "c.weight": ("BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
}))
write("safetensors", "empty.safetensors", safetensors({}))
