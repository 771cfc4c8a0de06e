#!/usr/bin/env bash
# bench-telemetry.sh - what rdma-monitor's probes cost, side by side in one VM run.
#
# Builds verbs-bench and rdma-monitor (release), then inside the Soft-RoCE VM
# runs verbs-bench ROUNDS times in each of three modes, interleaved so that
# drift of the emulated machine hits all modes alike:
#   none      no probes
#   counters  rdma-monitor attached, counting only (no per-call events)
#   events    rdma-monitor attached with --events (one ring-buffer record per call)
# and writes a Markdown table of the medians to OUT (default: stdout).
#
# Usage: scripts/bench-telemetry.sh [--rounds N] [--qp-cycles N] [--round-trips N] [--out FILE]
# Timings are emulated (qemu TCG): compare the rows with each other, not with
# hardware.

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=3 QP_CYCLES=300 ROUND_TRIPS=2000 OUT=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --qp-cycles) QP_CYCLES=$2; shift 2 ;;
        --round-trips) ROUND_TRIPS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "bench-telemetry.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$ROUNDS" "$QP_CYCLES" "$ROUND_TRIPS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench-telemetry.sh: $n is not a positive integer" >&2; exit 2; }
done

cd "$ROOT"
echo "bench-telemetry.sh: building (release)" >&2
cargo build --release --locked -q -p secure-rdma-tests --bin verbs-bench -p rdma-monitor --bin rdma-monitor
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
RESULTS=$(mktemp -d "$ROOT/target/bench.XXXXXX")
trap 'rm -rf "$RESULTS"' EXIT

inside=$(cat <<INNER
set -e
run() { # mode round
    case \$1 in
        none) ;;
        counters) $BIN/rdma-monitor --interval 3600 >/dev/null 2>$RESULTS/mon.err & m=\$! ;;
        events) $BIN/rdma-monitor --interval 3600 --events >/dev/null 2>$RESULTS/mon.err & m=\$! ;;
    esac
    if [ "\$1" != none ]; then
        for i in \$(seq 600); do grep -q 'hooks attached' $RESULTS/mon.err 2>/dev/null && break; sleep 0.1; done
        grep -q 'hooks attached' $RESULTS/mon.err || { cat $RESULTS/mon.err >&2; exit 1; }
    fi
    $BIN/verbs-bench --qp-cycles $QP_CYCLES --round-trips $ROUND_TRIPS > $RESULTS/\$1.\$2.json
    if [ "\$1" != none ]; then kill -INT \$m; wait \$m || true; rm -f $RESULTS/mon.err; fi
}
for r in \$(seq $ROUNDS); do
    for mode in none counters events; do run \$mode \$r; done
done
INNER
)
echo "bench-telemetry.sh: $ROUNDS rounds x 3 modes in the VM" >&2
VM_RW="$RESULTS" bash scripts/softroce-vm.sh "$inside"

table=$(/usr/bin/python3 - "$RESULTS" "$ROUNDS" <<'PY'
import json, statistics, sys, pathlib
d, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
rows = {}
for mode in ["none", "counters", "events"]:
    runs = [json.loads((d / f"{mode}.{r}.json").read_text()) for r in range(1, rounds + 1)]
    rows[mode] = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
base = rows["none"]
def rel(mode, key):
    return "" if mode == "none" else f" ({(rows[mode][key] / base[key] - 1) * 100:+.1f}%)"
print("| probes | QP create+destroy /s | SEND round trips /s | RTT mean µs | RTT p50 µs | RTT p99 µs |")
print("|---|---|---|---|---|---|")
for mode, label in [("none", "none"), ("counters", "rdma-monitor (counters)"), ("events", "rdma-monitor --events")]:
    r = rows[mode]
    print(f"| {label} | {r['qp_cycles_per_s']:.0f}{rel(mode, 'qp_cycles_per_s')} | {r['round_trips_per_s']:.0f}{rel(mode, 'round_trips_per_s')} "
          f"| {r['rtt_us_mean']:.1f} | {r['rtt_us_p50']:.1f} | {r['rtt_us_p99']:.1f} |")
print(f"\nMedians of {rounds} interleaved rounds; {base['qp_cycles']:.0f} QP cycles and {base['round_trips']:.0f} 64-byte round trips per run; qemu TCG, Soft-RoCE rxe-a <-> rxe-b.")
PY
)
if [ -n "$OUT" ]; then printf '%s\n' "$table" > "$OUT"; echo "bench-telemetry.sh: wrote $OUT" >&2; fi
printf '%s\n' "$table"
