#!/usr/bin/env bash
# bench-latency.sh - SEND latency at one size, builds of secure-rdma side by side with
# ib_send_lat, in one lab VM boot.
#
# Usage: scripts/bench-latency.sh [--rounds N] [--iters N] [--size BYTES] [--out DIR]
#                                 [NAME=DIR ...]
#   NAME=DIR    a build to measure: DIR holds its secure-server and secure-client (a release
#               build of another commit, say: `git worktree add ../old REV` and
#               `CARGO_TARGET_DIR=../old-target cargo build --release -p secure-rdma-server
#               -p secure-rdma-client` there, then `old=../old-target/release`). Without any,
#               this checkout's release build, built first, is measured as "this".
#   --rounds N  rounds (default 10); each runs ib_send_lat, then every build unprotected and
#               protected, so that drift of the emulated machine hits all of them alike
#   --iters N   ping-pongs per run (default 3000)
#   --size B    message size (default 64)
#   --out DIR   where the results go (default target/bench/latency)
#
# Both ends busy-poll, as ib_send_lat's do: each build's `secure-server --poll busy` against
# its `secure-client bench send --poll busy`. The server end (and ib_send_lat's server) is
# pinned to the VM's vCPU 0 and the client end to vCPU 1 (taskset), so that the two spinning
# ends never share one. Even so a round's p50 varies by up to 2x under emulation from one run
# to the next: hence many short rounds, and their medians. The kernel's clock source is
# recorded at
# each round: the lab VM's kernel often marks the emulated TSC unstable and falls back to the
# HPET, which makes every precise clock read a system call (ib_send_lat reads the TSC itself).
#
# Writes:
#   raw.csv    round,clocksource,tool,protection,p50_us
#   table.md   per build and protection: the median p50 over the rounds, its ratio to
#              ib_send_lat's median, and the range
#   plot.svg   every round's p50 (gnuplot)
# Timings are emulated (qemu TCG): compare the rows with each other, not with hardware.
# Needs perftest and gnuplot (installed if missing).

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=10 ITERS=3000 SIZE=64 OUT=
BUILDS=()
usage() { sed -n '2,/^$/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
number() { [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "bench-latency.sh: $1 takes a positive number, not '${2:-}'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) number "$1" "${2:-}"; ROUNDS=$2; shift 2 ;;
        --iters) number "$1" "${2:-}"; ITERS=$2; shift 2 ;;
        --size) number "$1" "${2:-}"; SIZE=$2; shift 2 ;;
        --out) [ -n "${2:-}" ] || { echo "bench-latency.sh: --out takes a directory" >&2; exit 2; }
               OUT=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *=*)
            name=${1%%=*} dir=$(cd "${1#*=}" 2>/dev/null && pwd) || { echo "bench-latency.sh: no directory ${1#*=}" >&2; exit 2; }
            [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "bench-latency.sh: a build's name is letters, digits, '.', '_' or '-', not '$name'" >&2; exit 2; }
            for b in secure-server secure-client; do
                [ -x "$dir/$b" ] || { echo "bench-latency.sh: $dir has no $b: give a directory with both binaries" >&2; exit 2; }
            done
            BUILDS+=("$name=$dir"); shift ;;
        *) echo "bench-latency.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

