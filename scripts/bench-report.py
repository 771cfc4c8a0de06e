#!/usr/bin/env python3
"""bench-report.py RAW.csv OUTDIR: the medians of scripts/bench.sh's raw rows as
OUTDIR/table.md (ours next to the reference tools, with the ratios and the issue's
goals), OUTDIR/plot.svg (gnuplot: latency and bandwidth against message size) and
OUTDIR/setup.svg (connection setup: time per connection and connections per second, against
cmtime's)."""

import csv
import math
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
    out.mkdir(parents=True, exist_ok=True)
    values = defaultdict(list)
    rounds = set()
    ciphers = set()
    with raw.open() as f:
        for row in csv.DictReader(f):
            try:
                v = float(row["value"])
            except ValueError:
                print(f"bench-report: unreadable value in {row}", file=sys.stderr)
                return 1
            # perftest prints "inf" for a typical latency it could not compute (its clock
            # calibration failed under emulation): no measurement, so no ratio and no goal
            # judged from it, rather than a ratio of 0.00x that reads as a goal met.
            if not math.isfinite(v):
                print(f"bench-report: {row['tool']} {row['op']} {row['size']} {row['metric']} "
                      f"was {row['value']}: left out", file=sys.stderr)
                continue
            key = (row["tool"], row["op"], int(row["size"]), row["protection"], row["metric"])
            values[key].append(v)
            rounds.add(row["round"])
            # bench.sh writes the cipher the sessions chose into the cipher rows' unit.
            if row["metric"].startswith("aead_") and " " in row["unit"]:
                ciphers.add(row["unit"].split(" ", 1)[1])

    def med(tool, op, size, prot, metric):
        vs = values.get((tool, op, size, prot, metric))
        return statistics.median(vs) if vs else None

    def fmt(x, digits=1):
        return "n/a" if x is None else f"{x:,.{digits}f}"

    def ratio(a, b, pct=False):
        if a is None or b is None or b == 0:
            return "n/a"
        return f"{100 * a / b:.0f}%" if pct else f"{a / b:.2f}x"

    # Every size any latency or bandwidth row has, ours or the reference's: a reference left out
    # (not finite) leaves its cells n/a, not the size's row.
    sizes = sorted({k[2] for k in values if k[1] in ("send", "write", "write:event") and k[2] > 0})
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
    # The same connections on a server that makes each session's write region with it.
    at_setup = med("secure-rdma", "connect:writes_at_setup", 0, "protected", "per_connection_us")
    at_setup_rdma = med("secure-rdma", "connect:writes_at_setup_after_tls", 0, "protected", "per_connection_us")
    cold_rdma = med("secure-rdma", "connect:cold_after_tls", 0, "protected", "per_connection_us")
    if at_setup is not None:
        lines.append(f"| secure-rdma, each session's write region made with it (`--writes-at-setup`) | {fmt(at_setup)} | {ratio(at_setup, cm)} |")
        lines.append(f"| &nbsp;&nbsp;of which everything after TCP + TLS (on demand, the default: {fmt(cold_rdma)}) | {fmt(at_setup_rdma)} | {ratio(at_setup_rdma, cm)} |")
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
    warm_symmetric = med("secure-rdma", "connect:warm_symmetric_after_tls", 0, "protected", "per_connection_us")
    if warm is not None:
        lines.append(f"| secure-rdma on the warm path (both ends keep 8 sessions' resources ready) | {fmt(warm)} | {ratio(warm, cm)} |")
        lines.append(f"| &nbsp;&nbsp;of which tcp tls | {fmt(warm_tls)} | {ratio(warm_tls, cm)} |")
        lines.append(f"| &nbsp;&nbsp;of which everything after (admission, RDMA setup, confirmation) | {fmt(warm_rdma)} | {ratio(warm_rdma, cm)} |")
        if warm_symmetric is not None:
            lines.append(f"| &nbsp;&nbsp;the same without the early endpoint (`--setup symmetric`: endpoints, ready and confirmed over TLS after the accept) | {fmt(warm_symmetric)} | {ratio(warm_symmetric, cm)} |")
        lines.append(f"| secure-rdma, one more lane on the warm path | {fmt(warm_lane)} | {ratio(warm_lane, cm)} |")
    lines.append("")

    # Connections per second: cmtime issues each step for all of its connections at once;
    # ours one at a time, then several clients in flight at once.
    cm_rate = med("cmtime", "connect", 0, "none", "connections_per_s")
    rates = [(label, med("secure-rdma", op, 0, "protected", "connections_per_s")) for label, op in [
        ("secure-rdma, one connection at a time", "connect"),
        ("secure-rdma, 4 clients in flight at once", "connect:concurrent"),
        ("secure-rdma, 4 clients in flight at once, warm path", "connect:warm_concurrent"),
    ]]
    if cm_rate is not None or any(v is not None for _, v in rates):
        lines += ["### Connections per second, in-process", "",
                  "| | connections/s | vs cmtime |", "|---|---:|---:|",
                  f"| cmtime -c N (rdma_cm, every step issued for all N at once) | {fmt(cm_rate)} | 1.00x |"]
        lines += [f"| {label} | {fmt(v)} | {ratio(v, cm_rate)} |" for label, v in rates]
        conc = med("secure-rdma", "connect:concurrent", 0, "protected", "per_connection_us")
        if conc is not None:
            lines.append(f"| &nbsp;&nbsp;each connection's own time, 4 in flight (µs) | {fmt(conc)} | |")
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
                  f"{ref}'s pong carries SIZE bytes back; ours is the server's 14-byte acknowledgement "
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

    # What protection adds end to end against what its cipher costs alone (seal + open timed in
    # the client's process, same boot, same cipher). A ping-pong's round trip seals and opens
    # the message and the acknowledgement, so half of it pays half of both; a stream of WRITEs
    # pays at most one seal and one open per message (less where the two ends overlap them).
    def per_msg_us(size, mib_s):
        return None if not mib_s else size / (mib_s * 1048576) * 1e6

    def minus(a, b):
        return None if a is None or b is None else a - b

    cost = {}
    if any(k[4] == "aead_seal_open_us" for k in values):
        lines += ["### What protection costs, against its cipher's own cost", "",
                  "Added: protected minus unprotected, end to end. Cipher: seal + open timed in the "
                  "client's process after its run, same boot, same cipher (half of the message's and "
                  "the acknowledgement's for a half round trip; one message's for a stream). A ratio "
                  "near 1.00x means protection costs its cryptography and nothing else. "
                  f"Cipher: {', '.join(sorted(ciphers)) or 'not recorded'}.", "",
                  "| size | SEND latency added, µs | cipher, µs | ratio | WRITE stream: added per message, µs "
                  "| cipher, µs | ratio | cipher ns per byte |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in sizes:
            lat_added = minus(med("secure-rdma", "send", s, "protected", "latency_p50_us"),
                              med("secure-rdma", "send", s, "none", "latency_p50_us"))
            so = med("secure-rdma", "send", s, "protected", "aead_seal_open_us")
            ack = med("secure-rdma", "send", s, "protected", "aead_ack_seal_open_us")
            lat_cipher = None if so is None or ack is None else (so + ack) / 2
            bw = {prot: best(med("secure-rdma", "write", s, prot, "bandwidth_mib_s"),
                             med("secure-rdma", "write:event", s, prot, "bandwidth_mib_s"))
                  for prot in ["none", "protected"]}
            bw_added = minus(per_msg_us(s, bw["protected"]), per_msg_us(s, bw["none"]))
            bw_cipher = med("secure-rdma", "write", s, "protected", "aead_seal_open_us")
            per_byte = None if bw_cipher is None else bw_cipher * 1000 / s
            cost[s] = (lat_added, lat_cipher, bw_added, bw_cipher)

            # Protected faster than unprotected is the run's noise, not a negative cost.
            def cost_ratio(added, cipher):
                return "noise (protected was faster)" if added is not None and added < 0 else ratio(added, cipher)

            lines.append(f"| {s} | {fmt(lat_added, 2)} | {fmt(lat_cipher, 2)} | {cost_ratio(lat_added, lat_cipher)} "
                         f"| {fmt(bw_added, 1)} | {fmt(bw_cipher, 1)} | {cost_ratio(bw_added, bw_cipher)} | {fmt(per_byte, 2)} |")
        lines.append("")

    # One row per server the sessions were held on: its own queues per session, then (when
    # measured) one shared receive queue.
    holds = [(op, label, {k[4]: statistics.median(v) for k, v in values.items() if k[1] == op})
             for op, label in [("hold", "a receive queue per session"),
                               ("hold-shared", "one shared receive queue (`--shared-receive-queue 1024`)"),
                               ("hold-shared-at-setup", "the shared queue, each session's write region "
                                                        "made with it (`--writes-at-setup`)")]]
    holds = [(op, label, h) for op, label, h in holds if h]
    hold = holds[0][2] if holds else {}
    if holds:
        n = next(k[2] for k in values if k[1] == holds[0][0])
        lines += [f"### {n} sessions held on one secure-server", "",
                  "| server | established | delivered | setup, ms | server KiB per session "
                  "| kernel slab KiB per session (both ends) | client KiB per session "
                  "| of which rxe's rings | of which anonymous |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for _, label, h in holds:
            lines.append(f"| {label} | {fmt(h.get('established'), 0)} | {fmt(h.get('delivered'), 0)} "
                         f"| {fmt(h.get('setup_ms'), 0)} | "
                         f"{fmt(h.get('server_rss_per_session_kib'))} | {fmt(h.get('slab_per_session_kib'))} "
                         f"| {fmt(h.get('client_rss_per_session_kib'))} "
                         f"| {fmt(h.get('client_rdma_queues_per_session_kib'))} "
                         f"| {fmt(h.get('client_anonymous_per_session_kib'))} |")
        lines.append("")

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
    for s, label, i in [(64, "SEND latency at 64 B", 0), (65536, "WRITE bandwidth at 64 KiB", 2)]:
        added, cipher = cost.get(s, (None,) * 4)[i:i + 2]
        if added is not None and cipher:
            goals.append((f"protection adds ≤ 1.25× its cipher's seal + open: {label}",
                          added / cipher <= 1.25, ratio(added, cipher)))
    if hold:
        goals.append((f"{n} sessions established", hold.get("established") == n, fmt(hold.get("established"), 0)))
        if "delivered" in hold:
            goals.append((f"{n} held sessions deliver their message", hold.get("delivered") == n,
                          fmt(hold.get("delivered"), 0)))
        # Issue 22's memory goal, on the better of the servers measured, each of which must
        # also have held and delivered every session for its figure to count. It counts the
        # server's RSS and the kernel's slab growth (measured for both ends at once, so an upper
        # bound of the server's share); rows from before the slab was measured say so.
        counted = [h for _, _, h in holds
                   if "server_rss_per_session_kib" in h and h.get("established") == n
                   and h.get("delivered", n) == n]
        if counted:
            slab = all("slab_per_session_kib" in h for h in counted)
            kib = min(h["server_rss_per_session_kib"] + h.get("slab_per_session_kib", 0) for h in counted)
            what = "RSS + the kernel's slab growth" if slab else "RSS only: no slab measured"
            goals.append((f"≤ 32 KiB of server memory per idle session ({what})", kib <= 32, fmt(kib)))
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
    # The setup tables' plot: per connection against cmtime, and connections per second.
    bars = {
        "us": [("cmtime", cm), ("session", ours), ("lane", lane), ("warm session", warm),
               ("warm, no TLS", warm_rdma), ("warm lane", warm_lane)],
        "rate": [("cmtime", cm_rate)] + [(label, v) for label, v in zip(
            ["1 at a time", "4 in flight", "4 in flight, warm"], (v for _, v in rates))],
    }
    drawn = []
    for panel, rows in bars.items():
        rows = [(label, v) for label, v in rows if v is not None]
        if rows:
            path = out / f"setup-{panel}.dat"
            path.write_text("".join(f'"{label}" {v}\n' for label, v in rows))
            drawn.append((panel, path))
    if drawn:
        titles = {"us": "µs per connection (lower is better)", "rate": "connections per second (higher is better)"}
        panels = "".join(f"""set ylabel '{titles[panel]}'
plot '{path}' using 2:xtic(1) notitle linecolor rgb '#4477aa'
""" for panel, path in drawn)
        (out / "setup.gp").write_text(f"""set terminal svg size 1100,450 dynamic font 'sans,11'
set output '{out / "setup.svg"}'
set multiplot layout 1,{len(drawn)} title "connection setup: secure-rdma vs cmtime (rdma_cm) on Soft-RoCE (one VM run, medians)"
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.8
set yrange [0:*]
set xtics norotate nomirror
set grid ytics
{panels}unset multiplot
""")
        subprocess.run(["gnuplot", str(out / "setup.gp")], check=True)
    print((out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
