#!/usr/bin/env python3
"""Real-shaped models with random weights, as GGUF files made the way users' files are made.

1. An F16 GGUF written with the `gguf` package (llama.cpp's own writer): a real architecture's
   shapes, matrices drawn from a normal distribution (std 0.02, a generator seeded per tensor
   name, so files are reproducible), norms of ones and biases in F32, the tokenizer copied from
   another GGUF (padded with made-up tokens up to the shape's vocabulary size).
2. Quantized by llama.cpp's own quantizer (`llama_model_quantize`, what `llama-quantize` runs)
   through llama-cpp-python, or by a `llama-quantize` binary given with --quantizer.

    pip install gguf==0.19.0 numpy llama-cpp-python==0.3.36
    python3 make_shape.py --shape smollm2-1.7b --quant Q4_K_M,Q8_0 \\
        --tokenizer-from PATH/TO/ANY.gguf --out DIR [--layers N] [--seed S] [--threads T]

`--save-tokenizer FILE` writes only the tokenizer fields of --tokenizer-from to a GGUF of no
tensors (a few MB to carry where the model file cannot go) and stops.

Writes DIR/<shape>.f16.gguf (kept: later quantizations reuse it) and DIR/<shape>.<quant>.gguf
(quant in lower case); with --layers N other than the shape's own count, <shape> becomes
<shape>-<N>l so a shortened model never passes for the full one. A file that already exists
is reused, not rewritten. Files are written under a .tmp name and renamed when complete.
"""

import argparse
import ctypes
import os
import sys
import time
import zlib

import numpy as np
import gguf

# Architecture shapes. vocab None: the tokenizer GGUF's own size.
SHAPES = {
    # The default model's own shape (SmolLM2-135M-Instruct), where its file cannot travel.
    "smollm2-135m": dict(
        arch="llama", layers=30, hidden=576, ffn=1536, heads=9, kv_heads=3, head_dim=64,
        vocab=None, theta=100000.0, eps=1e-5, qkv_bias=False,
    ),
    "smollm2-1.7b": dict(
        arch="llama", layers=24, hidden=2048, ffn=8192, heads=32, kv_heads=32, head_dim=64,
        vocab=None, theta=130000.0, eps=1e-5, qkv_bias=False,
    ),
    "llama3.2-1b": dict(
        arch="llama", layers=16, hidden=2048, ffn=8192, heads=32, kv_heads=8, head_dim=64,
        vocab=128256, theta=500000.0, eps=1e-5, qkv_bias=False,
    ),
    "qwen2.5-1.5b": dict(
        arch="qwen2", layers=28, hidden=1536, ffn=8960, heads=12, kv_heads=2, head_dim=128,
        vocab=151936, theta=1000000.0, eps=1e-6, qkv_bias=True,
    ),
    # Untied: an output.weight beside token_embd (a 16 GB F16 file; `--layers 2` keeps the
    # embedding and head whole, the part untying changes).
    "llama3-8b": dict(
        arch="llama", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128,
        vocab=128256, theta=500000.0, eps=1e-5, qkv_bias=False, tied=False,
    ),
}
CONTEXT = 8192
STD = 0.02

# llama.cpp's `enum llama_ftype` values (llama.h); the llama_cpp constants win when present.
FTYPES = {
    "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
    "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30,
}

TOKEN_TYPE_NORMAL = 1
# Elements generated at a time (in f32) for a large tensor: bounds the scratch memory.
CHUNK_ELEMENTS = 1 << 22


def log(msg):
    print(msg, flush=True)


def mb(path):
    return f"{os.path.getsize(path) / 1e6:,.1f} MB"


# ---------------------------------------------------------------- tokenizer


def read_field(field):
    """A GGUFReader field's value with its GGUF types: (value, type, sub_type).

    Strings come back as raw bytes (token texts need not be valid UTF-8); a string array is
    read through the field's data indices into its parts, one part per string."""
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [field.parts[i].tobytes() for i in field.data], vtype, sub
        if sub == gguf.GGUFValueType.ARRAY:
            raise ValueError(f"{field.name}: nested arrays are not supported")
        return field.contents(), vtype, sub
    if vtype == gguf.GGUFValueType.STRING:
        return field.parts[field.data[0]].tobytes(), vtype, None
    return field.contents(), vtype, None


