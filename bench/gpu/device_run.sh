#!/usr/bin/env bash
# The GPU measurements of issue 44 in one pass, on a lent NVIDIA machine (no network there).
#
# Run from the repository root with the bundle that bench/gpu/bundle.sh made in .device/:
# kvb, the attention and model test binaries and a benchmark built with --features cuda,
# llama.cpp's CUDA tools, the gguf wheel and the default model's tokenizer. Models are made
# there (random weights, real shapes: xtask/shapes/make_shape.py, quantized by llama.cpp's
# llama-quantize). Every step has its own
# time limit, so a failing step costs its limit and the rest still run; logs and JSON results
# go to $OUT (the device tool brings them back).
set -u
OUT=${OUT:-/tmp/kvb-gpu-out}
R=$OUT/results
mkdir -p "$R"
exec > >(tee "$OUT/run.log") 2>&1
# STEPS picks the steps (default: all but diag, linear, layouts and profile): tests attn
# linear ncu models llama kvb long batch alt extra diag layouts profile host stacks decode launches kernels. ATTN_RUNS (default "f16:auto f16:vector bf16:auto") the attention benchmarks, SKIP_SDPA=1 skips
# PyTorch's; BUDGET (seconds, default 540) stops starting kvb runs near the end.
STEPS=" ${STEPS:-tests attn models llama kvb extra launches} "
want() { [[ $STEPS == *" $1 "* ]]; }
trap 'tar czf "$OUT/results.tar.gz" -C "$OUT" results && rm -rf "$R"' EXIT
B=$PWD/.device
step() { echo; echo "=== $(date +%T) $*"; }
t0=$(date +%s)
left() { echo $((${BUDGET:-540} - ($(date +%s) - t0))); }

