#!/usr/bin/env bash
# test.sh - the project's whole test run, as CI runs it (.ci/run calls this).
#
#   1. installs what a fresh Debian machine lacks (build deps, the lab VM's
#      kernel, qemu, rdma-core, perftest, shellcheck)
#   2. cargo fmt --check, cargo clippy -D warnings, the crates' weight by feature, the
#      architecture picture against cargo metadata, and every crate packaged (cargo package)
#   3. host tests (cargo test --workspace; lab tests show as ignored here)
#   4. the Debian package, made from the lab suite's build (scripts/package.sh --from-dev)
#      and checked (scripts/check-package.sh), then the lab suite on real Soft-RoCE inside
#      scripts/softroce-vm.sh (tests/tests/package_lab.rs installs the package there)
#   5. the Terraform lab checks (scripts/check-terraform.sh)
# and ends with one line per stage and a total: "N passed, M failed".
#
# Options:
#   --host-only   skip the VM suite (refused when CI=true: there a VM suite
#                 that cannot run is a failure, never a skip)
#   --no-install  do not install packages (they must be present)
#   -h, --help    this text
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

HOST_ONLY=0
INSTALL=1
while [ $# -gt 0 ]; do
    case $1 in
        --host-only) HOST_ONLY=1 ;;
        --no-install) INSTALL=0 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "test.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "${CI:-}" = true ] && [ "$HOST_ONLY" = 1 ]; then
    echo "test.sh: --host-only is not allowed when CI=true" >&2
    exit 2
fi

ROOT=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
cd "$ROOT"
LOGDIR=$ROOT/target/test-logs
mkdir -p "$LOGDIR"
T0=$SECONDS
# Each stage line also says how much disk is left where the build goes: a build that fills the
# disk fails far from its cause (CI of 2026-11-29 failed as a full disk would make it: no
# package written, and only 5 of 38 lab binaries run).
free_gb() { df -Pk "$ROOT" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
stage() { printf '\n==== %s (%ds, %s GiB free)\n' "$*" $((SECONDS - T0)) "$(free_gb)"; }

# A fresh clone is built once: incremental compilation's caches (4.2 GB in a full run) would
# only be written. The test builds keep line tables, so backtraces still name files and lines,
# but not the full DWARF of every dependency that each of the ~60 test and lab binaries carried
# (13.6 GB of executables; the whole target directory was 21 GB, now 5.9). Developers' own
# builds keep the dev profile's full debug information.
export CARGO_INCREMENTAL=0
export CARGO_PROFILE_DEV_DEBUG=line-tables-only

# ------------------------------------------------------------------ install
# Build dependencies: cmake + clang/libclang for rdma-mummy-sys (bindgen),
# clang/llvm/libbpf/bpftool for the eBPF programs, shellcheck for scripts, nftables for
# setup-softroce.sh --restrict-local (the VM runs the host's root filesystem, so the lab has it),
# tmux for terminal_lab (secure-client's prompt driven with send-keys); prometheus for promtool
# (host tests check the metrics and docs/monitoring) and the Prometheus server that
# tests/tests/metrics_lab.rs runs in the VM; for the package: man-db, adduser, libcap2-bin
# (setcap) and systemd (systemd-analyze verify, systemd-socket-activate) for check-package.sh and
# tests/tests/package_lab.rs; gnuplot-nox for bench_isolation_script.rs (the bench's report draws
# its plot before it judges the goals); strace for bench_lab.rs (it counts the clock reads that
# reach the kernel on the data path).
BUILD_PKGS=(build-essential cmake clang libclang-dev llvm pkg-config libbpf-dev bpftool
            libibverbs-dev librdmacm-dev shellcheck python3-venv iproute2 tshark nftables tmux
            prometheus man-db adduser libcap2-bin systemd gnuplot-nox strace)
if [ "$INSTALL" = 1 ]; then
    stage "install"
    missing=()
    for p in "${BUILD_PKGS[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # tshark asks whether non-root users may capture; answer no.
        echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
    if [ "$HOST_ONLY" = 0 ]; then
        bash scripts/softroce-vm.sh --install-only
        # The package stage's tool, pinned; about 2 minutes to build, once per machine.
        if ! cargo deb --version 2>/dev/null | grep -q '3\.8\.0'; then
            cargo install cargo-deb --version 3.8.0 --locked
        fi
    fi
fi

# ------------------------------------------------------------------ lint
stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# ------------------------------------------------------------------ boundaries
# The pure crates stay pure: roce (the packet codec) and rdma-quota (quotas and the collector
# protocol) must build without clang, cmake, libibverbs, an async runtime or TLS, so that the
# decoder's fuzz target, the interceptor and any tool can use them alone.
stage "crate boundaries"
for crate in roce rdma-quota; do
    heavy=$(cargo tree -p "$crate" -e normal --locked --prefix none |
        awk '{print $1}' | grep -xE 'aya|aya-obj|tokio|rustls|ring|sideway|rdma-mummy-sys|secure-rdma|criterion' | sort -u || true)
    if [ -n "$heavy" ]; then
        echo "test.sh: $crate must not depend on: $heavy" >&2
        exit 1
    fi
    echo "$crate: no aya, tokio, rustls, ring, sideway or criterion in its normal dependencies"
done
# Weight by feature: what a crate pulls in without its default features.
#   forbid CRATE WHAT PATTERN: fails if `cargo tree -p CRATE --no-default-features` has a package
#   whose whole name matches PATTERN; WHAT says why in the output.
forbid() {
    local found
    found=$(cargo tree -p "$1" --no-default-features -e normal --locked --prefix none |
        awk '{print $1}' | grep -xE "$3" | sort -u | tr '
' ' ' || true)
    if [ -n "$found" ]; then
        echo "test.sh: $1 without default features must not depend on: $found($2)" >&2
        exit 1
    fi
    echo "$1 (no default features): none of $3 ($2)"
}
# roce's core (decoder, encoder, ICRC, PSN arithmetic) is for anyone who only needs packets.
forbid roce "no capture files or LRU" 'pcap-file|byteorder_slice|lru'
# Libraries speak no command line: the CLI crates are their binaries' alone.
forbid rdma-inject "a library speaks no command line" 'clap|rdma-cli|anyhow'
forbid rdma-collector "a library speaks no command line" 'clap|rdma-cli|anyhow'
# rdma-monitor without its default features is the reports and the hardware counters alone, what
# secure-server's --metrics takes: no packet capture, collector, command line or eBPF.
forbid rdma-monitor "what --metrics needs, nothing more" 'roce|pcap-file|byteorder_slice|rdma-collector|clap|rdma-cli|aya'
# The README's architecture picture is drawn from cargo metadata; a new crate or dependency
# without a new picture fails here.
python3 scripts/architecture.py --check
# rust-version must be one the locked dependencies accept (cargo would not check it for us).
python3 - <<'PY'
import json, subprocess, sys
meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--locked"],
                                 check=True, capture_output=True, text=True).stdout)
