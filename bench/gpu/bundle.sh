#!/usr/bin/env bash
# Gathers what bench/gpu/device_run.sh needs into .device/ (ignored by git; the device tool
# carries it): kvb, the attention and model test binaries, the attention benchmark, llama.cpp's
# CUDA tools, the gguf wheel and the default model's tokenizer. Build first, with the CI features:
#
#   cargo test --release --workspace --features "$FEATURES" --no-run
#   cargo build --release --workspace --features "$FEATURES" --bin kvb
#   cargo bench -p kvb-attn --features cuda --bench gpu_attention --no-run
#
# LLAMA_BUILD is a llama.cpp CMake build with -DGGML_CUDA=ON -DBUILD_SHARED_LIBS=ON and the
# targets llama-bench, llama-batched-bench and llama-quantize (nvcc from the nvidia-cuda-nvcc
# wheel works where no CUDA toolkit is installed; see bench/results/2026-11-26-gpu/README.md).
set -euo pipefail
T=${CARGO_TARGET_DIR:-target}/release
LLAMA_BUILD=${LLAMA_BUILD:-}  # unset: no llama.cpp (device_run.sh then skips it)
D=.device
mkdir -p $D/stage/llama/bin $D/stage/llama/lib
newest() { ls -t $T/deps/$1-* | grep -v '\.d$' | head -1; }
cp $T/kvb $D/stage/kvb
# KVB_ALT: a second kvb to compare (device_run.sh's step alt), e.g. one built before a change.
[ -n "${KVB_ALT:-}" ] && cp "$KVB_ALT" $D/stage/kvb-alt && strip --strip-debug $D/stage/kvb-alt
# kvb-attn's test binary (its CUDA suite is the module cube_matches_naive) and the attention
# benchmark, when built (see above).
for t in attn_tests gpu_attention; do
  ls $T/deps/$t-* >/dev/null 2>&1 && cp "$(newest $t)" $D/stage/$t
done
# kvb-model's products at decode shapes, when built (cargo bench --workspace --features
# "$FEATURES" --bench gpu_linear --no-run: the workspace's features, so no second burn build).
ls $T/deps/gpu_linear-* >/dev/null 2>&1 && cp "$(newest gpu_linear)" $D/stage/gpu_linear
# kvb-model's test binary, whose CUDA suites are the modules cube_ops and device_sampling
# (built by the first command above).
ls $T/deps/model_tests-* >/dev/null 2>&1 && cp "$(newest model_tests)" $D/stage/model_tests && strip $D/stage/model_tests
if [ -n "$LLAMA_BUILD" ]; then
  for b in llama-bench llama-batched-bench llama-quantize; do cp $LLAMA_BUILD/bin/$b $D/stage/llama/bin/; done
  cp -P $LLAMA_BUILD/bin/*.so* $D/stage/llama/lib/
fi
# kvb keeps its symbols (not its debug info): bench/gpu/stack_samples.py names its functions.
strip --strip-debug $D/stage/kvb
strip $D/stage/attn_tests $D/stage/gpu_attention $D/stage/gpu_linear $D/stage/llama/bin/* $D/stage/llama/lib/*.so* 2>/dev/null || true
# device_run.sh also needs, beside the bundle, the gguf wheel and the default model's tokenizer.
ls $D/gguf-*.whl > /dev/null 2>&1 || pip download -q --no-deps -d $D gguf
[ -f $D/smollm2-tokenizer.gguf ] || echo "missing $D/smollm2-tokenizer.gguf: make it with" \
  "xtask/shapes/make_shape.py --tokenizer-from <SmolLM2 GGUF> --save-tokenizer $D/smollm2-tokenizer.gguf" >&2
XZ_OPT=-T2 tar cJf $D/bundle.tar.xz -C $D/stage .
rm -rf $D/stage
ls -la $D
du -sh $D
