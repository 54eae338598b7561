"""Sums CubeCL's profiling log ("| <duration> | <kernel>" per launch) by kernel: a markdown
table of launches, total and mean device time in microseconds, the largest first."""
import collections
import re
import sys

UNIT_US = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
total, count = collections.Counter(), collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\|\s*([0-9.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)", line)
    if m:
        name = m.group(3).strip()[:90]
        total[name] += float(m.group(1)) * UNIT_US[m.group(2)]
        count[name] += 1
print("| kernel | launches | total us | mean us |\n|---|---:|---:|---:|")
for name, t in total.most_common(25):
    print(f"| {name} | {count[name]} | {t:.0f} | {t / count[name]:.1f} |")
print(f"| all | {sum(count.values())} | {sum(total.values()):.0f} | |")
