"""Where a traced tune's timing went (run.sh step 1): per group and mode, the coordinator's
request time less the worker's own (set-up and samples), split into each (backend, size)'s
first request, which verifies it first (coordinator/measure.rs verify_timed), and the rest
(the request's round trip); then per group and backend, the requests' total.
Usage: python3 where.py traced.txt (or: xz -dc traced.txt.xz | python3 where.py -)"""
import collections, re, sys
f = sys.stdin if sys.argv[1] == "-" else open(sys.argv[1], errors="replace")
grp, w, seen = 0, None, set()
first, rest, n1, n2 = (collections.Counter() for _ in range(4))
total = collections.Counter()
for l in f:
    l = re.sub(r"\x1b\[[0-9;]*m", "", l)
    if "set up and connected" in l:
        grp += 1
    m = re.search(r"worker (\S+) (\d+) (\w+) (\d+)x(\d+): set-up ([\d.]+) ms, samples ([\d.]+) ms wall", l)
    if m:
        w = float(m[6]) + float(m[7])
        continue
    m = re.search(r"request (\S+) (\d+) (\w+) (\d+)x(\d+): ([\d.]+) ms", l)
    if m and w is not None:
        gap, key = float(m[6]) - w, (grp, m[1], int(m[2]), m[3])
        total[(grp, m[1], m[3])] += float(m[6])
        if key not in seen:
            seen.add(key); first[(grp, m[3])] += gap; n1[(grp, m[3])] += 1
        else:
            rest[(grp, m[3])] += gap; n2[(grp, m[3])] += 1
        w = None
print("group, mode: first requests (verification) n, ms | other requests n, ms over the worker's")
for k in sorted(first):
    print(f"{k}: {n1[k]} {first[k]:.0f} | {n2[k]} {rest[k]:.0f}")
print(f"all first requests {sum(first.values()):.0f} ms, all others {sum(rest.values()):.0f} ms")
for g in sorted({k[0] for k in total}):
    print(f"group {g}:", ", ".join(f"{b} {m} {v:.0f}" for (gg, b, m), v in sorted(total.items()) if gg == g))
