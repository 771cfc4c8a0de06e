#!/usr/bin/env python3
"""bench-report.py RAW.csv OUTDIR: the medians of scripts/bench.sh's raw rows as
OUTDIR/table.md (ours next to the reference tools, with the ratios and the issue's
goals) and OUTDIR/plot.svg (gnuplot: latency and bandwidth against message size)."""

import csv
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw, out = Path(sys.argv[1]), Path(sys.argv[2])
    values = defaultdict(list)
    rounds = set()
    with raw.open() as f:
        for row in csv.DictReader(f):
            try:
                v = float(row["value"])
            except ValueError:
                print(f"bench-report: unreadable value in {row}", file=sys.stderr)
                return 1
            key = (row["tool"], row["op"], int(row["size"]), row["protection"], row["metric"])
            values[key].append(v)
            rounds.add(row["round"])

    def med(tool, op, size, prot, metric):
        vs = values.get((tool, op, size, prot, metric))
        return statistics.median(vs) if vs else None

    def fmt(x, digits=1):
        return "n/a" if x is None else f"{x:,.{digits}f}"

    def ratio(a, b, pct=False):
        if a is None or b is None or b == 0:
            return "n/a"
        return f"{100 * a / b:.0f}%" if pct else f"{a / b:.2f}x"

    sizes = sorted({k[2] for k in values if k[0] == "ib_send_lat"})
    lines = [f"Medians over {len(rounds)} round(s), one VM boot (qemu TCG: compare ratios, not absolutes).", ""]

    lines += ["### Connection setup, in-process, per connection", "",
              "| | µs per connection | vs cmtime |", "|---|---:|---:|"]
    cm = med("cmtime", "connect", 0, "none", "per_connection_us")
    ours = med("secure-rdma", "connect", 0, "protected", "per_connection_us")
    lines.append(f"| cmtime (rdma_cm: resolve, QP, connect) | {fmt(cm)} | 1.00x |")
    lines.append(f"| secure-rdma (TCP + TLS 1.3 mutual auth, admission, RDMA setup, confirmation) | {fmt(ours)} | {ratio(ours, cm)} |")
    phase = {}
    for name in ["tcp_tls", "admission", "rdma_setup", "confirmation"]:
        phase[name] = med("secure-rdma", f"connect:{name}", 0, "protected", "per_connection_us")
        lines.append(f"| &nbsp;&nbsp;of which {name.replace('_', ' ')} | {fmt(phase[name])} | |")
    # What the RDMA connection costs next to rdma_cm's, TLS aside (the TLS handshake is the
    # floor no rdma_cm connection pays).
    rdma = None if None in phase.values() else phase["admission"] + phase["rdma_setup"] + phase["confirmation"]
    lines.append(f"| secure-rdma without TCP + TLS (admission, RDMA setup, confirmation) | {fmt(rdma)} | {ratio(rdma, cm)} |")
    first = med("secure-rdma", "connect:first", 0, "protected", "per_connection_us")
    lines.append(f"| secure-rdma's first connection (device opened, full TLS handshake; not in the mean) | {fmt(first)} | |")
    # An extra lane on a live session (bench connect --lanes 4): no TCP, TLS or admission.
    lane = med("secure-rdma", "connect:extra_lane", 0, "protected", "per_connection_us")
    if lane is not None:
        lines.append(f"| secure-rdma, one more lane on a live session (its QP, one TLS and one RDMA round trip) | {fmt(lane)} | {ratio(lane, cm)} |")
    # The warm path (both ends --warm-pool 8, bench connect --warm): resources made ahead.
    warm = med("secure-rdma", "connect:warm", 0, "protected", "per_connection_us")
    warm_tls = med("secure-rdma", "connect:warm_tcp_tls", 0, "protected", "per_connection_us")
    warm_rdma = med("secure-rdma", "connect:warm_after_tls", 0, "protected", "per_connection_us")
    warm_lane = med("secure-rdma", "connect:warm_extra_lane", 0, "protected", "per_connection_us")
    if warm is not None:
        lines.append(f"| secure-rdma on the warm path (both ends keep 8 sessions' resources ready) | {fmt(warm)} | {ratio(warm, cm)} |")
        lines.append(f"| &nbsp;&nbsp;of which tcp tls | {fmt(warm_tls)} | {ratio(warm_tls, cm)} |")
        lines.append(f"| &nbsp;&nbsp;of which everything after (admission, RDMA setup, confirmation) | {fmt(warm_rdma)} | {ratio(warm_rdma, cm)} |")
        lines.append(f"| secure-rdma, one more lane on the warm path | {fmt(warm_lane)} | {ratio(warm_lane, cm)} |")
    lines.append("")

    rp = med("rping", "process", 64, "none", "ms")
    sp = med("secure-rdma", "process", 64, "protected", "ms")
    if rp is not None or sp is not None:
        lines += ["### A process per connection (start, connect, one 64-byte message, exit), ms", "",
                  "| | ms per process | vs rping |", "|---|---:|---:|",
                  f"| rping -c -C 1 (rdma_cm connect, 1 ping) | {fmt(rp, 0)} | 1.00x |",
                  f"| secure-client -e 'send …' -e quit (release) | {fmt(sp, 0)} | {ratio(sp, rp)} |", ""]

    for op, ref in [("send", "ib_send_lat"), ("write", "ib_write_lat")]:
        lines += [f"### {op.upper()} latency (half a ping-pong, busy polling), µs", "",
                  f"{ref}'s pong carries SIZE bytes back; ours is the server's 13-byte acknowledgement "
                  "(sealed when protected), so from 4 KiB up ours is about half a transfer shorter: "
                  "compare at 64 B.", "",
                  f"| size | {ref} typical | ours unprotected p50 | ratio | ours protected p50 | ratio |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for s in sizes:
            r = med(ref, op, s, "none", "latency_typical_us")
            u = med("secure-rdma", op, s, "none", "latency_p50_us")
            p = med("secure-rdma", op, s, "protected", "latency_p50_us")
            lines.append(f"| {s} | {fmt(r, 2)} | {fmt(u, 2)} | {ratio(u, r)} | {fmt(p, 2)} | {ratio(p, r)} |")
        lines.append("")

    lines += ["### WRITE bandwidth, MiB/s (ours: a window of 16 acknowledged over RDMA)", "",
              "The server busy-polling (as for the latencies) or event-driven (the default; "
              "ib_write_bw's passive side sleeps too).", "",
              "| size | ib_write_bw | ours unprotected, server busy | event | best of ib_write_bw "
              "| ours protected, server busy | event | best of ib_write_bw |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def best(*xs):
        xs = [x for x in xs if x is not None]
        return max(xs) if xs else None

    for s in sizes:
        r = med("ib_write_bw", "write", s, "none", "bandwidth_mib_s")
        cells = [f"| {s} | {fmt(r)} "]
        for prot in ["none", "protected"]:
            busy = med("secure-rdma", "write", s, prot, "bandwidth_mib_s")
            event = med("secure-rdma", "write:event", s, prot, "bandwidth_mib_s")
            cells.append(f"| {fmt(busy)} | {fmt(event)} | {ratio(best(busy, event), r, True)} ")
        lines.append("".join(cells) + "|")
    lines.append("")

    hold = {k[4]: statistics.median(v) for k, v in values.items() if k[1] == "hold"}
    if hold:
        n = next(k[2] for k in values if k[1] == "hold")
        lines += [f"### {n} sessions held on one secure-server", "",
                  "| established | setup, ms | server KiB per session | client KiB per session |",
                  "|---:|---:|---:|---:|",
                  f"| {fmt(hold.get('established'), 0)} | {fmt(hold.get('setup_ms'), 0)} | "
                  f"{fmt(hold.get('server_rss_per_session_kib'))} | {fmt(hold.get('client_rss_per_session_kib'))} |", ""]

    lines += ["### Process start (`--help`), ms", "", "| binary | ms |", "|---|---:|"]
    for name, label in [("secure-client-dev", "secure-client, dev build with debug info"),
                        ("secure-client-release", "secure-client, release (shipped)"),
                        ("ibv_devinfo", "ibv_devinfo")]:
        lines.append(f"| {label} | {fmt(med(name, 'start', 0, 'none', 'ms'), 0)} |")
    lines.append("")

    # The goals, reached or not, from the same medians.
    goals = []
    if ours and cm:
        goals.append(("setup ≤ 2× cmtime", ours / cm <= 2, ratio(ours, cm)))
    if cm and lane:
        goals.append(("an extra lane on a live session ≤ 1.0× cmtime", lane / cm <= 1.0, ratio(lane, cm)))
    if cm and warm_lane:
        goals.append(("an extra lane on the warm path ≤ 1.0× cmtime", warm_lane / cm <= 1.0, ratio(warm_lane, cm)))
    if cm and warm_rdma:
        goals.append(("a warm session after TCP + TLS ≤ 0.5× cmtime", warm_rdma / cm <= 0.5, ratio(warm_rdma, cm)))
    if 64 in sizes:
        r = med("ib_send_lat", "send", 64, "none", "latency_typical_us")
        u = med("secure-rdma", "send", 64, "none", "latency_p50_us")
        if r and u:
            goals.append(("SEND p50 at 64 B ≤ 1.15× ib_send_lat", u / r <= 1.15, ratio(u, r)))
    if 65536 in sizes:
        r = med("ib_write_bw", "write", 65536, "none", "bandwidth_mib_s")
        u = best(med("secure-rdma", "write", 65536, "none", "bandwidth_mib_s"),
                 med("secure-rdma", "write:event", 65536, "none", "bandwidth_mib_s"))
        if r and u:
            goals.append(("WRITE bandwidth at 64 KiB ≥ 90% of ib_write_bw (the better server mode)", u / r >= 0.9, ratio(u, r, True)))
    if hold:
        goals.append((f"{n} sessions established", hold.get("established") == n, fmt(hold.get("established"), 0)))
    lines += ["### Goals", "", "| goal | reached | measured |", "|---|---|---:|"]
    for g, ok, m in goals:
        lines.append(f"| {g} | {'yes' if ok else '**no**'} | {m} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")

    # Plot data: one file per series, size against the median.
    series = [
        ("lat", "ib_send_lat", "send", "none", "latency_typical_us", "ib\\_send\\_lat"),
        ("lat", "secure-rdma", "send", "none", "latency_p50_us", "SEND, unprotected"),
        ("lat", "secure-rdma", "send", "protected", "latency_p50_us", "SEND, protected"),
        ("lat", "ib_write_lat", "write", "none", "latency_typical_us", "ib\\_write\\_lat"),
        ("lat", "secure-rdma", "write", "none", "latency_p50_us", "WRITE, unprotected"),
        ("lat", "secure-rdma", "write", "protected", "latency_p50_us", "WRITE, protected"),
        ("bw", "ib_write_bw", "write", "none", "bandwidth_mib_s", "ib\\_write\\_bw"),
        ("bw", "secure-rdma", "write", "none", "bandwidth_mib_s", "WRITE, unprotected, server busy"),
        ("bw", "secure-rdma", "write:event", "none", "bandwidth_mib_s", "WRITE, unprotected, server event-driven"),
        ("bw", "secure-rdma", "write", "protected", "bandwidth_mib_s", "WRITE, protected, server busy"),
    ]
    plots = {"lat": [], "bw": []}
    for i, (panel, tool, op, prot, metric, title) in enumerate(series):
        path = out / f"plot-{i}.dat"
        with path.open("w") as f:
            for s in sizes:
                v = med(tool, op, s, prot, metric)
                if v is not None:
                    f.write(f"{s} {v}\n")
        plots[panel].append(f"'{path}' using 1:2 with linespoints title \"{title}\"")
    script = f"""set terminal svg size 1100,450 dynamic font 'sans,11'
set output '{out / "plot.svg"}'
set multiplot layout 1,2 title "secure-rdma vs perftest on Soft-RoCE (one VM run, medians)"
set logscale xy
set xlabel 'message size (bytes)'
set key top left
set grid
set ylabel 'latency, half round trip (µs)'
plot {", ".join(plots["lat"])}
set ylabel 'bandwidth (MiB/s)'
set key top left
plot {", ".join(plots["bw"])}
unset multiplot
"""
    (out / "plot.gp").write_text(script)
    if sizes:
        subprocess.run(["gnuplot", str(out / "plot.gp")], check=True)
    else:
        print("bench-report: no latency or bandwidth rows (--setup-only): no plot", file=sys.stderr)
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
