#!/usr/bin/env bash
# demo.sh - the secure server and three clients on Soft-RoCE.
#
# Builds the workspace, creates a CA with a server and three client
# certificates, starts `secure-server` and runs three `secure-client`s that
# each RDMA SEND a message and RDMA WRITE some data, then shows the server's
# log (who sent what, what landed where).
#
# Where it runs: natively when this host has an RDMA device with a RoCEv2
# IPv4 GID (server and clients on that address), otherwise inside the lab VM
# (scripts/softroce-vm.sh): server on rxe-a (10.77.0.1), clients on rxe-b
# (10.77.0.2), packets crossing the veth pair between them.
#
# Usage: scripts/demo.sh [--vm]     (--vm: use the lab VM even if the host has RDMA)
set -euo pipefail

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug

# --inside SERVER_ADDR: the demo itself (run natively or inside the VM).
if [ "${1:-}" = "--inside" ]; then
    addr=$2
    work=$(mktemp -d)
    trap 'kill "${srv:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
    "$BIN/secure-server" certs init --dir "$work/certs" --san "$addr" >/dev/null
    for c in alice bob carol; do "$BIN/secure-server" certs client "$c" --dir "$work/certs" >/dev/null; done
    echo "== secure-server --listen $addr:4433 --max-clients 10"
    timeout 120 "$BIN/secure-server" --listen "$addr:4433" --max-clients 10 --certs "$work/certs" 2> "$work/server.log" &
    srv=$!
    for _ in $(seq 200); do grep -q "secure-server ready" "$work/server.log" && break; sleep 0.05; done
    grep -q "secure-server ready" "$work/server.log" || { cat "$work/server.log"; exit 1; }
    for c in alice bob carol; do
        echo "== secure-client $addr --name $c"
        timeout 60 "$BIN/secure-client" "$addr" --certs "$work/certs" --name "$c" \
            -e "send hello from $c" -e "write $c's bytes, written straight into the server's memory" -e quit
    done
    kill -INT "$srv"; wait "$srv" || true
    echo "== server log"
    cat "$work/server.log"
    exit 0
fi

cd "$ROOT"
echo "building..." >&2
cargo build --workspace --bins --quiet
native_addr=""
if [ "${1:-}" != "--vm" ] && [ -d /sys/class/infiniband ]; then
    for gid in /sys/class/infiniband/*/ports/1/gids/*; do
        g=$(cat "$gid" 2>/dev/null) || continue
        case $g in 0000:0000:0000:0000:0000:ffff:*)
            hex=${g#0000:0000:0000:0000:0000:ffff:}; hex=${hex/:/}
            native_addr=$(printf '%d.%d.%d.%d' 0x"${hex:0:2}" 0x"${hex:2:2}" 0x"${hex:4:2}" 0x"${hex:6:2}")
            break ;;
        esac
    done
fi
if [ -n "$native_addr" ]; then
    echo "RDMA device found on this host: running natively on $native_addr" >&2
    exec bash "$0" --inside "$native_addr"
fi
echo "no RDMA device on this host: running in the Soft-RoCE lab VM (server on rxe-a, clients on rxe-b)" >&2
exec bash scripts/softroce-vm.sh "bash scripts/demo.sh --inside 10.77.0.1"