step bundle
# KVB_ARGMAX=split runs kvb's argmax kernel on CUDA too (its default there is burn's until checked).
echo "KVB_ARGMAX=${KVB_ARGMAX:-}"
(cd "$B" && tar xJf bundle.tar.xz) || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
lscpu | grep -E '^Model name|^CPU\(s\)'
find / -xdev -name 'libcublas.so.1[0-9]' 2>/dev/null | head -4
CUBLAS=$(dirname "$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$B/llama/lib:$CUBLAS:${LD_LIBRARY_PATH:-}
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$B"/gguf-*.whl
export PYTHONPATH=/tmp/site

if want tests; then
# TESTS picks the suites (default: all three).
# A suite is a module of a crate's test binary; its ignored tests whose names hold a filter run.
suite() {  # binary, module, filter
  local names
  names=$("$B/$1" --list --ignored 2>/dev/null | sed -n "s/^\($2::.*\): test\$/\1/p" | grep -F -- "$3")
  [ -n "$names" ] && "$B/$1" --ignored --exact $names
}
if [[ " ${TESTS:-cube_matches_naive} " == *" cube_matches_naive "* ]]; then
step "attention kernels vs the per-element answer (CUDA f32, f16, bf16)"
timeout 180 bash -c "$(declare -f suite); B=$B; suite attn_tests cube_matches_naive cuda" 2>&1 | grep -v '^$' | tail -40
fi
step "kvb-model's kernels vs the reference ops (CUDA f32, f16, bf16)"
for t in ${TESTS:-cube_ops device_sampling}; do
  [ $t = cube_matches_naive ] && continue
  # FILTER_<suite> narrows a suite to the tests whose names hold it (default: cuda).
  filter=FILTER_$t
  [ -x "$B/model_tests" ] && timeout 120 bash -c "$(declare -f suite); B=$B; suite model_tests $t '${!filter:-cuda}'" 2>&1 | grep -E '^test |test result|panicked|Test failed|minimal failing' | tail -24
done
fi

if want attn; then
step "attention kernel benchmark: f16 with tensor cores, f16 without, bf16"
for run in ${ATTN_RUNS:-f16:auto f16:vector bf16:auto}; do
  set -- ${run/:/ }
  KVB_ATTN=$2 KVB_ATTN_BACKEND=cuda KVB_ATTN_DTYPE=$1 KVB_BENCH_OUT=$R/attn-$1-$2 \
    timeout 90 "$B/gpu_attention" --bench 2>&1 | grep -E '^\||burn|wrote|error|panic'
done
[ -n "${SKIP_SDPA:-}" ] || timeout 60 python3 crates/kvb-attn/benches/sdpa_reference.py 2>&1 | tail -12
fi

if want linear; then
step "projection products at decode shapes: weights [in, out] vs [out, in] viewed transposed"
# PROJECTION_OUTPUTS: outputs per group of kvb's kernel to compare (its own choice: "auto").
for o in ${PROJECTION_OUTPUTS:-auto}; do
  echo "kvb kernel outputs per group: $o"
  [ $o = auto ] && o=
  [ -x "$B/gpu_linear" ] && KVB_PROJECTION_OUTPUTS=$o KVB_BENCH_BACKEND=cuda KVB_BENCH_DTYPE=f16 \
    KVB_BENCH_OUT=$R/linear-f16${o:+-o$o} timeout 150 "$B/gpu_linear" --bench 2>&1 | grep -E '^\||error|panic'
done
fi

if want ncu; then
step "Nsight Compute on kvb's projection kernel: gate, up at 1 and 16 rows"
# gpu_linear launches the kernel 22 times a shape and row count (q,k,v, o, gate,up; 1, 4, 16).
for skip in 132 176; do
  KVB_BENCH_BACKEND=cuda KVB_BENCH_DTYPE=f16 timeout 120 /usr/local/cuda/bin/ncu \
    --kernel-name regex:projection --launch-skip $skip --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis "$B/gpu_linear" --bench \
    2>&1 | grep -vE '^\||^==PROF== (Profiling|Disconnected)' | grep -v '^\s*$' | head -70
done
fi

want models || want batch || want long || want alt || want stacks || want kvb || want layouts || want profile || want host || want decode || want llama || want diag || want launches || want kernels || { step done; exit 0; }
step "models (random weights, real shapes)"
M=/tmp/shapes
mkdir -p $M
# Without llama.cpp's quantizer the F16 files serve kvb alone: on a GPU kvb holds the weights
# in --dtype whatever the file stores, so its speed is the same.
LLAMA=$B/llama/bin
if [ -x $LLAMA/llama-quantize ]; then
  QUANT=(--quantizer $LLAMA/llama-quantize --threads 16) Q1=Q4_1 Q2=Q4_K_M
  MODELS="smollm2-135m.q4_1 llama3.2-1b.q4_k_m"
else
  QUANT=() Q1= Q2= MODELS="smollm2-135m.f16 llama3.2-1b.f16"
fi
timeout 60 python3 xtask/shapes/make_shape.py --shape smollm2-135m --quant "$Q1" \
  --tokenizer-from "$B/smollm2-tokenizer.gguf" --out $M "${QUANT[@]}" 2>&1 | tail -2
want llama || want batch || want long || want alt || want stacks || want kvb || want layouts || want profile || want host || want decode || want kernels && timeout 150 python3 xtask/shapes/make_shape.py --shape llama3.2-1b --quant "$Q2" \
  --tokenizer-from "$B/smollm2-tokenizer.gguf" --out $M "${QUANT[@]}" 2>&1 | tail -2
ls -la $M

step "llama.cpp CUDA: prefill 4,096, decode after 4,096, 1 and 16 sequences"
[ -x $LLAMA/llama-bench ] && want llama || { echo "skipped (no llama.cpp in the bundle, or not asked)"; MODELS_LLAMA=; }
for m in ${MODELS_LLAMA-$MODELS}; do
  timeout 60 "$B/llama/bin/llama-bench" -m $M/$m.gguf -ngl 99 -fa 1 -p 4096 -n 128 -r 3 -o md 2>&1 | grep -E '^\|'
  timeout 60 "$B/llama/bin/llama-bench" -m $M/$m.gguf -ngl 99 -fa 1 -p 0 -n 64 -d 4096 -r 2 -o md 2>&1 | grep -E '^\|'
  timeout 90 "$B/llama/bin/llama-batched-bench" -m $M/$m.gguf -ngl 99 -fa 1 -c 20000 -npp 512 -ntg 128 \
    -npl 1,16 2>&1 | grep -E '^\|'
done

Q=bench/results/2026-11-26-gpu
replay() { # model tag dtype requests [extra args]
  local m=$1 tag=$2 dtype=$3 req=$4; shift 4
  [ "$(left)" -gt 40 ] || { echo "skipped $tag: out of time"; return; }
  RUST_BACKTRACE=1 timeout $(($(left) - 20)) "${KVB_BIN:-$B/kvb}" replay --model $M/$m.gguf --backend cuda \
    --dtype $dtype --requests $Q/$req --out $R/$m-$tag.jsonl --summary $R/$m-$tag.summary.json \
    "$@" 2> $R/$m-$tag.stderr
  grep -v '^\s*$' $R/$m-$tag.stderr | tail -3
  python3 - "$R/$m-$tag.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"  {r['id']:>8} prompt {r['prompt_tokens']:>5} cached {r['cached_tokens']:>5} "
          f"ttft {r['ttft_ms']:9.1f} ms  decode {r['tokens_per_sec']:7.1f} tok/s  per step: "
          f"{r.get('launches_per_decode_step', 0):.0f} launches "
          f"{r.get('uploads_per_decode_step', 0):.1f} uploads {r.get('reads_per_decode_step', 0):.1f} "
          f"reads {r.get('read_bytes_per_decode_step', 0):.0f} B")
EOF
}