def tokenizer_fields(path, vocab):
    """Every `tokenizer.*` field of the GGUF at `path`, the per-token arrays padded to `vocab`
    entries (vocab None: the file's own size). Returns (fields, vocab)."""
    reader = gguf.GGUFReader(path)
    fields = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            fields[name] = list(read_field(field))
    key_tokens = "tokenizer.ggml.tokens"
    if key_tokens not in fields:
        raise SystemExit(f"{path} has no {key_tokens}: not a GGUF with a tokenizer")
    tokens = fields[key_tokens][0]
    n = len(tokens)
    if vocab is None:
        vocab = n
    if n > vocab:
        raise SystemExit(
            f"the tokenizer in {path} has {n} tokens, more than this shape's {vocab}: "
            "use a tokenizer with at most that many")
    if n < vocab:
        # Made-up unique tokens of plain printable ASCII (no spaces), type NORMAL: loadable and
        # decodable by both SentencePiece and byte-level BPE vocabularies, never produced by
        # BPE merges; NORMAL rather than USER_DEFINED so tokenizers need not scan ~100k extra
        # special pieces on every text.
        taken = set(tokens)
        pad = []
        for i in range(n, vocab):
            text = f"<kvb_pad_{i}>".encode()
            while text in taken:
                text = b"_" + text
            taken.add(text)
            pad.append(text)
        fields[key_tokens][0] = tokens + pad
        ttype = fields.get("tokenizer.ggml.token_type")
        if ttype is not None:
            ttype[0] = list(ttype[0]) + [TOKEN_TYPE_NORMAL] * (vocab - n)
        scores = fields.get("tokenizer.ggml.scores")
        if scores is not None:
            low = min(scores[0]) if scores[0] else 0.0
            scores[0] = list(scores[0]) + [float(low) - 1.0] * (vocab - n)
        log(f"tokenizer: {n} tokens from {path}, padded to {vocab}")
    else:
        log(f"tokenizer: {n} tokens from {path}")
    for name in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if name in fields and len(fields[name][0]) != vocab:
            raise SystemExit(f"{path}: {name} has {len(fields[name][0])} entries, not {vocab}")
    return fields, vocab


# ---------------------------------------------------------------- tensors


