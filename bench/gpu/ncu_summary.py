"""Device time per kernel from Nsight Compute's CSV (`ncu --metrics gpu__time_duration.sum --csv`):
launches, total and mean microseconds per kernel name, and the sum over all launches."""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"]
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "ns": 1e-3, "us": 1.0, "ms": 1e3}
by_name = defaultdict(list)
for r in rows:
    us = float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1e-3)
    by_name[r["Kernel Name"].split("(")[0][:70]].append(us)
total = sum(sum(v) for v in by_name.values())
print(f"{len(rows)} launches, {total:.0f} us of device time in all\n")
print("| kernel | launches | total us | mean us | share |\n|---|---:|---:|---:|---:|")
for name, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
    print(f"| `{name}` | {len(v)} | {sum(v):.0f} | {sum(v) / len(v):.1f} | {sum(v) / total:.0%} |")