ws = set(meta["workspace_members"])
ver = lambda v: tuple(int(x) for x in (v.split(".") + ["0", "0"])[:3])
ours = max(ver(p["rust_version"]) for p in meta["packages"] if p["id"] in ws)
need = max((ver(p["rust_version"]), p["name"]) for p in meta["packages"]
           if p["id"] not in ws and p.get("rust_version"))
if ours < need[0]:
    sys.exit(f"test.sh: rust-version {ours} is older than {need[1]} needs ({need[0]})")
print("rust-version %s covers every locked dependency (newest: %s %s)" % (".".join(map(str, ours)), need[1], ".".join(map(str, need[0]))))
PY

# ------------------------------------------------------------------ crates packaged
# Every crate but the lab suite can be published, so a user can `cargo add` one part of the
# framework: each is packaged and built from its package, in dependency order (cargo puts the
# workspace's own unpublished crates in a local registry for the ones that need them). A path
# dependency without a version, a file outside the crate or missing metadata fails here.
stage "crates packaged"
# Cargo unpacks each packaged crate from its local registry (target/package/tmp-registry) into
# $CARGO_HOME/registry/src/-<hash of that path>/NAME-VERSION, and reuses a copy unpacked there
# before: a registry's NAME-VERSION is supposed never to change. Ours do change while the version
# stays 0.1.0, so where CARGO_HOME outlives the checkout (CI's cache, the same clone path every
# run), a crate would be verified against an earlier run's sources of its workspace dependencies
# (seen: secure-rdma against an rdma-quota without `spiffe`). For the same reason the target
# dir's builds of those copies are trusted by their old file list (a new module is not in it).
# Remove both first.
python3 - <<'PY'
import glob, json, os, shutil, subprocess
home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
                                 check=True, capture_output=True, text=True).stdout)