def tensor_plan(s, vocab):
    """(name, numpy shape [rows = out features, cols = in features], kind) as llama.cpp's
    converter names them; kind is 'matrix' (F16, normal), 'norm' (F32 ones) or 'bias' (F32)."""
    h, f, hd = s["hidden"], s["ffn"], s["head_dim"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    plan = [("token_embd.weight", (vocab, h), "matrix")]
    for i in range(s["layers"]):
        p = f"blk.{i}."
        plan.append((p + "attn_norm.weight", (h,), "norm"))
        plan.append((p + "attn_q.weight", (q, h), "matrix"))
        if s["qkv_bias"]:
            plan.append((p + "attn_q.bias", (q,), "bias"))
        plan.append((p + "attn_k.weight", (kv, h), "matrix"))
        if s["qkv_bias"]:
            plan.append((p + "attn_k.bias", (kv,), "bias"))
        plan.append((p + "attn_v.weight", (kv, h), "matrix"))
        if s["qkv_bias"]:
            plan.append((p + "attn_v.bias", (kv,), "bias"))
        plan.append((p + "attn_output.weight", (h, q), "matrix"))
        plan.append((p + "ffn_norm.weight", (h,), "norm"))
        plan.append((p + "ffn_gate.weight", (f, h), "matrix"))
        plan.append((p + "ffn_up.weight", (f, h), "matrix"))
        plan.append((p + "ffn_down.weight", (h, f), "matrix"))
    plan.append(("output_norm.weight", (h,), "norm"))
    # Tied embeddings (the default): no output.weight.
    if not s.get("tied", True):
        plan.append(("output.weight", (vocab, h), "matrix"))
    return plan


def make_tensor(name, shape, kind, seed):
    if kind == "norm":
        return np.ones(shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if kind == "bias":
        return (rng.standard_normal(shape, dtype=np.float32) * STD).astype(np.float32)
    out = np.empty(shape, dtype=np.float16)
    flat = out.reshape(-1)
    for start in range(0, flat.size, CHUNK_ELEMENTS):
        stop = min(start + CHUNK_ELEMENTS, flat.size)
        chunk = rng.standard_normal(stop - start, dtype=np.float32)
        chunk *= STD
        flat[start:stop] = chunk
    return out


def write_f16(path, shape_name, s, tok_fields, vocab, seed):
    arch = s["arch"]
    plan = tensor_plan(s, vocab)
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(f"kvb random-weight {shape_name} shape")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_block_count(s["layers"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key, (value, vtype, sub) in tok_fields.items():
        if vtype == gguf.GGUFValueType.ARRAY and len(value) == 0:
            continue  # GGUF writers refuse empty arrays
        w.add_key_value(key, value, vtype, sub_type=sub)

    # Tensor infos first, then the data one tensor at a time: no more than one tensor in memory.
    for name, shape, kind in plan:
        dtype = np.float16 if kind == "matrix" else np.float32
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        w.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
    total = sum(int(np.prod(shape)) for _, shape, _ in plan)
    log(f"{shape_name}: {len(plan)} tensors, {total / 1e9:.3f} B parameters, writing {path}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.time()
    for i, (name, shape, kind) in enumerate(plan):
        w.write_tensor_data(make_tensor(name, shape, kind, seed))
        if name.endswith("ffn_down.weight"):
            log(f"  block {name.split('.')[1]} written ({time.time() - t0:.0f} s)")
    w.close()
    os.replace(tmp, path)


# ---------------------------------------------------------------- quantization


def quantize_with(binary, src, dst, quant, threads):
    """llama.cpp's `llama-quantize SRC DST TYPE [THREADS]`."""
    import subprocess
    tmp = dst + ".tmp"
    cmd = [binary, src, tmp, quant] + ([str(threads)] if threads > 0 else [])
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        tail = done.stderr.strip().splitlines()[-5:]
        raise SystemExit(f"{binary} to {quant} failed ({done.returncode}): " + " | ".join(tail))
    os.replace(tmp, dst)


def save_tokenizer(src, dst):
    """The `tokenizer.*` fields of `src` alone, in a GGUF with no tensors."""
    tok, vocab = tokenizer_fields(src, None)
    field = gguf.GGUFReader(src).fields.get("general.architecture")
    if field is None:
        raise SystemExit(f"{src} has no general.architecture: not a model GGUF")
    arch = str(read_field(field)[0], "utf-8")
    w = gguf.GGUFWriter(dst + ".tmp", arch)
    for key, (value, vtype, sub) in tok.items():
        if vtype == gguf.GGUFValueType.ARRAY and len(value) == 0:
            continue
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    os.replace(dst + ".tmp", dst)
    log(f"wrote {dst}: the {vocab}-token tokenizer of {src} ({mb(dst)})")


def quantize(src, dst, quant, threads):
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit(
            "quantizing needs llama-cpp-python (llama.cpp's own quantizer): "
            "pip install llama-cpp-python==0.3.36 (it compiles llama.cpp; takes minutes)")
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}", None)
    if ftype is None:
        ftype = FTYPES[quant]
        log(f"  llama_cpp has no LLAMA_FTYPE_MOSTLY_{quant}; using llama.h's value {ftype}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    if threads > 0:
        params.nthread = threads
    tmp = dst + ".tmp"
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise SystemExit(f"llama_model_quantize to {quant} failed ({rc})")
    os.replace(tmp, dst)


# ---------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--quant", default="",
                    help="comma-separated: " + ",".join(FTYPES) + " (none: only the F16 file)")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF whose tokenizer.* fields to copy")
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--quantizer", help="a llama-quantize binary (default: llama-cpp-python)")
    ap.add_argument("--save-tokenizer", metavar="FILE",
                    help="write the tokenizer of --tokenizer-from alone to FILE and stop")
    ap.add_argument("--layers", type=int, help="override the layer count (quick small versions)")
    ap.add_argument("--seed", type=int, default=20261125)
    ap.add_argument("--threads", type=int, default=0, help="quantizer threads (0: llama.cpp's default)")
    args = ap.parse_args(argv)
    if args.save_tokenizer:
        save_tokenizer(args.tokenizer_from, args.save_tokenizer)
        return
    if not args.shape or not args.out:
        ap.error("--shape and --out are needed (or --save-tokenizer)")

    quants = [q.strip().upper() for q in args.quant.split(",") if q.strip()]
    for q in quants:
        if q not in FTYPES:
            ap.error(f"unknown quantization {q}; known: {', '.join(FTYPES)}")

    s = dict(SHAPES[args.shape])
    stem = args.shape
    if args.layers is not None and args.layers != s["layers"]:
        if args.layers < 1:
            ap.error("--layers must be at least 1")
        s["layers"] = args.layers
        stem = f"{args.shape}-{args.layers}l"
    os.makedirs(args.out, exist_ok=True)

    f16 = os.path.join(args.out, f"{stem}.f16.gguf")
    if os.path.exists(f16):
        log(f"reused {f16} ({mb(f16)})")
    else:
        t0 = time.time()
        tok, vocab = tokenizer_fields(args.tokenizer_from, s["vocab"])
        write_f16(f16, stem, s, tok, vocab, args.seed)
        log(f"wrote {f16}: {mb(f16)} in {time.time() - t0:.1f} s")

    for q in quants:
        dst = os.path.join(args.out, f"{stem}.{q.lower()}.gguf")
        if os.path.exists(dst):
            log(f"reused {dst} ({mb(dst)})")
            continue
        t0 = time.time()
        log(f"quantizing {f16} to {q}")
        if args.quantizer:
            quantize_with(args.quantizer, f16, dst, q, args.threads)
        else:
            quantize(f16, dst, q, args.threads)
        log(f"wrote {dst}: {mb(dst)} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
