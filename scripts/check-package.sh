#!/usr/bin/env bash
# check-package.sh - checks a secure-rdma .deb (scripts/package.sh makes it):
#
#   1. its contents (dpkg-deb -c): the five binaries, librdma_intercept.so, the systemd units,
#      a man page and bash/zsh/fish completions per binary, and /etc/secure-rdma's conffiles;
#   2. systemd-analyze verify of its units, on the package extracted to a temporary root
#      (--root), so ExecStart= binaries and Documentation=man: pages are the package's own,
#      not whatever this machine has installed. Any warning fails too.
#
#   scripts/check-package.sh target/debian/secure-rdma_0.1.0-1_amd64.deb
#
# Ends with "package: N passed, N failed".
set -euo pipefail

if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "usage: check-package.sh PACKAGE.deb" >&2
    exit 2
fi
DEB=$1
BINS=(secure-server secure-client rdma-monitor rdma-capture rdma-collector)
UNITS=(rdma-collector.socket rdma-collector.service rdma-monitor.service secure-server.service)
CONFFILES=(/etc/secure-rdma/server.toml /etc/secure-rdma/quota.conf)
PASS=0 FAIL=0
check() {
    local what=$1; shift
    if "$@"; then
        PASS=$((PASS + 1))
    else
        echo "check-package: FAIL: $what" >&2
        FAIL=$((FAIL + 1))
    fi
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# "./usr/bin/secure-server" -> "/usr/bin/secure-server", one path a line.
dpkg-deb -c "$DEB" | awk '{ sub(/^\./, "", $6); print $6 }' > "$WORK/contents"
has() { grep -qxF "$1" "$WORK/contents"; }

for b in "${BINS[@]}"; do
    check "/usr/bin/$b" has "/usr/bin/$b"
    check "man page of $b" has "/usr/share/man/man1/$b.1.gz"
    check "bash completion of $b" has "/usr/share/bash-completion/completions/$b"
    check "zsh completion of $b" has "/usr/share/zsh/vendor-completions/_$b"
    check "fish completion of $b" has "/usr/share/fish/vendor_completions.d/$b.fish"
done
check "the interceptor" has /usr/lib/secure-rdma/librdma_intercept.so
for u in "${UNITS[@]}"; do
    check "unit $u" has "/usr/lib/systemd/system/$u"
done
dpkg-deb -e "$DEB" "$WORK/control"
for c in "${CONFFILES[@]}"; do
    check "$c shipped" has "$c"
    check "$c is a conffile" grep -qxF "$c" "$WORK/control/conffiles"
done
check "postinst (creates the secure-rdma user)" grep -q 'adduser --system' "$WORK/control/postinst"

# The units' default dependencies (sysinit.target, sockets.target, ...) come from this
# machine's systemd; the binaries and man pages from the package.
ROOT=$WORK/root
dpkg-deb -x "$DEB" "$ROOT"
for d in /usr/lib/systemd/system /lib/systemd/system; do
    if [ -d "$d" ]; then
        cp -n "$d"/*.target "$d"/*.slice "$ROOT/usr/lib/systemd/system/" 2>/dev/null || true
    fi
done
verify() {
    local out
    out=$(cd "$ROOT/usr/lib/systemd/system" &&
        MANPATH=$ROOT/usr/share/man systemd-analyze verify --root="$ROOT" "${UNITS[@]}" 2>&1) || {
        printf '%s\n' "$out" >&2
        return 1
    }
    if [ -n "$out" ]; then
        printf '%s\n' "$out" >&2
        return 1
    fi
}
check "systemd-analyze verify ${UNITS[*]}" verify

echo "package: $PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
