#!/usr/bin/env bash
# setup-softroce.sh - create (or reuse) a Soft-RoCE (rdma_rxe) device on a netdev
# and wait until it is usable for RoCEv2 over IPv4.
#
# Works on any Linux host whose kernel ships rdma_rxe: a cloud VM (e.g. Ubuntu
# 24.04 with linux-modules-extra-$(uname -r)), a laptop, or the lab VM started
# by scripts/softroce-vm.sh (which runs this very script for rxe-a and rxe-b).
#
# It is idempotent: running it again on the same netdev finds the existing rxe
# device, prints the same result line and exits 0.  Run `--help` for details.
#
# Result line (stdout, one per device, stable and parseable):
#   NAME netdev=IFACE port=1 state=ACTIVE roce_v2_gid_index=N gid=::ffff:A.B.C.D
# Teardown line (stdout, one per removed device):
#   NAME netdev=IFACE removed
# Local-user restriction (--restrict-local / --unrestrict-local), one line:
#   restrict-local on table=inet/secure_rdma_local rule="udp dport 4791 meta skuid != 0 counter drop"
#   restrict-local off table=inet/secure_rdma_local
# Everything else (progress, notes) goes to stderr and is silenced by --quiet;
# errors are a single "setup-softroce: error: ..." line on stderr.
#
# Exit status: 0 success, 1 failure, 2 usage error.

set -euo pipefail

PROG=setup-softroce
SYSIB=/sys/class/infiniband
SYSNET=/sys/class/net
PORT=1 # rxe devices have exactly one port

usage() {
    cat <<'EOF'
Usage: setup-softroce.sh [--netdev IFACE] [--name NAME] [--timeout SEC] [--restrict-local] [--quiet]
       setup-softroce.sh --teardown [--netdev IFACE] [--name NAME] [--unrestrict-local] [--quiet]
       setup-softroce.sh --restrict-local | --unrestrict-local [--quiet]

Create a Soft-RoCE (rdma_rxe) device on a network interface, or reuse the one
already there, then wait until its port is ACTIVE and the RoCEv2 GID of the
interface's IPv4 address is present.  Needs root, the rdma_rxe kernel module
and the `rdma` tool (iproute2).  Safe to run repeatedly.

Options:
  --netdev IFACE  network interface to bind to (default: the interface of the
                  default IPv4 route; an error if there is none)
  --name NAME     name of the rxe device to create (default: rxe0).  If IFACE
                  already has an rxe device under another name, that device is
                  reused and a note says so.
  --timeout SEC   how long to wait for the port and the GID (default: 10)
  --teardown      remove instead of create: with --name, the named rxe device;
                  with --netdev (or without --name: the default-route
                  interface), every rxe device bound to that interface.
                  Removing what does not exist is not an error.
  --restrict-local
                  also (alone: only) add a firewall rule so that only root's
                  sockets can send to UDP port 4791 (RoCEv2) from this host.
                  Without it any local user can forge RoCEv2 packets into
                  local (and remote) queue pairs with an ordinary UDP socket
                  ("NeVerMore").  nftables table inet secure_rdma_local, one
                  rule:  udp dport 4791 meta skuid != 0 counter drop
                  rxe's own packets come from kernel sockets, which have no
                  owner: `meta skuid` does not match them, so they pass.
                  Needs root and nft (apt-get install nftables).  Idempotent.
  --unrestrict-local
                  also (alone: only) remove that rule (its table).
  --quiet, -q     print only the result line(s); errors are still reported
  --help, -h      show this help

Output (stdout), one line per device:
  NAME netdev=IFACE port=1 state=ACTIVE roce_v2_gid_index=N gid=::ffff:A.B.C.D
  NAME netdev=IFACE removed                              (with --teardown)
and one line for the local-user rule:
  restrict-local on table=inet/secure_rdma_local rule="udp dport 4791 meta skuid != 0 counter drop"
  restrict-local off table=inet/secure_rdma_local        (with --unrestrict-local)
Use gid index N (e.g. `ibv_rc_pingpong -d NAME -g N`) to address the peer by
its IPv4 address over RoCE v2.

Kernel module: rdma_rxe.  Ubuntu: apt-get install linux-modules-extra-$(uname -r).
Debian: the stock kernel (package linux-image-amd64) ships it; custom or
minimal cloud kernels may not (then use scripts/softroce-vm.sh).

Exit status: 0 success, 1 failure (one-line message on stderr), 2 usage error.

Examples:
  sudo scripts/setup-softroce.sh                     # rxe0 on the default-route NIC
  sudo scripts/setup-softroce.sh --netdev veth-a --name rxe-a --quiet
  sudo scripts/setup-softroce.sh --teardown --name rxe-a
  sudo scripts/setup-softroce.sh --restrict-local      # only root may send RoCEv2
  sudo nft list table inet secure_rdma_local           # the rule and its drop counter
  sudo scripts/setup-softroce.sh --unrestrict-local
EOF
}

