#!/usr/bin/env python3
"""redis-benchmark from c1 through the VIP (the splice), through nutcracker (on c1, with
`redis: true`), and to one redis-server directly, on a testbed built with
`kvswitch testbed up --redis`: GET and SET at pipeline depths 1 and 16, 16 connections,
100,000 random keys, targets in rotating order, medians of the rounds; the CPU time of the
kvswitch and nutcracker processes per request, from /proc. Needs root.

Usage: bench-redis-vip.py STATE_JSON [ROUNDS] [REQUESTS]
  STATE_JSON  the path `kvswitch testbed up --redis` prints
  ROUNDS      default 3
  REQUESTS    per test at depth 16 (a quarter of it at depth 1), default 100000"""
import json, os, re, statistics, subprocess, sys

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) > 1 else 2)
state = json.load(open(sys.argv[1]))
if not state.get("redis"):
    sys.exit(f"{sys.argv[1]}: not a Redis testbed (kvswitch testbed up --redis)")
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
n = int(sys.argv[3]) if len(sys.argv) > 3 else 100000
hz = os.sysconf("SC_CLK_TCK")
kvs = next(p["pid"] for p in state["procs"] if p["what"] == "kvswitch")
nut = next((p["pid"] for p in state["procs"] if "nutcracker" in p["what"]), None)
c1 = next(h for h in state["hosts"] if h["name"] == "c1")["netns"]
s1 = next(h for h in state["hosts"] if h["name"] == "s1")["ip"]
vip = state["vip"]

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz

targets = [("kvswitch VIP (splice)", vip, 6379), ("nutcracker", "127.0.0.1", 22121), ("redis-server direct", s1, 6379)]
rows = {}
for r in range(rounds):
    order = targets[r % 3:] + targets[:r % 3]
    for name, host, port in order:
        for pipe in (1, 16):
            before = (cpu(kvs), cpu(nut) if nut else 0)
            out = subprocess.run(["ip", "netns", "exec", c1, "redis-benchmark", "-h", host, "-p", str(port),
                                  "-t", "get,set", "-n", str(n if pipe == 16 else n // 4), "-c", "16", "-P", str(pipe),
                                  "-r", "100000", "-q"], capture_output=True, text=True).stdout.replace("\r", "\n")
            after = (cpu(kvs), cpu(nut) if nut else 0)
            reqs = 2 * (n if pipe == 16 else n // 4)
            for line in out.splitlines():
                m = re.match(r"(GET|SET): ([\d.]+) requests per second", line)
                if m:
                    rows.setdefault((name, m.group(1), pipe), []).append(float(m.group(2)))
            rows.setdefault((name, "cpu_kvs", pipe), []).append((after[0] - before[0]) / reqs * 1e6)
            rows.setdefault((name, "cpu_nut", pipe), []).append((after[1] - before[1]) / reqs * 1e6)
print(f"{'target':24} {'P':>3} {'GET/s':>10} {'SET/s':>10} {'kvswitch us/req':>16} {'nutcracker us/req':>18}")
for name, _, _ in targets:
    for pipe in (1, 16):
        med = lambda k: statistics.median(rows.get((name, k, pipe), [0]))
        print(f"{name:24} {pipe:>3} {med('GET'):>10.0f} {med('SET'):>10.0f} {med('cpu_kvs'):>16.2f} {med('cpu_nut'):>18.2f}")
