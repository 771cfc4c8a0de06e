#!/usr/bin/env bash
# Usage: vm-suite.sh TEST_BINARY...
#
# Runs each lab test binary in turn (its ignored tests, one thread, output shown), as
# scripts/test.sh does inside the Soft-RoCE VM, and gives each one its own time limit, so that
# one hung binary costs its limit instead of the whole VM stage, and says why it hung.
#
# Each binary prints "vm suite: NAME took N s" when it ends. One that runs past its limit is
# reported as "vm suite: NAME timed out after N s" with, before it is stopped:
#   - every process with its state, elapsed time and kernel wait channel (ps),
#   - the kernel stack of every thread of the binary's processes and of every task in
#     uninterruptible sleep (D state), where the kernel lets us read them (root),
#   - the kernel's last messages (dmesg).
# Then its whole process group (servers and clients it started) is stopped, TERM and after 10 s
# KILL, and the next binary runs.
#
# Environment:
#   VM_BINARY_TIMEOUT  seconds per binary (default 900; the slowest, bench_lab with its 5,000
#                      sessions, took about 5 minutes under TCG)
#
# Exits 0 when every binary passed, 1 otherwise (a timeout counts as a failure).
set -uo pipefail

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
fi
LIMIT=${VM_BINARY_TIMEOUT:-900}
case "$LIMIT" in
    '' | *[!0-9]* | 0)
        echo "vm-suite.sh: VM_BINARY_TIMEOUT must be a whole number of seconds above 0, not '$LIMIT'" >&2
        exit 2
        ;;
esac
if [ $# -eq 0 ]; then
    echo "vm-suite.sh: no test binaries given (usage: vm-suite.sh TEST_BINARY...)" >&2
    exit 2
fi

# What a hang looks like from outside, printed while it is still hung. $1: the binary's process
# group (its pid: it was started as a group leader).
diagnose() {
    local pgid=$1 pid task
    echo "---- processes (pid ppid pgid state seconds wait-channel command)"
    ps -eo pid,ppid,pgid,stat,etimes,wchan:32,args --sort=pid 2>&1 | cut -c1-240
    for pid in $(ps -eo pid=,pgid=,stat= | awk -v g="$pgid" '$2 == g || $3 ~ /^D/ { print $1 }'); do
        for task in /proc/"$pid"/task/*; do
            [ -r "$task/stack" ] || continue
            echo "---- kernel stack of $(tr '\0' ' ' < /proc/"$pid"/cmdline 2>/dev/null | cut -c1-120) (pid $pid, thread ${task##*/}, $(awk '{print $3}' "$task/stat" 2>/dev/null))"
            cat "$task/stack" 2>/dev/null
        done
    done
    echo "---- dmesg (last 40 lines)"
    dmesg 2>&1 | tail -n 40
    echo "----"
}

rc=0
marks=$(mktemp -d)
trap 'rm -rf "$marks"' EXIT
for t in "$@"; do
    name=$(basename "$t")
    start=$(date +%s)
    # setsid: the binary leads its own process group, so everything it starts can be stopped
    # together if it hangs (and nothing of ours is).
    setsid "$t" --ignored --test-threads=1 --show-output &
    pid=$!
    # The watchdog sleeps through the limit and acts only if the binary is still there; a
    # binary that ends in time ends its watchdog (and the watchdog's sleep) at once, so the
    # suite pays nothing per binary for it.
    (
        sleep "$LIMIT" &
        trap 'kill $! 2>/dev/null; exit 0' TERM
        wait $!
        kill -0 "$pid" 2>/dev/null || exit 0
        touch "$marks/$pid"
        echo "vm suite: $name timed out after $LIMIT s; what it was doing:"
        diagnose "$pid"
        kill -TERM -- -"$pid" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$pid" 2>/dev/null || exit 0
            sleep 1
        done
        kill -KILL -- -"$pid" 2>/dev/null
    ) &
    watchdog=$!
    wait "$pid"
    code=$?
    # A binary stopped by its watchdog: let the watchdog finish stopping its group.
    [ -e "$marks/$pid" ] || kill -TERM "$watchdog" 2>/dev/null
    wait "$watchdog"
    if [ -e "$marks/$pid" ]; then
        kill -KILL -- -"$pid" 2>/dev/null
        # The same words as a failed test, so scripts/test.sh's count sees it.
        echo "test result: FAILED. 0 passed; 1 failed; 0 ignored ($name timed out after $LIMIT s)"
        rc=1
    else
        [ "$code" = 0 ] || rc=1
        echo "vm suite: $name took $(($(date +%s) - start)) s"
    fi
done
exit $rc
