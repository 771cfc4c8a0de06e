#!/usr/bin/env bash
# check-terraform.sh - offline checks of the AWS Soft-RoCE lab in terraform/.
#
#   1. terraform/tests/test_config.py: parses every .tf file with python-hcl2
#      and asserts the lab's security facts (security group rules, encrypted
#      root volumes, IMDSv2, the SSH CIDR variable, outputs, user_data);
#      where `terraform` is on PATH it also evaluates the variable validation,
#      outputs.tf and the user_data template with terraform itself.
#   2. checkov -d terraform: no failed check; skips need an inline reason.
#   3. shellcheck on scripts/*.sh and on the user_data rendered per role.
#   4. terraform fmt -check, and terraform validate when the AWS provider is
#      already on this machine (it cannot be downloaded here); both are
#      skipped without terraform.
#
# The tools live in a venv at ${XDG_CACHE_HOME:-$HOME/.cache}/secure-rdma/tf-venv,
# created on the first run and reused after that. Every step runs even when
# an earlier one failed; the last line is "terraform: N passed, N failed,
# N skipped" (one count per step) and the exit status is 1 if any step failed.
#
# Usage: scripts/check-terraform.sh        (no arguments; run from anywhere)

set -euo pipefail

# Versions that install together and were run green here (Python 3.11).
CHECKOV_VERSION=3.3.30
PYTHON_HCL2_VERSION=8.1.4

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tf_dir=$repo/terraform
cache=${XDG_CACHE_HOME:-$HOME/.cache}/secure-rdma
venv=$cache/tf-venv
# checkov depends on bc-python-hcl2, a fork that installs the same top-level
# `hcl2` module as python-hcl2 with a different output format; one would
# overwrite the other in a single site-packages. python-hcl2 therefore goes
# into its own --target directory inside the venv, put first on PYTHONPATH
# only for test_config.py.
hcl2_dir=$venv/python-hcl2
stamp=$venv/.secure-rdma-pins
pins="checkov==$CHECKOV_VERSION python-hcl2==$PYTHON_HCL2_VERSION"

