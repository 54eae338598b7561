"""Runs a command and prints, every interval, the CPU share of each of its threads (from
/proc/<pid>/task/*/stat): whether a GPU decode's host side is one busy thread (bound by the
host) or threads that mostly wait (bound by the device)."""
import os
import subprocess
import sys
import time

interval = float(os.environ.get("INTERVAL", "1.0"))
tick = os.sysconf("SC_CLK_TCK")
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)


def sample():
    out = {}
    base = f"/proc/{proc.pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        fields = s[s.rindex(")") + 2 :].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


t0 = time.time()
prev = sample()
while proc.poll() is None:
    time.sleep(interval)
    try:
        now = sample()
    except OSError:
        break
    busy = []
    for tid, (name, cpu) in now.items():
        share = (cpu - prev.get(tid, (name, 0.0))[1]) / interval
        if share >= 0.05:
            busy.append(f"{name}/{tid} {share:.0%}")
    print(f"{time.time() - t0:6.1f} s  " + ("  ".join(busy) or "(idle)"), flush=True)
    prev = now
sys.exit(proc.wait())
