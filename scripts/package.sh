#!/usr/bin/env bash
# package.sh - the Debian package (cargo-deb; metadata in secure-rdma-server/Cargo.toml).
#
#   scripts/package.sh             cargo build --release of the five binaries and the
#                                  interceptor, then the package (what to ship)
#   scripts/package.sh --from-dev  package the dev build already in target/debug, no second
#                                  build (CI: after `cargo build --workspace --bins --lib`)
#
# Both write the man pages and completions with each binary's --generate-docs first, and
# print the .deb's path as the last line: target/debian/secure-rdma_VERSION-1_ARCH.deb.
# Needs cargo-deb (`cargo install cargo-deb --version 3.8.0 --locked`; scripts/test.sh does).
#
# Options:
#   --from-dev   see above
#   -h, --help   this text
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

FROM_DEV=0
while [ $# -gt 0 ]; do
    case $1 in
        --from-dev) FROM_DEV=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "package.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$ROOT"
BINS=(secure-server secure-client rdma-monitor rdma-capture rdma-collector)
LIB=librdma_intercept.so
OUT=$ROOT/target/debian

if ! cargo deb --version >/dev/null 2>&1; then
    echo "package.sh: cargo-deb is missing: cargo install cargo-deb --version 3.8.0 --locked" >&2
    exit 1
fi

if [ "$FROM_DEV" = 1 ]; then
    BUILT=$ROOT/target/debug
else
    cargo build --release --locked -p secure-rdma-server -p secure-rdma-client \
        -p rdma-monitor -p rdma-capture -p rdma-collector -p rdma-intercept --bins --lib
    BUILT=$ROOT/target/release
fi
for f in "${BINS[@]}" "$LIB"; do
    if [ ! -f "$BUILT/$f" ]; then
        echo "package.sh: $BUILT/$f is missing; build first (cargo build --workspace --bins --lib)" >&2
        exit 1
    fi
done

# Man pages and completions from the binaries themselves, so they match what they accept.
rm -rf "$BUILT/docs"
for b in "${BINS[@]}"; do
    "$BUILT/$b" --generate-docs "$BUILT/docs" >/dev/null
done
# Debian ships man pages compressed (-n: no name or time stamp, so rebuilds are identical).
gzip -9nf "$BUILT"/docs/man/man1/*.1

# One package in OUT, so that scripts can name it by a glob.
rm -f "$OUT"/secure-rdma_*.deb
if [ "$FROM_DEV" = 1 ]; then
    # cargo-deb reads the build from TARGET_DIR/release and refuses the dev profile in
    # future versions; hard links make the dev build look like one without copying it.
    STAGE=$ROOT/target/package-dev
    rm -rf "$STAGE"
    mkdir -p "$STAGE/release"
    for f in "${BINS[@]}" "$LIB"; do
        ln "$BUILT/$f" "$STAGE/release/$f"
    done
    cp -al "$BUILT/docs" "$STAGE/release/docs"
    # --fast: the dev build's binaries are large; the package is only checked and installed.
    CARGO_TARGET_DIR=$STAGE cargo deb -p secure-rdma-server --no-build --fast --output "$OUT/"
else
    cargo deb -p secure-rdma-server --no-build --output "$OUT/"
fi | tail -n 1