SMALL=${MODELS%% *}
if want diag; then
step "diagnosis: the compile request (653 tokens) in f16, bf16, f16 on the reference ops"
head -1 $Q/requests-4096.jsonl > /tmp/compile.jsonl
cp /tmp/compile.jsonl $Q/diag-compile.jsonl
replay $SMALL diag-f16 f16 diag-compile.jsonl --mode baseline
replay $SMALL diag-bf16 bf16 diag-compile.jsonl --mode baseline
KVB_ATTN=reference replay $SMALL diag-f16-reference f16 diag-compile.jsonl --mode baseline
replay $SMALL diag-f16-slices256 f16 diag-compile.jsonl --mode baseline --max-batch-tokens 256
grep -h -B2 -A12 'panicked\|Error\|error' $R/*diag*.stderr | head -60
fi
if want kvb; then
step "kvb CUDA: cold prefill of 4,085 tokens and decode after it (baseline mode)"
for m in $MODELS; do replay $m f16-4096 f16 requests-4096.jsonl --mode baseline; done
step "kvb CUDA: warm TTFT (the same document, new questions)"
for m in $MODELS; do replay $m f16-warm f16 requests-warm.jsonl; done
step "kvb CUDA: 1 and 16 clients"
for m in $MODELS; do
  for c in 1 16; do replay $m f16-clients$c f16 requests-concurrency-$c.jsonl --max-new-tokens 48; done
  grep -h aggregate_decode $R/$m-f16-clients*.summary.json
done
fi
if want layouts; then
step "kvb CUDA: decode after 4,085 tokens with weights [out, in] (default) and [in, out]"
for m in $MODELS; do
  replay $m f16-4096 f16 requests-4096.jsonl --mode baseline
  KVB_GPU_WEIGHTS=in-out replay $m f16-4096-in-out f16 requests-4096.jsonl --mode baseline
done
fi
if want profile; then
step "device time per kernel over a short generation (CubeCL's profiler: each launch waits)"
mkdir -p /tmp/profile && cd /tmp/profile
printf '[profiling.logger]\nlevel = "basic"\nfile = "/tmp/profile/log"\n' > cubecl.toml
for m in $MODELS; do
  : > log
  timeout 90 "$B/kvb" generate --model $M/$m.gguf --backend cuda --dtype f16 \
    --prompt "The history of the city" --max-new-tokens 24 > /dev/null 2> $R/profile-$m.stderr
  python3 "$OLDPWD/bench/gpu/profile_summary.py" log > $R/profile-$m.md
  echo "$m"; head -22 $R/profile-$m.md
done
cd - > /dev/null
fi
if want long; then
step "kvb CUDA: cold prefill of 4,085 tokens and decode after it, each shape"
for m in $MODELS; do replay $m f16-4096 f16 requests-4096.jsonl --mode baseline; done
fi
if want decode; then
step "kvb CUDA, the larger shape: 1 and 16 clients"
BIG=${MODELS##* }
for c in 1 16; do replay $BIG f16-clients$c f16 requests-concurrency-$c.jsonl --max-new-tokens 48; done
grep -h aggregate_decode $R/$BIG-f16-clients*.summary.json
fi
if want host; then
step "host threads while the 1B shape decodes 400 tokens (CPU share per thread, per second)"
BIG=${MODELS##* }
timeout 90 python3 bench/gpu/thread_load.py "$B/kvb" generate --model $M/$BIG.gguf --backend cuda \
  --dtype f16 --prompt "The history of the city" --max-new-tokens 400 2>&1 | tail -12
if command -v nsys > /dev/null; then
  step "nsys: device kernels and CUDA calls over 64 decode steps"
  timeout 120 nsys profile -t cuda --stats=true -o /tmp/kvb-nsys -f true "$B/kvb" generate \
    --model $M/$BIG.gguf --backend cuda --dtype f16 --prompt "The history of the city" \
    --max-new-tokens 64 2>&1 | grep -v '^\s*$' | head -80
else
  echo "no nsys; $(ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' ')"; command -v perf gdb || true
fi
fi
if want stacks; then
step "host stacks while the 1B shape decodes (a debugger's samples; no perf here)"
BIG=${MODELS##* }
# WARMUP covers loading and the first compile; STACK_BINS names the kvb builds to sample.
for bin in ${STACK_BINS:-kvb}; do
  [ -x "$B/$bin" ] || continue
  echo "### $bin"
  PATH=$PATH:/usr/local/cuda/bin WARMUP=${WARMUP:-30} SAMPLES=${SAMPLES:-10} timeout 150 \
    python3 bench/gpu/stack_samples.py "$B/$bin" generate --model $M/$BIG.gguf --backend cuda \
    --dtype f16 --prompt "The history of the city" --max-new-tokens 5000 2>&1 | tee $R/stacks-$bin-$BIG.txt | head -60
done
fi
if want batch; then
step "kvb CUDA, the larger shape: 1 and 16 sequences decoding together (128 tokens, two rounds)"
BIG=${MODELS##* }
QB=bench/results/2026-11-27-gpu-decode
for bin in ${BATCH_BINS:-kvb}; do  # kvb-alt: the bundle's second kvb
  [ -x "$B/$bin" ] || continue
  for c in 1 16; do KVB_BIN=$B/$bin Q=$QB replay $BIG $bin-batch$c f16 requests-batch-$c.jsonl; done
  python3 - $R/$BIG-$bin-batch1.jsonl $R/$BIG-$bin-batch16.jsonl <<'EOF2'
import json, statistics, sys
rates = []
for path in sys.argv[1:]:
    second = [r for r in map(json.loads, open(path)) if r["id"].endswith("r1")]
    rates.append((len(second), statistics.median(r["tokens_per_sec"] for r in second)))
(n1, one), (n16, each) = rates
print(f"second round: 1 sequence {one:.1f} tok/s; {n16} sequences {each:.1f} each, {each * n16:.0f} aggregate = {each * n16 / one:.1f}x")
EOF2
done
fi
if want alt && [ -x "$B/kvb-alt" ]; then
step "kvb-alt (the bundle's second kvb): decode after 4,085 tokens, and its tokens beside kvb's"
for m in $MODELS; do
  KVB_BIN=$B/kvb-alt replay $m alt-f16-4096 f16 requests-4096.jsonl --mode baseline
  [ -f $R/$m-f16-4096.jsonl ] && python3 - $R/$m-f16-4096.jsonl $R/$m-alt-f16-4096.jsonl <<'EOF3'
import json, sys
kvb, alt = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
same = sum(a.get("token_ids") == b.get("token_ids") for a, b in zip(kvb, alt))
print(f"  token ids equal in {same} of {len(kvb)} requests (kvb, kvb-alt)")
EOF3
done
fi
if want kernels; then
step "device time of each kernel over decode steps of the 1B shape (Nsight Compute), and GPU use"
BIG=${MODELS##* }
# NCU_SKIP passes loading, the prefill and the first steps; NCU_COUNT launches are timed (a
# 1B-shape decode step is ~180).
timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
  --launch-skip ${NCU_SKIP:-3000} --launch-count ${NCU_COUNT:-360} "$B/kvb" generate \
  --model $M/$BIG.gguf --backend cuda --dtype f16 --prompt "The history of the city" \
  --max-new-tokens 40 > $R/ncu-$BIG.csv 2> $R/ncu-$BIG.stderr
tail -2 $R/ncu-$BIG.stderr
python3 bench/gpu/ncu_summary.py $R/ncu-$BIG.csv | tee $R/ncu-$BIG.md | head -40
nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 100 > $R/gpu-use.txt &
SMI=$!
timeout 60 "$B/kvb" generate --model $M/$BIG.gguf --backend cuda --dtype f16 \
  --prompt "The history of the city" --max-new-tokens 1500 > /dev/null 2> $R/gpu-use.stderr
kill $SMI
python3 -c "import statistics,sys; u=[int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]; \
b=[x for x in u if x>0]; print(f'GPU use while decoding: {len(u)} samples, median of the busy ones {statistics.median(b) if b else 0}%, deciles {statistics.quantiles(b, n=10) if len(b)>1 else b}')" $R/gpu-use.txt
fi
if want extra; then
step "kvb CUDA, the default shape: without tensor cores, and f32"
KVB_ATTN=vector replay $SMALL f16-vector-4096 f16 requests-4096.jsonl --mode baseline
replay $SMALL f32-4096 f32 requests-4096.jsonl --mode baseline
fi

if want launches; then
step "kernel launches per decode step (CubeCL's execution log)"
mkdir -p /tmp/launches && cd /tmp/launches && printf '[profiling.logger]\nlevel = "minimal"\nfile = "/tmp/launches/log"\n' > cubecl.toml
for n in 2 10; do
  : > log
  timeout 60 "$B/kvb" generate --model $M/$SMALL.gguf --backend cuda --dtype f16 \
    --prompt "The history of the city" --max-new-tokens $n > /dev/null 2>&1
  echo "max-new-tokens $n: $(wc -l < log) log lines"
done
head -40 log > $R/launch-log-head.txt
cd - > /dev/null
fi

step done
