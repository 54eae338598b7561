#!/bin/bash
# Before (a00511a) vs after (7dbb5e9: PoolBackend, the admission policy, LinearWeight as a
# trait) kvb binaries, alternating.
# Decode on the 1B Q4_K_M shape with f16 and f32 pools; the demo's warm TTFTs on the default model.
M=$HOME/.cache/kvb/shapes/llama3.2-1b.q4_k_m.gguf
P="The history of the railway in northern Europe begins with short lines between mines and ports."
for round in 1 2 3; do
  for bin in /tmp/before/kvb /tmp/after/kvb; do
    for pool in f16 f32; do
      out=$($bin generate --model $M --prompt "$P" --max-new-tokens 48 --pool-dtype $pool 2>&1 >/dev/null | grep -iE "tok/s|tokens/s|decode|ttft" | tr '\n' ' ')
      echo "round $round $(dirname $bin | xargs basename) pool=$pool: $out"
    done
    echo "round $round $(dirname $bin | xargs basename) demo:"
    $bin demo 2>&1 | grep -iE "ttft|turn|moved|ms" | head -20
  done
done