debug = os.path.join(meta["target_directory"], "debug")
for p in meta["packages"]:
    # Only registries named "-<hash>" are local ones; crates.io's unpacked sources are left alone.
    for d in glob.glob(os.path.join(home, "registry", "src", "-*", f"{p['name']}-{p['version']}")):
        shutil.rmtree(d, ignore_errors=True)
    # A build of a packaged copy is the one whose dep-info lists files under such a registry.
    for fp in glob.glob(os.path.join(debug, ".fingerprint", p["name"] + "-*")):
        unit = os.path.basename(fp)[len(p["name"]) + 1:]
        if "-" in unit:
            continue  # another crate whose name starts with this one's
        dep = os.path.join(debug, "deps", f"{p['name'].replace('-', '_')}-{unit}.d")
        try:
            packaged = "/registry/src/-" in open(dep, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        if packaged:
            shutil.rmtree(fp, ignore_errors=True)
PY
# --allow-dirty: a developer's uncommitted change is checked as it stands (CI's clone is clean).
# The dependencies are built at opt-level 0 here (.cargo/config.toml optimizes them for the lab
# suite): a package's verification build only has to compile. The stage took 623 s with them
# at opt-level 1 (ring at 3) and 302 s at 0, on an idle host.
crates_rc=0
cargo package --workspace --exclude secure-rdma-tests --locked --allow-dirty \
    --config 'profile.dev.package."*".opt-level=0' --config 'profile.dev.package.ring.opt-level=0' \
    >"$LOGDIR/crates.log" 2>&1 || crates_rc=$?
grep -E '^ *(Packaged|Verifying)|^(error|warning)' "$LOGDIR/crates.log" || true
if [ "$crates_rc" != 0 ] || grep -q '^warning: manifest' "$LOGDIR/crates.log"; then
    echo "test.sh: a crate does not package (exit $crates_rc; see $LOGDIR/crates.log)" >&2
    exit 1
fi
echo "$(grep -c '^ *Verifying' "$LOGDIR/crates.log") crates packaged and built from their packages"

# ------------------------------------------------------------------ host tests
# Sums libtest's "test result:" lines of a log into "passed failed ignored".
count() {
    awk '/^test result:/ { for (i = 1; i <= NF; i++) {
            if ($(i) ~ /^passed;?$/) p += $(i-1);
            if ($(i) ~ /^failed;?$/) f += $(i-1);
            if ($(i) ~ /^ignored;?$/) g += $(i-1) } }
         END { printf "%d %d %d\n", p, f, g }' "$1"
}

stage "host tests"
host_rc=0
{ cargo test --workspace --locked &&
    # secure-server without eBPF: --telemetry and --metrics report its own counts.
    cargo test -p secure-rdma-server --no-default-features --locked; } 2>&1 |
    tee "$LOGDIR/host.log" || host_rc=$?
read -r HOST_PASS HOST_FAIL HOST_IGN < <(count "$LOGDIR/host.log")
if [ "$host_rc" != 0 ] && [ "$HOST_FAIL" = 0 ]; then HOST_FAIL=1; fi