QUIET=0
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}
usage_error() {
    printf '%s: %s (see --help)\n' "$PROG" "$*" >&2
    exit 2
}
info() {
    [[ $QUIET == 1 ]] || printf '%s: %s\n' "$PROG" "$*" >&2
}

# ---------------------------------------------------------------- arguments
NETDEV=""
NAME=""
TIMEOUT=10
TEARDOWN=0
RESTRICT="" # on | off
while (($#)); do
    case $1 in
        --netdev | --name | --timeout)
            (($# >= 2)) || usage_error "$1 needs a value"
            case $1 in
                --netdev) NETDEV=$2 ;;
                --name) NAME=$2 ;;
                --timeout) TIMEOUT=$2 ;;
            esac
            shift 2
            ;;
        --netdev=*) NETDEV=${1#*=} && shift ;;
        --name=*) NAME=${1#*=} && shift ;;
        --timeout=*) TIMEOUT=${1#*=} && shift ;;
        --teardown) TEARDOWN=1 && shift ;;
        --restrict-local | --unrestrict-local)
            want=on
            [[ $1 == --unrestrict-local ]] && want=off
            [[ -z $RESTRICT || $RESTRICT == "$want" ]] ||
                usage_error "--restrict-local and --unrestrict-local exclude each other"
            RESTRICT=$want
            shift
            ;;
        -q | --quiet) QUIET=1 && shift ;;
        -h | --help) usage && exit 0 ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done
NAME_GIVEN=0
NETDEV_GIVEN=0
[[ -n $NAME ]] && NAME_GIVEN=1
[[ -n $NETDEV ]] && NETDEV_GIVEN=1
# --restrict-local / --unrestrict-local alone touch the firewall only.
DEVICE_ACTION=1
if [[ -n $RESTRICT && $NAME_GIVEN == 0 && $NETDEV_GIVEN == 0 && $TEARDOWN == 0 ]]; then
    DEVICE_ACTION=0
fi
NAME=${NAME:-rxe0}
[[ $NAME =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$ ]] ||
    usage_error "invalid --name '$NAME' (letters, digits, '.', '_', '-'; at most 63 characters)"