need=()
command -v ib_send_lat >/dev/null || need+=(perftest)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
if [ ${#need[@]} -gt 0 ]; then
    echo "bench-latency.sh: installing ${need[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
if [ ${#BUILDS[@]} -eq 0 ]; then
    echo "bench-latency.sh: building this checkout (release)" >&2
    cargo build --release --locked -q -p secure-rdma-server -p secure-rdma-client
    BUILDS=("this=$TARGET/release")
fi
OUT=${OUT:-$TARGET/bench/latency}
mkdir -p "$OUT"
WORK=$(mktemp -d "$TARGET/bench-latency.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
first=${BUILDS[0]#*=}
"$first/secure-server" certs init --dir "$WORK/pki" --san 10.77.0.1 >/dev/null
"$first/secure-server" certs client bench --dir "$WORK/pki" >/dev/null

cat >"$WORK/inside.sh" <<'INNER'
set -euo pipefail
# From the command line: WORK ROUNDS ITERS SIZE BUILDS (NAME=DIR, space-separated)
CS=/sys/devices/system/clocksource/clocksource0/current_clocksource
RAW=$WORK/raw.csv
echo "round,clocksource,tool,protection,p50_us" >"$RAW"
port=4900
servers=()
for b in $BUILDS; do
    port=$((port + 1))
    taskset -c 0 "${b#*=}/secure-server" --listen 10.77.0.1:$port --certs "$WORK/pki" \
        --max-clients 4 --allow-unprotected --poll busy >"$WORK/server-${b%%=*}.log" 2>&1 &
    servers+=($!)
done
port=4900
for b in $BUILDS; do
    port=$((port + 1))
    for _ in $(seq 300); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
done
PT=18700
for r in $(seq "$ROUNDS"); do
    echo "bench-latency: round $r/$ROUNDS" >&2
    PT=$((PT + 1))
    taskset -c 0 ib_send_lat -d rxe-a -x 1 -F -p $PT -s "$SIZE" -n "$ITERS" >"$WORK/pt.srv" 2>&1 &
    srv=$!
    sleep 0.5
    p50=$(taskset -c 1 ib_send_lat -d rxe-b -x 1 -F -p $PT -s "$SIZE" -n "$ITERS" 10.77.0.1 \
        | awk -v s="$SIZE" '$1 == s && NF >= 5 { print $5; exit }')
    wait $srv || true
    echo "$r,$(cat $CS),ib_send_lat,none,$p50" >>"$RAW"
    for prot in none protected; do
        flag=()
        [ $prot = none ] && flag=(--no-payload-protection)
        port=4900
        for b in $BUILDS; do
            port=$((port + 1))
            j=$(taskset -c 1 "${b#*=}/secure-client" 10.77.0.1 --port $port --certs "$WORK/pki" \
                --name bench --timeout 30 "${flag[@]}" bench send -s "$SIZE" -n "$ITERS" --poll busy --json)
            echo "$r,$(cat $CS),${b%%=*},$prot,$(jq .latency_us.p50 <<<"$j")" >>"$RAW"
        done
    done
done
kill -INT "${servers[@]}" 2>/dev/null || true
wait || true
INNER

echo "bench-latency.sh: $ROUNDS round(s) of $ITERS ping-pongs at $SIZE B in the VM: ${BUILDS[*]}" >&2
VM_TIMEOUT=${VM_TIMEOUT:-3600} bash "$ROOT/scripts/softroce-vm.sh" \
    "env WORK=$WORK ROUNDS=$ROUNDS ITERS=$ITERS SIZE=$SIZE BUILDS='${BUILDS[*]}' bash $WORK/inside.sh"
cp "$WORK/raw.csv" "$OUT/raw.csv"

python3 - "$OUT" "$SIZE" <<'REPORT'
import csv, statistics, sys
out, size = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(f"{out}/raw.csv")))
runs, by_source = {}, {}
for r in rows:
    if r["p50_us"] not in ("", "null"):
        runs.setdefault((r["tool"], r["protection"]), []).append(float(r["p50_us"]))
        by_source.setdefault((r["tool"], r["protection"], r["clocksource"]), []).append(float(r["p50_us"]))
sources = sorted({r["clocksource"] for r in rows})


def cell(v, ref):
    """The median of `v` and its ratio to `ref`'s median; a dash without rounds."""
    if not v or not ref:
        return "-"
    m = statistics.median(v)
    return f"{m:.2f} ({m / statistics.median(ref):.2f}x, {len(v)})"


lines = [f"#### SEND latency at {size} B, both ends busy polling, pinned (median of the rounds' p50, µs)", "",
         "Each cell: the median p50, its ratio to ib_send_lat's median over the same rounds, and the",
         "rounds. A precise clock read is a system call while the kernel's clock source is the HPET.", "",
         "| | protection | all rounds | range | " + " | ".join(f"rounds on {c}" for c in sources) + " |",
         "|---|---|---:|---|" + "---:|" * len(sources)]
for (tool, prot), v in runs.items():
    per = [cell(by_source.get((tool, prot, c), []), by_source.get(("ib_send_lat", "none", c), [])) for c in sources]
    lines.append(f"| {tool} | {prot} | {cell(v, runs[('ib_send_lat', 'none')])} | {min(v):.1f}-{max(v):.1f} | " + " | ".join(per) + " |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
# The plot: one series per tool and protection, its rounds' p50 in turn (inline data blocks).
gp = ['set terminal svg size 800,450', f'set output "{out}/plot.svg"',
      f'set title "SEND {size} B: each round\'s p50 (both ends busy polling, pinned)"',
      'set xlabel "round"', 'set ylabel "half round trip, us"', 'set key outside right']
plots = []
for i, ((tool, prot), v) in enumerate(runs.items()):
    gp.append(f"$s{i} << EOD")
    gp += [f"{n + 1} {x}" for n, x in enumerate(v)]
    gp.append("EOD")
    plots.append(f'$s{i} with linespoints title "{tool} {prot}"')
gp.append("plot " + ", ".join(plots))
open(f"{out}/plot.gp", "w").write("\n".join(gp) + "\n")
print("\n".join(lines))
REPORT
gnuplot "$OUT/plot.gp"
rm -f "$OUT/plot.gp"
echo "bench-latency.sh: $OUT/raw.csv, $OUT/table.md, $OUT/plot.svg" >&2
