"""Runs a command and samples its threads' stacks with a debugger (gdb, or CUDA's cuda-gdb where
no plain gdb is installed: the GPU machine has no perf and no nsys), then prints, per busy
thread, the functions its samples stood in: innermost frame, and innermost frame of kvb, burn
or CubeCL, and innermost frame of kvb. Where a decode step's host time goes, when the only tool on the machine is a
debugger. WARMUP seconds before the first sample, SAMPLES samples, GDB the debugger."""
import collections
import os
import re
import shutil
import subprocess
import sys
import time

warmup = float(os.environ.get("WARMUP", "5"))
samples = int(os.environ.get("SAMPLES", "16"))
gdb = os.environ.get("GDB") or next(
    (g for g in ("gdb", "cuda-gdb-minimal", "cuda-gdb") if shutil.which(g)), None
)
if gdb is None:
    sys.exit("no debugger (gdb, cuda-gdb-minimal, cuda-gdb) on PATH")
KVB = re.compile(r"^<?kvb_")
LIBS = re.compile(r"^<?(burn|cubecl|cubek)")
THREAD = re.compile(r'^Thread \d+ .*?"([^"]*)"')
FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(.+?) \(")

proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
time.sleep(warmup)
inner = collections.defaultdict(collections.Counter)
libs = collections.defaultdict(collections.Counter)
kvb = collections.defaultdict(collections.Counter)
taken = collections.Counter()
for _ in range(samples):
    if proc.poll() is not None:
        break
    text = subprocess.run(
        [gdb, "-q", "-batch", "-nx", "-p", str(proc.pid), "-ex", "set pagination off",
         "-ex", "thread apply all bt 40"],
        capture_output=True, text=True, timeout=60,
    ).stdout
    thread, first, lib, mine = None, None, None, None
    for line in text.splitlines() + ["Thread 0 (end) \"\""]:
        t = THREAD.match(line)
        if t:
            if thread is not None:
                taken[thread] += 1
                inner[thread][first or "?"] += 1
                libs[thread][lib or "(none)"] += 1
                kvb[thread][mine or "(none)"] += 1
            thread, first, lib, mine = t.group(1), None, None, None
            continue
        f = FRAME.match(line)
        if f and thread is not None:
            name = re.sub(r"::h[0-9a-f]{16}$", "", f.group(2))[:150]
            first = first or name
            if lib is None and LIBS.match(name):
                lib = name
            if mine is None and KVB.match(name):
                mine = name
    time.sleep(0.2)
proc.kill()
for thread, n in taken.most_common():
    busy = n - sum(c for f, c in inner[thread].items() if re.search(r"futex|nanosleep|epoll|poll \(|__GI___poll|syscall|sched_yield|pthread_cond", f))
    print(f"\n## {thread}: {n} samples, {busy} not parked in a wait")
    print("innermost frames:")
    for f, c in inner[thread].most_common(8):
        print(f"  {c:3}  {f}")
    for what, counts in (("burn / CubeCL", libs), ("kvb", kvb)):
        print(f"innermost {what} frames:")
        for f, c in counts[thread].most_common(12):
            print(f"  {c:3}  {f}")