# ------------------------------------------------------------------ VM suite
VM_PASS=0 VM_FAIL=0 vm_rc=0 PKG_PASS=0 PKG_FAIL=0
if [ "$HOST_ONLY" = 0 ]; then
    stage "build the lab suite"
    # --lib builds librdma_intercept.so (a cdylib) for the LD_PRELOAD tests; --examples the
    # secure-rdma examples that examples_lab runs.
    cargo build --workspace --bins --lib --examples --locked
    # The lab binaries are the host stage's own (`--workspace`: the same features, so nothing
    # is built again; `-p secure-rdma-tests` unified features differently and linked all 38 a
    # second time, 3.5 GB). A build that fails stops the run here, never a suite of fewer
    # binaries.
    cargo test --workspace --no-run --locked --message-format=json >"$LOGDIR/lab-build.json"
    mapfile -t VM_TESTS < <(python3 -c 'import json,sys
for line in open(sys.argv[1], encoding="utf-8"):
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["target"]["kind"] == ["test"] and "#secure-rdma-tests@" in m["package_id"]):
        print(m["executable"])' "$LOGDIR/lab-build.json")
    if [ ${#VM_TESTS[@]} -eq 0 ]; then
        echo "test.sh: no lab test binaries were built" >&2
        exit 1
    fi
    # From the dev build just made (no release build here); package_lab.rs installs it in the VM.
    stage "package"
    pkg_rc=0
    { bash scripts/package.sh --from-dev &&
        bash scripts/check-package.sh target/debian/secure-rdma_*.deb; } 2>&1 |
        tee "$LOGDIR/package.log" || pkg_rc=${PIPESTATUS[0]}
    read -r PKG_PASS PKG_FAIL < <(awk '/^package: [0-9]+ passed, [0-9]+ failed/ { p = $2; f = $4 } END { printf "%d %d\n", p, f }' "$LOGDIR/package.log")
    if [ "$pkg_rc" != 0 ] && [ "$PKG_FAIL" = 0 ]; then PKG_FAIL=1; fi
    stage "lab suite in the Soft-RoCE VM (${#VM_TESTS[@]} test binaries)"
    # --ignored: only the lab tests (`#[ignore = "needs the Soft-RoCE lab..."]`); the others in
    # the same binaries ran in the host stage above, and repeating them under TCG cost about 40 s.
    # Each binary's time is printed, for whoever has to keep the suite within CI's budget, and
    # each has its own limit (VM_BINARY_TIMEOUT, 900 s by default): a binary that hangs is
    # stopped with what its processes were waiting on printed, and the next one runs (one hang
    # on 2026-11-28 took the whole stage and said nothing).
    cmd="VM_BINARY_TIMEOUT=${VM_BINARY_TIMEOUT:-900} bash scripts/vm-suite.sh ${VM_TESTS[*]}"
    # The whole suite runs in one VM boot; under TCG it took 24 minutes on an idle host (CI run
    # of 2026-11-28), so the VM's own 15-minute default limit is raised, with room for a loaded
    # host (CI's limit for the whole run is 90 minutes; the stages before this one take about 25).
    # target/debug is read through the VM's cached root mount (VM_CACHED): on the uncached
    # read-write share each start of a 100 MB debug binary cost about 0.8 s more under TCG,
    # and the suite starts hundreds of them.
    # 4 GiB: bench_lab holds 5,000 sessions at once, both ends in this VM (about 150 KiB per
    # session on each end, and rxe's queues in the kernel).
    VM_CACHED=$ROOT/target/debug VM_TIMEOUT=${VM_TIMEOUT:-3600} VM_MEM=${VM_MEM:-4G} bash scripts/softroce-vm.sh "$cmd" 2>&1 | tee "$LOGDIR/vm.log" || vm_rc=${PIPESTATUS[0]}
    read -r VM_PASS VM_FAIL _ < <(count "$LOGDIR/vm.log")
    if [ "$vm_rc" != 0 ] && [ "$VM_FAIL" = 0 ]; then
        echo "test.sh: the VM suite could not run (softroce-vm.sh exit $vm_rc)" >&2
        VM_FAIL=1
    fi
    if [ "$VM_PASS" = 0 ] && [ "$vm_rc" = 0 ]; then
        echo "test.sh: the VM suite ran no test" >&2
        VM_FAIL=1
    fi
fi

# ------------------------------------------------------------------ terraform
stage "terraform lab checks"
tf_rc=0
bash scripts/check-terraform.sh 2>&1 | tee "$LOGDIR/terraform.log" || tf_rc=${PIPESTATUS[0]}
# its closing line: "terraform: N passed, N failed, N skipped"
read -r TF_PASS TF_FAIL < <(awk '/^terraform: [0-9]+ passed, [0-9]+ failed/ { p = $2; f = $4 } END { printf "%d %d\n", p, f }' "$LOGDIR/terraform.log")
if [ "$tf_rc" != 0 ] && [ "$TF_FAIL" = 0 ]; then TF_FAIL=1; fi

# ------------------------------------------------------------------ summary
stage "summary"
echo "host: $HOST_PASS passed, $HOST_FAIL failed ($HOST_IGN lab tests ignored on the host)"
if [ "$HOST_ONLY" = 0 ]; then
    echo "package: $PKG_PASS passed, $PKG_FAIL failed"
    echo "vm: $VM_PASS passed, $VM_FAIL failed"
else
    echo "vm: not run (--host-only)"
fi
echo "terraform: $TF_PASS passed, $TF_FAIL failed"
TOTAL_PASS=$((HOST_PASS + PKG_PASS + VM_PASS + TF_PASS))
TOTAL_FAIL=$((HOST_FAIL + PKG_FAIL + VM_FAIL + TF_FAIL))
echo "total: $TOTAL_PASS passed, $TOTAL_FAIL failed"
[ "$TOTAL_FAIL" = 0 ]
