#!/usr/bin/env bash
# bench.sh - secure-rdma side by side with the reference tools, in one lab VM boot.
#
# Builds the release secure-server and secure-client, then inside the Soft-RoCE VM
# (scripts/softroce-vm.sh: rxe-a 10.77.0.1 serves, rxe-b 10.77.0.2 connects) runs
# ROUNDS rounds, each of them interleaving, so that drift of the emulated machine
# hits every tool alike:
#   setup      cmtime -c N (rdma_cm, in-process)  vs  secure-client bench connect -n N
#              (per connection, and connections per second: ours also with 4 clients
#              in flight at once, cold and warm; cmtime issues each step for all N at
#              once, and Debian's cmtime (rdma-core 44) has no threads of its own; ours
#              also against a server with --writes-at-setup, what a write region made
#              with every session costs its setup; and the warm connections again without
#              the early endpoint, --setup symmetric)
#   process    rping -c -C 1 (a process: rdma_cm connect + 1 ping)  vs  secure-client
#              -e 'send ping' -e quit (a process: TLS, RDMA setup, 1 send acknowledged)
#   latency    ib_send_lat / ib_write_lat -s SIZE  vs  bench send / bench write -s SIZE
#              (half a ping-pong, both ends busy polling; ours with payload
#              protection on and off)
#   bandwidth  ib_write_bw -s SIZE                 vs  bench write -s SIZE (window 16,
#              against the busy-polling server and an event-driven one: ib_write_bw's
#              passive side sleeps)
# for SIZE in 64 B, 4 KiB, 64 KiB and 1 MiB; then, once, bench hold -n HOLD on a
# secure-server --max-clients HOLD (memory per session on both ends), again on one with
# --shared-receive-queue 1024 from a client with its own shared queue (no receive queue or CQ per
# session on either end), and the start
# time of `secure-client --help` for the dev build (42 MB, debug info) and the
# shipped release build, next to ibv_devinfo.
#
# Writes under target/bench/ (or --out DIR):
#   raw.csv     every measurement: round,tool,op,size,protection,metric,value,unit
#   table.md    medians over the rounds, ours next to the reference, the ratios
#   plot.svg    latency and bandwidth against size (gnuplot)
#
# Each protected `bench send|write` also times its cipher alone (seal + open of the size
# and of the acknowledgement, in the same process): table.md sets what protection adds
# end to end against that, so the part of protection that is not cryptography shows.
#
# Usage: scripts/bench.sh [--rounds N] [--hold N] [--quick] [--setup-only] [--hold-only]
#                         [--hold-queues per-session|shared|both]
#                         [--hold-writes on-demand|at-setup|both] [--cpu MODEL] [--out DIR]
#   --quick       1 round, small counts, no hold: a smoke test of the script (minutes)
#   --setup-only  the connection setup rows only (cmtime, a new connection, an extra lane,
#                 the warm path), no hold
#   --hold-only   the two holds only (a receive queue per session, then the shared queue):
#                 `--hold-only --hold 10000` measures the memory per session at scale
#   --hold-queues  which holds: per-session (a receive queue and CQs per session), shared
#                 (both ends on shared queues), or both (the default). Past about 30,000
#                 sessions only the shared one fits: `--hold-only --hold 50000 --hold-queues
#                 shared` is issue 22's hold
#   --hold-writes  when the shared hold's server makes each session's write region: when its
#                 client first asks (on-demand, the default: the held sessions only SEND, so
#                 they hold none), with the session (at-setup: --writes-at-setup), or both, one
#                 after the other in the same VM boot, to measure what an idle region costs
#   --cpu MODEL   the VM's qemu CPU model (default Nehalem: no AES-NI, so sessions use
#                 ChaCha20-Poly1305; Westmere adds AES-NI and PCLMULQDQ, so AES-256-GCM);
#                 compare the two runs through their ratios to the perftest rows of each
# A hold above about 16,000 sessions outgrows Linux's default vm.max_map_count (65,530
# mappings per process; rxe maps each CQ and QP queue, about 4 per session, and the
# client holds all its sessions in one process): the VM raises it, the open-file limit
# (about 3 descriptors per session per end) and the ephemeral port range, and boots
# with VM_MEM = 2 GiB + 400 KiB per held session (both ends; 200 KiB when only the shared
# hold runs) unless VM_MEM is set. Each hold reports the server's RSS per session and the
# kernel's slab growth per session (both ends: one kernel serves them; an upper bound for the
# server's share); issue 22's memory goal counts the two together.
# Timings are emulated (qemu TCG): compare the rows with each other, not with
# hardware. Needs perftest, rdmacm-utils and gnuplot (installed if missing).

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=3 HOLD=1000 QUICK=0 SETUP_ONLY=0 HOLD_ONLY=0 HOLD_QUEUES=both HOLD_WRITES=on-demand OUT=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --hold) if [ $# -lt 2 ] || ! [[ $2 =~ ^[0-9]+$ ]]; then
                    echo "bench.sh: --hold needs a number of sessions (0 for none)" >&2; exit 2
                fi
                HOLD=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --setup-only) SETUP_ONLY=1; shift ;;
        --hold-only) HOLD_ONLY=1 ROUNDS=1; shift ;;
        --hold-queues) if [ $# -lt 2 ] || ! [[ $2 =~ ^(per-session|shared|both)$ ]]; then
                           echo "bench.sh: --hold-queues needs per-session, shared or both" >&2; exit 2
                       fi
                       HOLD_QUEUES=$2; shift 2 ;;
        --hold-writes) if [ $# -lt 2 ] || ! [[ $2 =~ ^(on-demand|at-setup|both)$ ]]; then
                           echo "bench.sh: --hold-writes needs on-demand, at-setup or both" >&2; exit 2
                       fi
                       HOLD_WRITES=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --cpu) if [ $# -lt 2 ] || ! [[ $2 =~ ^[A-Za-z0-9_.-]+$ ]]; then
                   echo "bench.sh: --cpu needs a qemu CPU model name (Nehalem, Westmere, ...)" >&2; exit 2
               fi
               export VM_CPU=$2; shift 2 ;;
        # The help is the header comment, up to its first line that is not one.
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [ "$HOLD_ONLY" = 1 ] && { [ "$SETUP_ONLY" = 1 ] || [ "$HOLD" = 0 ]; }; then
    echo "bench.sh: --hold-only needs a hold (--hold N, N > 0) and no --setup-only" >&2
    exit 2
fi
for n in "$ROUNDS" "$HOLD"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "bench.sh: $n is not a count" >&2; exit 2; }
done
[ "$ROUNDS" -ge 1 ] || { echo "bench.sh: --rounds must be at least 1" >&2; exit 2; }
cd "$ROOT"
OUT=${OUT:-$ROOT/target/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

need=()
command -v ib_send_lat >/dev/null || need+=(perftest)
command -v cmtime >/dev/null || need+=(rdmacm-utils)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
command -v jq >/dev/null || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
    echo "bench.sh: installing ${need[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

echo "bench.sh: building (release, and the dev build for the --help comparison)" >&2
cargo build --release --locked -q -p secure-rdma-server -p secure-rdma-client
cargo build --locked -q -p secure-rdma-client
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release
DEV=$TARGET/debug
WORK=$(mktemp -d "$TARGET/bench-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
chmod 755 "$WORK"
# Certificates for 10.77.0.1, a client identity "bench".
"$BIN/secure-server" certs init --dir "$WORK/pki" --san 10.77.0.1 >/dev/null
"$BIN/secure-server" certs client bench --dir "$WORK/pki" >/dev/null

if [ "$QUICK" = 1 ]; then
    ROUNDS=1 HOLD=0 CONNS=5 PROCS=2
    SIZES="64:200 65536:50"
else
    CONNS=20 PROCS=5
    SIZES="64:1000 4096:1000 65536:200 1048576:50"
fi
[ "$SETUP_ONLY" = 1 ] && HOLD=0

cat >"$WORK/inside.sh" <<'INNER'
set -euo pipefail
# Variables come from the environment: BIN DEV WORK ROUNDS HOLD CONNS PROCS SIZES SETUP_ONLY
# HOLD_ONLY HOLD_QUEUES HOLD_WRITES
RAW=$WORK/raw.csv
echo "round,tool,op,size,protection,metric,value,unit" >"$RAW"
row() { echo "$1,$2,$3,$4,$5,$6,$7,$8" >>"$RAW"; }
CLIENT=("$BIN/secure-client" 10.77.0.1 --port 4800 --certs "$WORK/pki" --name bench --timeout 30)
PORT=18600
# Clients in flight at once for the concurrent setup rows (the connection server allows 16
# pending per address, the warm one 8).
CONC=4

# Waits until something listens on TCP port $1 (a server started in the background).
listening() {
    for _ in $(seq 300); do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        sleep 0.1
    done
    echo "bench: nothing listens on port $1" >&2
    return 1
}

# One perftest run: server on rxe-a, client on rxe-b; prints the client's result row.
perftest() { # tool size iters
    PORT=$((PORT + 1))
    timeout 300 "$1" -d rxe-a -x 1 -F -p $PORT -s "$2" -n "$3" >"$WORK/pt.srv" 2>&1 &
    local srv=$!
    listening $PORT
    timeout 300 "$1" -d rxe-b -x 1 -F -p $PORT -s "$2" -n "$3" 10.77.0.1 >"$WORK/pt.cli" 2>&1 || {
        cat "$WORK/pt.cli" "$WORK/pt.srv" >&2; return 1; }
    wait $srv || true
    awk -v s="$2" '$1 == s && NF >= 5 { print; exit }' "$WORK/pt.cli"
}

# cmtime -c N: the sum of its per-connection step averages (us).
cmtime_total() {
    PORT=$((PORT + 1))
    timeout 120 cmtime -b 10.77.0.1 -p $PORT -c "$CONNS" >"$WORK/cm.srv" 2>&1 &
    local srv=$!
    # rdma_cm listens on no TCP port: wait for its listening cm_id instead.
    for _ in $(seq 100); do
        rdma resource show cm_id 2>/dev/null | grep -q "LISTEN.*src-port $PORT" && break
        sleep 0.1
    done
    timeout 120 cmtime -s 10.77.0.1 -p $PORT -c "$CONNS" >"$WORK/cm.cli" 2>&1 || {
        cat "$WORK/cm.cli" >&2; kill $srv 2>/dev/null; return 1; }
    kill $srv 2>/dev/null; wait $srv 2>/dev/null || true
    awk -F: '/^(create id|resolve addr|resolve route|create qp|connect) *:/ { split($2, f, " "); t += f[4] } END { print t }' "$WORK/cm.cli"
}

# One process per connection, as a user runs it: PROCS runs of rping's client against a
# persistent rping server, then PROCS runs of secure-client; prints the median ms of each.
# (rping -s -P serves one client at a time, forever.)
RPING_PORT=18599
process_ms() { # what...
    local times=() t0 t1
    for _ in $(seq "$PROCS"); do
        t0=$(date +%s%N)
        "$@" >/dev/null 2>"$WORK/proc.err" || { cat "$WORK/proc.err" >&2; return 1; }
        t1=$(date +%s%N)
        times+=($(( (t1 - t0) / 1000000 )))
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
timeout 3600 rping -s -P -a 10.77.0.1 -p $RPING_PORT >"$WORK/rping.srv" 2>&1 &
RPING=$!
for _ in $(seq 100); do
    rdma resource show cm_id 2>/dev/null | grep -q "LISTEN.*src-port $RPING_PORT" && break
    sleep 0.1
done

# The data-path server: buffers up to 1 MiB, busy polling like perftest.
"$BIN/secure-server" --listen 10.77.0.1:4800 --certs "$WORK/pki" --max-clients 16 \
    --buffer-size 1048576 --allow-unprotected --poll busy >"$WORK/server.log" 2>&1 &
SERVER=$!
# The connection server: the defaults (4 KiB buffers, event-driven), room for HOLD sessions.
# Past about 16,000 sessions each end runs out of mappings (vm.max_map_count, 65,530 by
# default: `ibv_create_cq` then fails), descriptors and ephemeral ports (see the header).
sysctl -q -w vm.max_map_count=1048576 net.ipv4.ip_local_port_range="1024 65535"
ulimit -n $(( HOLD * 3 + 4096 > 65536 ? HOLD * 3 + 4096 : 65536 ))
MAX=$(( HOLD > 16 ? HOLD : 16 ))
# --idle-timeout: a session opened first waits, idle, until the last is open (a 10,000-session
# hold on a busy host took over 300 s, the default, and the server ended the first ones).
"$BIN/secure-server" --listen 10.77.0.1:4801 --certs "$WORK/pki" --max-clients "$MAX" \
    --max-pending 64 --max-pending-per-address 16 --idle-timeout 3600 \
    >"$WORK/hold-server.log" 2>&1 &
HS=$!
# The bandwidth server: the same buffers, event-driven (the default). ib_write_bw's passive
# side sleeps while the data lands; a receiver that busy-polls takes one of the VM's two vCPUs
# from rxe's own packet processing (measured: 51 against 60 MB/s at 1 MiB, 57 against 61 at
# 64 KiB, medians of 4 rounds), while for small messages the event-driven server's wake-up per
# message is what limits the window: both are measured.
"$BIN/secure-server" --listen 10.77.0.1:4802 --certs "$WORK/pki" --max-clients 16 \
    --buffer-size 1048576 --allow-unprotected >"$WORK/bw-server.log" 2>&1 &
BW=$!
# The warm server: the connection server's defaults with session resources kept ready (its
# pool is full again long before the next round: bench connect --warm waits for its own).
"$BIN/secure-server" --listen 10.77.0.1:4803 --certs "$WORK/pki" --max-clients 16 \
    --warm-pool 8 >"$WORK/warm-server.log" 2>&1 &
WS=$!
# The connection server's defaults, but each session's write region made with the session
# (--writes-at-setup), as before regions were made when a client first WRITEs: what the region
# costs a session's setup, beside the same connections on the default server.
"$BIN/secure-server" --listen 10.77.0.1:4806 --certs "$WORK/pki" --max-clients 16 \
    --writes-at-setup >"$WORK/at-setup-server.log" 2>&1 &
AS=$!
listening 4800
listening 4801
listening 4802
listening 4803
listening 4806
# Warm the neighbour tables (the first rdma_cm address resolution waits for ARP).
cmtime_total >/dev/null || true

for r in $(seq "$ROUNDS"); do
    [ "$HOLD_ONLY" = 1 ] && break
    echo "bench: round $r/$ROUNDS" >&2
    total=$(cmtime_total)
    row "$r" cmtime connect 0 none per_connection_us "$total" us
    j=$("${CLIENT[@]/4800/4801}" bench connect -n "$CONNS" --json)
    COLD=$j
    row "$r" secure-rdma connect 0 protected per_connection_us "$(jq .per_connection_us.mean <<<"$j")" us
    for phase in tcp_tls admission rdma_setup confirmation; do
        row "$r" secure-rdma "connect:$phase" 0 protected per_connection_us "$(jq ".phases_us.$phase.mean" <<<"$j")" us
    done
    row "$r" secure-rdma connect:first 0 protected per_connection_us "$(jq .first_connection_us <<<"$j")" us
    j=$("${CLIENT[@]/4800/4806}" bench connect -n "$CONNS" --json)
    row "$r" secure-rdma connect:writes_at_setup 0 protected per_connection_us "$(jq .per_connection_us.mean <<<"$j")" us
    row "$r" secure-rdma connect:writes_at_setup_after_tls 0 protected per_connection_us "$(jq .after_tls_us.mean <<<"$j")" us
    # Connections per second. cmtime issues each step for all of its N connections at once,
    # so N over its steps' time is already a concurrent rate; ours one at a time, then CONC
    # clients in flight at once (cold, and on the warm path).
    row "$r" cmtime connect 0 none connections_per_s "$(awk -v t="$total" 'BEGIN { printf "%.2f", (t > 0 ? 1e6 / t : 0) }')" conn/s
    row "$r" secure-rdma connect 0 protected connections_per_s "$(jq .connections_per_s <<<"$j")" conn/s
    j=$("${CLIENT[@]/4800/4801}" bench connect -n "$CONNS" --concurrency "$CONC" --json)
    row "$r" secure-rdma connect:concurrent 0 protected connections_per_s "$(jq .connections_per_s <<<"$j")" conn/s
    row "$r" secure-rdma connect:concurrent 0 protected per_connection_us "$(jq .per_connection_us.mean <<<"$j")" us
    j=$("${CLIENT[@]/4800/4803}" bench connect -n "$CONNS" --concurrency "$CONC" --warm --json)
    row "$r" secure-rdma connect:warm_concurrent 0 protected connections_per_s "$(jq .connections_per_s <<<"$j")" conn/s
    # Three more lanes on each live session (the server's default cap is 8 per identity).
    j=$("${CLIENT[@]/4800/4801}" bench connect -n "$CONNS" --lanes 4 --json)
    row "$r" secure-rdma connect:extra_lane 0 protected per_connection_us "$(jq .lanes.lane_us.mean <<<"$j")" us
    # The warm path: both ends keep 8 sessions' resources ready (bench connect --warm).
    j=$("${CLIENT[@]/4800/4803}" bench connect -n "$CONNS" --warm --json)
    row "$r" secure-rdma connect:warm 0 protected per_connection_us "$(jq .per_connection_us.mean <<<"$j")" us
    row "$r" secure-rdma connect:warm_tcp_tls 0 protected per_connection_us "$(jq .phases_us.tcp_tls.mean <<<"$j")" us
    row "$r" secure-rdma connect:warm_after_tls 0 protected per_connection_us "$(jq .after_tls_us.mean <<<"$j")" us
    row "$r" secure-rdma connect:warm_connections 0 protected count "$(jq .warm.warm_connections <<<"$j")" n
    row "$r" secure-rdma connect:warm_early_setups 0 protected count "$(jq .early_setups <<<"$j")" n
    # The same warm connections without the early endpoint (both endpoints, both ready, both
    # confirmed over TLS after the accept): what it saves, in the same round.
    j=$("${CLIENT[@]/4800/4803}" --setup symmetric bench connect -n "$CONNS" --warm --json)
    row "$r" secure-rdma connect:warm_symmetric_after_tls 0 protected per_connection_us "$(jq .after_tls_us.mean <<<"$j")" us
    # Cold for comparison in the same round: the same command without the pools.
    row "$r" secure-rdma connect:cold_after_tls 0 protected per_connection_us "$(jq .after_tls_us.mean <<<"$COLD")" us
    # Warm lanes: each connection takes four resources (its first QP and three lanes).
    j=$("${CLIENT[@]/4800/4803}" bench connect -n "$CONNS" --lanes 4 --warm --json)
    row "$r" secure-rdma connect:warm_extra_lane 0 protected per_connection_us "$(jq .lanes.lane_us.mean <<<"$j")" us
    row "$r" secure-rdma connect:warm_lanes 0 protected count "$(jq .warm.warm_lanes <<<"$j")" n
    [ "$SETUP_ONLY" = 1 ] && continue
    row "$r" rping process 64 none ms "$(process_ms timeout 60 rping -c -a 10.77.0.1 -p $RPING_PORT -C 1 -S 64)" ms
    row "$r" secure-rdma process 64 protected ms \
        "$(process_ms "${CLIENT[@]/4800/4801}" -e "send $(printf 'p%.0s' $(seq 64))" -e quit)" ms
    for si in $SIZES; do
        size=${si%%:*} iters=${si##*:}
        line=$(perftest ib_send_lat "$size" "$iters"); set -- $line
        row "$r" ib_send_lat send "$size" none latency_typical_us "$5" us
        row "$r" ib_send_lat send "$size" none latency_avg_us "$6" us
        line=$(perftest ib_write_lat "$size" "$iters"); set -- $line
        row "$r" ib_write_lat write "$size" none latency_typical_us "$5" us
        row "$r" ib_write_lat write "$size" none latency_avg_us "$6" us
        line=$(perftest ib_write_bw "$size" "$iters"); set -- $line
        row "$r" ib_write_bw write "$size" none bandwidth_mib_s "$4" MiB/s
        for prot in protected none; do
            flag=()
            [ $prot = none ] && flag=(--no-payload-protection)
            for op in send write; do
                j=$("${CLIENT[@]}" "${flag[@]}" bench $op -s "$size" -n "$iters" --poll busy --json)
                row "$r" secure-rdma $op "$size" $prot latency_p50_us "$(jq .latency_us.p50 <<<"$j")" us
                row "$r" secure-rdma $op "$size" $prot latency_avg_us "$(jq .latency_us.mean <<<"$j")" us
                # perftest's MB is 2^20 bytes; ours is reported in 10^6.
                row "$r" secure-rdma $op "$size" $prot bandwidth_mib_s "$(jq '.bandwidth_mb_s * 1000000 / 1048576' <<<"$j")" MiB/s
                # The cipher's own cost in the same process and boot (seal + open of this size
                # and of the acknowledgement): what protection would add if it cost nothing else.
                # The unit names the cipher the session chose (it depends on the CPU model).
                if [ $prot = protected ]; then
                    cipher=$(jq -r .aead.cipher <<<"$j")
                    row "$r" secure-rdma $op "$size" $prot aead_seal_open_us "$(jq .aead.seal_open_us.p50 <<<"$j")" "us $cipher"
                    row "$r" secure-rdma $op "$size" $prot aead_ack_seal_open_us "$(jq .aead.ack_seal_open_us.p50 <<<"$j")" "us $cipher"
                fi
            done
            # Bandwidth against the event-driven server too, as ib_write_bw's passive side
            # sleeps; the client (the active side) busy-polls, as ib_write_bw's does.
            j=$("${CLIENT[@]/4800/4802}" "${flag[@]}" bench write -s "$size" -n "$iters" --poll busy --json)
            row "$r" secure-rdma write:event "$size" $prot bandwidth_mib_s "$(jq '.bandwidth_mb_s * 1000000 / 1048576' <<<"$j")" MiB/s
        done
    done
    # Start time of a whole process, as a user sees it.
    for b in "$DEV/secure-client" "$BIN/secure-client" ibv_devinfo; do
        t0=$(date +%s%N)
        case $b in
            ibv_devinfo) ibv_devinfo >/dev/null ;;
            *) "$b" --help >/dev/null ;;
        esac
        t1=$(date +%s%N)
        case $b in
            "$DEV"/*) name=secure-client-dev ;;
            "$BIN"/*) name=secure-client-release ;;
            *) name=ibv_devinfo ;;
        esac
        row "$r" "$name" start 0 none ms "$(( (t1 - t0) / 1000000 ))" ms
    done
done
kill -INT $SERVER; wait $SERVER || true
kill -INT $BW; wait $BW || true
kill -INT $WS; wait $WS || true
kill -INT $AS; wait $AS || true
kill $RPING 2>/dev/null; wait $RPING 2>/dev/null || true

# hold OP PORT SERVER_PID [CLIENT_FLAG...]: bench hold -n HOLD against the server on PORT, rows
# under OP.
hold() {
    local op=$1 port=$2 server=$3 idle peak now hc j kind est slab0 slabpeak s
    local extra=("${@:4}")
    echo "bench: holding $HOLD sessions ($op)" >&2
    rss() { awk '/^VmRSS:/ { print $2 }' /proc/$1/status; }
    slab() { awk '/^Slab:/ { print $2 }' /proc/meminfo; }
    # per_session PEAK BASE N: KiB per session of a growth from BASE to PEAK over N sessions.
    per_session() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.1f", (a - b) / n }'; }
    idle=$(rss "$server") slab0=$(slab)
    "${CLIENT[@]/4800/$port}" "${extra[@]}" bench hold -n "$HOLD" --concurrency 16 --hold 20 --json >"$WORK/$op.json" &
    hc=$!
    # The server's memory while all sessions are held: the peak over the hold.
    # And the kernel's: its slab (QPs, regions, windows, sockets) grows for both ends at once.
    peak=$idle slabpeak=$slab0
    while kill -0 $hc 2>/dev/null; do
        now=$(rss "$server"); [ "$now" -gt "$peak" ] && peak=$now
        s=$(slab); [ "$s" -gt "$slabpeak" ] && slabpeak=$s
        sleep 0.5
    done
    wait $hc
    j=$(cat "$WORK/$op.json")
    row 1 secure-rdma "$op" "$HOLD" protected established "$(jq .established <<<"$j")" sessions
    row 1 secure-rdma "$op" "$HOLD" protected delivered "$(jq .delivered <<<"$j")" sessions
    row 1 secure-rdma "$op" "$HOLD" protected setup_ms "$(jq .setup_ms <<<"$j")" ms
    row 1 secure-rdma "$op" "$HOLD" protected client_rss_per_session_kib "$(jq .rss_per_session_kib <<<"$j")" KiB
    # What the client's share is made of: rxe's rings mapped from the device, anonymous memory.
    for kind in rdma_queues anonymous; do
        row 1 secure-rdma "$op" "$HOLD" protected "client_${kind}_per_session_kib" \
            "$(jq ".per_session_kib_by_kind.${kind} // 0" <<<"$j")" KiB
    done
    est=$(jq .established <<<"$j")
    if [ "$est" -gt 0 ]; then
        row 1 secure-rdma "$op" "$HOLD" protected server_rss_per_session_kib \
            "$(per_session "$peak" "$idle" "$est")" KiB
        row 1 secure-rdma "$op" "$HOLD" protected slab_per_session_kib \
            "$(per_session "$slabpeak" "$slab0" "$est")" KiB
    fi
    return 0
}
if [ "$HOLD" -gt 0 ] && [ "$HOLD_QUEUES" != shared ]; then
    hold hold 4801 $HS
fi
kill -INT $HS; wait $HS || true
# The same hold on a server whose sessions take their receives from one shared receive queue
# (its 1,024 receives made once, 4 MiB for all the sessions) and complete their sends on shared
# CQs, from a client that holds its sessions on a shared queue of its own too (no CQ per
# session on either end: rxe allows about 32,000 CQs per device).
# With HOLD_WRITES=both, once more on a server that makes each session's write region with the
# session (--writes-at-setup), as every session had before they were made on demand.
# shared_hold OP PORT [SERVER_FLAG...]
shared_hold() {
    local op=$1 port=$2
    "$BIN/secure-server" --listen 10.77.0.1:"$port" --certs "$WORK/pki" --max-clients "$MAX" \
        --max-pending 64 --max-pending-per-address 16 --idle-timeout 3600 \
        --shared-receive-queue 1024 "${@:3}" \
        >"$WORK/$op-server.log" 2>&1 &
    HSS=$!
    listening "$port"
    # Source ports chosen by the client: past about 32,000 connections from one address,
    # Linux's connect() walks every port it gave out on each new one (README, "Past 32,000 from
    # one client address").
    hold "$op" "$port" $HSS --shared-receive-queue 1024 --source-ports 10000-65535
    kill -INT $HSS; wait $HSS || true
}
if [ "$HOLD" -gt 0 ] && [ "$HOLD_QUEUES" != per-session ]; then
    if [ "$HOLD_WRITES" != at-setup ]; then shared_hold hold-shared 4804; fi
    if [ "$HOLD_WRITES" != on-demand ]; then
        shared_hold hold-shared-at-setup 4805 --writes-at-setup
    fi
fi
INNER

echo "bench.sh: $ROUNDS round(s) in the VM" >&2
# The variables travel in the command line (env ...): the VM starts from a clean environment.
# Three full rounds take about 20 minutes under TCG on an idle host: the VM's 15-minute default
# limit is raised (and can be set).
PER_HOLD=400; [ "$HOLD_QUEUES" = shared ] && PER_HOLD=200
VM_MEM=${VM_MEM:-$(( 2048 + HOLD * PER_HOLD / 1024 ))M} VM_TIMEOUT=${VM_TIMEOUT:-3600} \
    bash "$ROOT/scripts/softroce-vm.sh" \
    "env BIN=$BIN DEV=$DEV WORK=$WORK ROUNDS=$ROUNDS HOLD=$HOLD SETUP_ONLY=$SETUP_ONLY HOLD_ONLY=$HOLD_ONLY HOLD_QUEUES=$HOLD_QUEUES HOLD_WRITES=$HOLD_WRITES CONNS=$CONNS PROCS=$PROCS SIZES='$SIZES' bash $WORK/inside.sh"
cp "$WORK/raw.csv" "$OUT/raw.csv"
python3 "$ROOT/scripts/bench-report.py" "$OUT/raw.csv" "$OUT"
echo "bench.sh: $OUT/raw.csv, $OUT/table.md, $OUT/plot.svg" >&2