start=$SECONDS
passed=0
failed=0
skipped=0
failures=()
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { printf '\n== %s\n' "$*"; }
pass() { passed=$((passed + 1)); printf 'PASS %s\n' "$*"; }
fail() { failed=$((failed + 1)); failures+=("$*"); printf 'FAIL %s\n' "$*"; }
skip() { skipped=$((skipped + 1)); printf 'SKIP %s\n' "$*"; }
die() { printf 'check-terraform: error: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }

apt_updated=0
apt_install() {
    is_root && command -v apt-get >/dev/null || return 1
    if [ "$apt_updated" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# A real interpreter rather than a pyenv shim: a venv made from a shim breaks
# as soon as the shim's selected version changes.
find_python() {
    if [ -x /usr/bin/python3 ]; then
        echo /usr/bin/python3
    elif command -v python3 >/dev/null; then
        python3 -c 'import sys; print(sys.executable)'
    else
        return 1
    fi
}

setup_venv() {
    local py
    py=$(find_python) || die "no python3 found; install python3 (and python3-venv)"
    if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
        echo "venv at $venv is broken (its interpreter is gone); recreating it"
        rm -rf "$venv"
    fi
    if [ ! -x "$venv/bin/python" ]; then
        mkdir -p "$cache"
        echo "creating venv $venv with $py"
        if ! "$py" -m venv "$venv" 2>"$work/venv.err"; then
            rm -rf "$venv"
            # Debian and Ubuntu split ensurepip out of the interpreter.
            apt_install python3-venv ||
                die "could not create a venv with $py: $(tail -n 3 "$work/venv.err"); install python3-venv"
            "$py" -m venv "$venv" || die "could not create a venv with $py even after installing python3-venv"
        fi
    fi
    if [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ] && [ -x "$venv/bin/checkov" ] && [ -d "$hcl2_dir/hcl2" ]; then
        echo "reusing $venv ($pins)"
        return
    fi
    echo "installing $pins into $venv (first run only; needs PyPI)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION" ||
        die "pip could not install checkov==$CHECKOV_VERSION"
    rm -rf "$hcl2_dir"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --target "$hcl2_dir" "python-hcl2==$PYTHON_HCL2_VERSION" ||
        die "pip could not install python-hcl2==$PYTHON_HCL2_VERSION"
    echo "$pins" >"$stamp"
}

step_config_tests() {
    say "config tests (terraform/tests/test_config.py, python-hcl2 $PYTHON_HCL2_VERSION)"
    local rc=0
    PYTHONPATH="$hcl2_dir" PYTHONDONTWRITEBYTECODE=1 \
        "$venv/bin/python" "$tf_dir/tests/test_config.py" --render-dir "$work/rendered" |
        tee "$work/config.out" || rc=$?
    if [ "$rc" -eq 0 ]; then
        pass "config tests: $(tail -n 1 "$work/config.out")"
    else
        fail "config tests: $(tail -n 1 "$work/config.out")"
    fi
}

step_checkov() {
    say "checkov $CHECKOV_VERSION -d terraform"
    local rc=0 report=$work/checkov.json
    # Every framework (terraform, secrets, ...), as `checkov -d terraform`.
    # JSON rather than --quiet CLI output: --quiet drops the skipped checks,
    # whose reasons are printed below. --skip-download: no Prisma Cloud
    # look-ups (this must work offline).
    (cd "$repo" && "$venv/bin/checkov" -d terraform --skip-download --output json >"$report") || rc=$?
    if [ ! -s "$report" ]; then
        fail "checkov: no report (exit $rc)"
        return
    fi
    local summary
    summary=$("$venv/bin/python" - "$report" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
reports = data if isinstance(data, list) else [data]
p = f = s = 0
skips = {}
for rep in reports:
    summ = rep.get("summary", {})
    p += summ.get("passed", 0); f += summ.get("failed", 0); s += summ.get("skipped", 0)
    results = rep.get("results", {})
    for chk in results.get("failed_checks", []):
        lines = chk.get("file_line_range") or ["?"]
        print(f"     FAILED {chk['check_id']} {chk['check_name']}: {chk['resource']} "
              f"({chk.get('file_path', '?').lstrip('/')}:{lines[0]})", file=sys.stderr)
    for chk in results.get("skipped_checks", []):
        why = (chk.get("check_result", {}).get("suppress_comment") or "").strip()
        skips.setdefault((chk["check_id"], why), []).append(chk["resource"])
for (check_id, why), resources in sorted(skips.items()):
    print(f"     skipped {check_id} on {', '.join(resources)}: {why or 'NO REASON GIVEN'}", file=sys.stderr)
    if not why:
        f += 1
print(f"{p} passed, {f} failed, {s} skipped")
EOF
)
    if [ "$rc" -eq 0 ] && [[ $summary == *" 0 failed"* ]]; then
        pass "checkov: $summary"
    else
        fail "checkov: $summary (exit $rc)"
    fi
}

step_shellcheck() {
    say "shellcheck"
    if ! command -v shellcheck >/dev/null; then
        apt_install shellcheck || true
    fi
    if ! command -v shellcheck >/dev/null; then
        fail "shellcheck: not installed and cannot install it (apt-get install shellcheck as root)"
        return
    fi
    local f
    for f in "$repo"/scripts/*.sh; do
        [ -e "$f" ] || continue
        # No --external-sources: it would follow `. /etc/os-release` into
        # the checking machine's own files and make results host-dependent.
        if shellcheck "$f"; then
            pass "shellcheck scripts/${f##*/}"
        else
            fail "shellcheck scripts/${f##*/}"
        fi
    done
    local role rendered
    for role in server client; do
        rendered=$work/rendered/user_data.$role.sh
        if [ ! -s "$rendered" ]; then
            fail "shellcheck user_data ($role): template did not render (see config tests)"
        elif shellcheck --shell=bash "$rendered"; then
            pass "shellcheck user_data.sh.tftpl rendered for the $role"
        else
            fail "shellcheck user_data.sh.tftpl rendered for the $role"
        fi
    done
}

# The implied local mirror directories terraform init searches without a
# network (https://developer.hashicorp.com/terraform/cli/config/config-file).
offline_aws_provider() {
    local d
    for d in "$HOME/.terraform.d/plugins" "$HOME/.local/share/terraform/plugins" \
        /usr/local/share/terraform/plugins /usr/share/terraform/plugins; do
        if [ -d "$d/registry.terraform.io/hashicorp/aws" ]; then
            return 0
        fi
    done
    return 1
}

step_terraform() {
    say "terraform fmt / validate"
    if ! command -v terraform >/dev/null; then
        skip "terraform fmt: terraform not on PATH"
        skip "terraform validate: terraform not on PATH"
        return
    fi
    # A TF_CLI_CONFIG_FILE naming a missing file only produces warnings.
    if [ -n "${TF_CLI_CONFIG_FILE:-}" ] && [ ! -e "$TF_CLI_CONFIG_FILE" ]; then
        unset TF_CLI_CONFIG_FILE
    fi
    export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1
    if terraform fmt -check -diff -recursive "$tf_dir"; then
        pass "terraform fmt -check -recursive terraform"
    else
        fail "terraform fmt -check -recursive terraform (run: terraform fmt -recursive terraform)"
    fi
    if [ -d "$tf_dir/.terraform/providers/registry.terraform.io/hashicorp/aws" ]; then
        if terraform -chdir="$tf_dir" validate -no-color; then
            pass "terraform validate"
        else
            fail "terraform validate"
        fi
    elif offline_aws_provider; then
        # A copy, so that init leaves no .terraform/ or lock file in the tree.
        mkdir -p "$work/validate"
        cp "$tf_dir"/*.tf "$tf_dir"/*.tftpl "$work/validate/"
        if terraform -chdir="$work/validate" init -backend=false -input=false -no-color >"$work/init.out" 2>&1 &&
            terraform -chdir="$work/validate" validate -no-color; then
            pass "terraform validate (provider from a local mirror)"
        else
            cat "$work/init.out"
            fail "terraform validate (provider from a local mirror)"
        fi
    else
        skip "terraform validate: the AWS provider is not available offline (run terraform -chdir=terraform init once where the registry is reachable)"
    fi
}

[ -d "$tf_dir" ] || die "no terraform/ directory under $repo"
mkdir -p "$cache"
# Two runs at once (a developer and a hook, say) must not pip into one venv.
exec 9>"$cache/tf-venv.lock"
if command -v flock >/dev/null; then
    flock 9
fi
say "tools"
setup_venv
step_config_tests
step_checkov
step_shellcheck
step_terraform

say "summary ($((SECONDS - start)) s)"
for f in ${failures[@]+"${failures[@]}"}; do
    printf 'failed: %s\n' "$f"
done
echo "terraform: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