if ! [[ $TIMEOUT =~ ^[0-9]+$ ]] || ((10#$TIMEOUT == 0)); then
    usage_error "invalid --timeout '$TIMEOUT' (a whole number of seconds > 0)"
fi
TIMEOUT=$((10#$TIMEOUT))

# ---------------------------------------------------------------- helpers
# The helpers set global variables instead of printing: under TCG (the lab VM)
# every fork costs tens of milliseconds.

# Sets NETDEV to the interface of the first default IPv4 route
# ("default via X dev IFACE ...").  Returns 1 if there is none.
default_route_netdev() {
    local out i
    local -a words
    out=$(ip -4 route show default 2>/dev/null) || true
    read -r -a words <<<"${out%%$'\n'*}"
    for ((i = 0; i + 1 < ${#words[@]}; i++)); do
        if [[ ${words[i]} == dev ]]; then
            NETDEV=${words[i + 1]}
            return 0
        fi
    done
    return 1
}

# rxe (and, among the RDMA drivers, only rxe) exposes the name of its netdev
# in /sys/class/infiniband/DEV/parent.
is_rxe() { [[ -r $SYSIB/$1/parent ]]; }

# Sets PARENT to the netdev of rxe device $1 ("unknown" if unreadable).
rxe_parent() {
    PARENT=unknown
    read -r PARENT 2>/dev/null <"$SYSIB/$1/parent" || PARENT=unknown
}

# Sets RXE_ON to the rxe devices bound to netdev $1 (an array, maybe empty).
rxe_on_netdev() {
    local p dev
    RXE_ON=()
    for p in "$SYSIB"/*/parent; do
        [[ -r $p ]] || continue
        dev=${p%/parent}
        dev=${dev##*/}
        rxe_parent "$dev"
        [[ $PARENT == "$1" ]] && RXE_ON+=("$dev")
    done
    return 0
}

require_root() {
    [[ $EUID -eq 0 ]] || die "$1 needs root (CAP_NET_ADMIN/CAP_SYS_MODULE); re-run with sudo"
}

require_rdma_tool() {
    command -v rdma >/dev/null 2>&1 ||
        die "the 'rdma' tool was not found: install iproute2 (apt-get install iproute2)"
}

# The package that provides rdma_rxe for this distribution, as advice.
module_advice() {
    local id="" id_like="" arch
    if [[ -r /etc/os-release ]]; then
        # shellcheck disable=SC1091
        id=$(. /etc/os-release && printf '%s' "${ID:-}")
        # shellcheck disable=SC1091
        id_like=$(. /etc/os-release && printf '%s' "${ID_LIKE:-}")
    fi
    case " $id $id_like " in
        *" ubuntu "*)
            printf 'install it: apt-get install linux-modules-extra-%s' "$(uname -r)"
            ;;
        *" debian "*)
            arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
            printf "Debian's stock kernel has it: install linux-image-%s and boot it, or use scripts/softroce-vm.sh" "$arch"
            ;;
        *)
            printf 'use a kernel built with CONFIG_RDMA_RXE, or scripts/softroce-vm.sh'
            ;;
    esac
}

modprobe_quiet() { # best effort; for modules that may be built in or absent
    [[ -d /sys/module/$1 ]] && return 0
    command -v modprobe >/dev/null 2>&1 || return 0
    modprobe -q "$1" 2>/dev/null || true
}

load_rxe_module() {
    if [[ ! -d /sys/module/rdma_rxe ]]; then
        command -v modprobe >/dev/null 2>&1 ||
            die "modprobe not found (install kmod) and module rdma_rxe is not loaded"
        local err=""
        if ! err=$(modprobe rdma_rxe 2>&1); then
            # -n: dry run, succeeds if the module exists
            if modprobe -n -q rdma_rxe 2>/dev/null; then
                die "loading kernel module rdma_rxe failed: ${err//$'\n'/ }"
            fi
            die "kernel module rdma_rxe is not available for the running kernel $(uname -r); $(module_advice)"
        fi
    fi
    # Userspace verbs need ib_uverbs (/dev/infiniband/uverbsN); librdmacm needs
    # rdma_ucm (/dev/infiniband/rdma_cm).  udev loads them on full systems; do
    # it here for minimal ones (containers, the lab VM).
    modprobe_quiet ib_uverbs
    modprobe_quiet rdma_ucm
}

# Sets IPV4 to the (first) IPv4 address of netdev $1, without prefix length.
ipv4_of() {
    local out
    local -a f
    out=$(ip -4 -o addr show dev "$1" 2>/dev/null) || true
    # "2: eth0    inet 10.0.0.5/24 brd ... scope global eth0"
    read -r -a f <<<"${out%%$'\n'*}"
    [[ ${#f[@]} -ge 4 && ${f[2]} == inet ]] || return 1
    IPV4=${f[3]%/*}
}

# sysfs spelling of the IPv4-mapped GID ::ffff:a.b.c.d
mapped_gid_sysfs() {
    local a b c d
    IFS=. read -r a b c d <<<"$1"
    printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\n' "$a" "$b" "$c" "$d"
}

# Sets GID_INDEX to the RoCE v2 GID entry of device $1 whose value is $2 and
# whose netdev is $3.  Returns 1 if there is none (yet).
find_gid_index() {
    local dev=$1 want=$2 nd=$3 port_dir gid type ndev i
    local -a entries
    port_dir=$SYSIB/$dev/ports/$PORT
    entries=("$port_dir"/gids/*)
    # in numeric order: the used entries are at the start of the table
    for ((i = 0; i < ${#entries[@]}; i++)); do
        read -r gid 2>/dev/null <"$port_dir/gids/$i" || continue
        [[ $gid == "$want" ]] || continue
        read -r type 2>/dev/null <"$port_dir/gid_attrs/types/$i" || continue
        read -r ndev 2>/dev/null <"$port_dir/gid_attrs/ndevs/$i" || continue
        if [[ $type == "RoCE v2" && $ndev == "$nd" ]]; then
            GID_INDEX=$i
            return 0
        fi
    done
    return 1
}

# ---------------------------------------------------------------- teardown
teardown() {
    local -a targets=()
    local dev nd
    if [[ $NAME_GIVEN == 1 && -e $SYSIB/$NAME ]]; then
        is_rxe "$NAME" || die "'$NAME' is an RDMA device but not an rxe one; refusing to remove it"
        targets+=("$NAME")
    fi
    if [[ $NAME_GIVEN == 0 || $NETDEV_GIVEN == 1 ]]; then
        if [[ $NETDEV_GIVEN == 0 ]]; then
            default_route_netdev ||
                die "no default IPv4 route to pick the interface from: pass --netdev IFACE or --name NAME"
        fi
        rxe_on_netdev "$NETDEV"
        for dev in "${RXE_ON[@]}"; do
            [[ $dev == "${targets[0]:-}" ]] || targets+=("$dev")
        done
    fi
    if ((${#targets[@]} == 0)); then
        if [[ $NAME_GIVEN == 1 ]]; then
            info "no rxe device '$NAME'${NETDEV:+ or on $NETDEV}: nothing to remove"
        else
            info "no rxe device on $NETDEV: nothing to remove"
        fi
        return 0
    fi
    require_root "removing an rxe device"
    require_rdma_tool
    for dev in "${targets[@]}"; do
        rxe_parent "$dev"
        nd=$PARENT
        local err=""
        if ! err=$(rdma link delete "$dev" 2>&1); then
            # gone meanwhile (e.g. its netdev was deleted): that is the goal
            [[ -e $SYSIB/$dev ]] && die "rdma link delete $dev failed: ${err//$'\n'/ }"
        fi
        printf '%s netdev=%s removed\n' "$dev" "$nd"
    done
}

# ---------------------------------------------------------------- setup
wait_ready() { # $1=device; sets STATE, GID_INDEX
    local dev=$1 want tries state_file
    want=$(mapped_gid_sysfs "$IPV4")
    state_file=$SYSIB/$dev/ports/$PORT/state
    STATE=unknown
    for ((tries = TIMEOUT * 10; tries > 0; tries--)); do
        # "4: ACTIVE"
        read -r _ STATE 2>/dev/null <"$state_file" || STATE=unknown
        if [[ $STATE == ACTIVE ]] && find_gid_index "$dev" "$want" "$NETDEV"; then
            return 0
        fi
        sleep 0.1
    done
    local operstate=unknown
    read -r operstate 2>/dev/null <"$SYSNET/$NETDEV/operstate" || true
    if [[ $STATE != ACTIVE ]]; then
        die "timed out after ${TIMEOUT}s: port $PORT of $dev is $STATE, not ACTIVE (netdev $NETDEV operstate: $operstate)"
    fi
    die "timed out after ${TIMEOUT}s: $dev has no RoCE v2 GID for $IPV4 on $NETDEV (see $SYSIB/$dev/ports/$PORT/gids)"
}

setup() {
    if [[ $NETDEV_GIVEN == 0 ]]; then
        default_route_netdev ||
            die "no default IPv4 route to pick the interface from: pass --netdev IFACE"
    fi
    [[ -d $SYSNET/$NETDEV ]] || die "network interface '$NETDEV' does not exist"

    local dev="" flags
    rxe_on_netdev "$NETDEV"
    if ((${#RXE_ON[@]})); then
        dev=${RXE_ON[0]} # the kernel allows one rxe device per netdev
        if [[ $dev == "$NAME" ]]; then
            info "$dev already exists on $NETDEV: reusing it"
        else
            info "note: $NETDEV already has rxe device '$dev'; reusing it instead of creating '$NAME'"
        fi
    else
        if [[ -e $SYSIB/$NAME ]]; then
            if is_rxe "$NAME"; then
                rxe_parent "$NAME"
                die "rxe device '$NAME' already exists on $PARENT, not on $NETDEV: pick another --name or remove it with --teardown --name $NAME"
            fi
            die "an RDMA device named '$NAME' already exists (not rxe): pick another --name"
        fi
        require_root "creating an rxe device"
        require_rdma_tool
        load_rxe_module
    fi

    read -r flags <"$SYSNET/$NETDEV/flags"
    ((flags & 1)) || die "network interface $NETDEV is down: bring it up first (ip link set $NETDEV up)"
    ipv4_of "$NETDEV" ||
        die "network interface $NETDEV has no IPv4 address: RoCE v2 over IPv4 needs one (ip addr add A.B.C.D/N dev $NETDEV)"

    if [[ -z $dev ]]; then
        # rxe computes its ICRC with the kernel crypto "crc32"; in minimal
        # environments nothing autoloads it and `rdma link add` fails with ENOENT.
        # Built-in, or absent on kernels that use the crc32 library: ignore.
        modprobe_quiet crc32_generic
        local err=""
        if err=$(rdma link add "$NAME" type rxe netdev "$NETDEV" 2>&1); then
            dev=$NAME
            info "created $dev on $NETDEV"
        else
            # lost a race with a concurrent run?  Then reuse its device.
            rxe_on_netdev "$NETDEV"
            dev=${RXE_ON[0]:-}
            if [[ -z $dev ]]; then
                err=${err//$'\n'/ }
                [[ $err == *"No such file"* ]] && err+=" (is the crc32 crypto module available? try: modprobe crc32_generic)"
                die "rdma link add $NAME type rxe netdev $NETDEV failed: $err"
            fi
            info "$dev appeared on $NETDEV concurrently: reusing it"
        fi
    fi

    wait_ready "$dev"
    printf '%s netdev=%s port=%s state=%s roce_v2_gid_index=%s gid=::ffff:%s\n' \
        "$dev" "$NETDEV" "$PORT" "$STATE" "$GID_INDEX" "$IPV4"
}

# ---------------------------------------------------------------- local users
# RoCEv2 is UDP to port 4791, and rxe (like a RoCE NIC) accepts any packet with
# the right addresses, QPN, PSN and ICRC: a local user needs no privilege to
# send one with an ordinary UDP socket.  This rule lets only root's sockets send
# to that port.  rxe transmits through kernel sockets, which have no file and
# so no owner: nftables' `meta skuid` finds no uid there and the rule does not
# match (the expression "breaks"), so rxe's own traffic passes.  (iptables'
# owner match would need a positive range, `--uid-owner 1-4294967294`: its
# negated form `! --uid-owner 0` matches owner-less sockets and would drop rxe.)
NFT_FAMILY=inet
NFT_TABLE=secure_rdma_local
NFT_RULE='udp dport 4791 meta skuid != 0 counter drop'

require_nft() {
    command -v nft >/dev/null 2>&1 ||
        die "the 'nft' tool was not found: install nftables (apt-get install nftables)"
}

restrict_local() {
    require_root "--restrict-local"
    require_nft
    local err=""
    # One transaction: create the table if missing (so the delete cannot fail),
    # delete it, and add it afresh; running it again leaves the same one rule.
    if ! err=$(nft -f - 2>&1 <<NFT_EOF
table $NFT_FAMILY $NFT_TABLE
delete table $NFT_FAMILY $NFT_TABLE
table $NFT_FAMILY $NFT_TABLE {
    chain output {
        type filter hook output priority filter; policy accept;
        $NFT_RULE comment "only root may send RoCEv2 (setup-softroce.sh --restrict-local)"
    }
}
NFT_EOF
    ); then
        die "adding the nftables rule failed: ${err//$'\n'/ } (is nf_tables available? try: modprobe nf_tables)"
    fi
    info "local users other than root can no longer send to UDP 4791; remove with --unrestrict-local"
    [[ $QUIET == 1 ]] || nft list table "$NFT_FAMILY" "$NFT_TABLE" >&2 || true
    printf 'restrict-local on table=%s/%s rule="%s"\n' "$NFT_FAMILY" "$NFT_TABLE" "$NFT_RULE"
}

unrestrict_local() {
    require_root "--unrestrict-local"
    require_nft
    local err=""
    if ! err=$(printf 'table %s %s\ndelete table %s %s\n' \
        "$NFT_FAMILY" "$NFT_TABLE" "$NFT_FAMILY" "$NFT_TABLE" | nft -f - 2>&1); then
        die "removing the nftables table $NFT_FAMILY $NFT_TABLE failed: ${err//$'\n'/ }"
    fi
    printf 'restrict-local off table=%s/%s\n' "$NFT_FAMILY" "$NFT_TABLE"
}

if [[ $DEVICE_ACTION == 1 ]]; then
    if [[ $TEARDOWN == 1 ]]; then
        teardown
    else
        setup
    fi
fi
case $RESTRICT in
    on) restrict_local ;;
    off) unrestrict_local ;;
esac
