#!/usr/bin/env bash
# softroce-vm.sh - run a command inside a throw-away VM that has Soft-RoCE.
#
# Many kernels (containers, CI runners, custom cloud kernels) have no rdma_rxe.
# This script boots Debian's stock kernel (which ships rdma_rxe, kprobes, BTF
# and the rdma cgroup) under QEMU on top of this host's own root filesystem,
# sets up a two-ended Soft-RoCE lab in it, runs CMD as root, streams CMD's
# stdout/stderr back and exits with CMD's exit status.  Run `--help` for usage.
#
# How it works (measured on a 2-core TCG host; see --help for the knobs):
#  * Kernel: /boot/vmlinuz-$KVER; the uncompressed vmlinux is extracted once
#    into the cache and booted through its PVH entry point, which skips the
#    bzImage decompressor (~2 s under TCG).  Falls back to the bzImage.
#  * Accelerator: TCG unless a real VMX/SVM /dev/kvm is usable.  A /dev/kvm
#    backed by kvm_pvm (nested "PVM") runs stock kernels extremely slowly.
#    Under TCG `-cpu Nehalem` gives twice the rxe bandwidth of `-cpu max`
#    (PCLMUL/AVX2 code paths are slow to emulate).
#  * Root fs: host "/" over virtio-9p, read-only, with tmpfs overlays on
#    /etc /var /tmp /root /home /opt /srv /usr (guest changes are discarded).
#    The repository root (the directory above scripts/) and every VM_RW
#    directory are mounted read-write at the same path, so results come back.
#  * I/O: CMD's stdout/stderr travel over two virtio-serial ports into FIFOs
#    read on the host; its exit status comes back in a file on a 9p share.
#  * Boot: a tiny initramfs (static busybox + the virtio/9p/overlay modules)
#    mounts everything and switch_roots into the host's bash.  It is cached,
#    keyed by this script's checksum, the kernel version and the busybox binary.
#
# Installing linux-image-amd64 on the host only provides the kernel image and
# modules the VM boots; it does not change the kernel the host itself runs.

set -euo pipefail

PROG=softroce-vm

# Locate ourselves (works through symlinks and `bash path/to/softroce-vm.sh`).
SELF=$(readlink -f -- "${BASH_SOURCE[0]}")
SCRIPT_DIR=$(dirname -- "$SELF")
REPO_ROOT=$(dirname -- "$SCRIPT_DIR")
SETUP_SCRIPT=$SCRIPT_DIR/setup-softroce.sh

usage() {
    cat <<'EOF'
Usage: softroce-vm.sh [options] [--] CMD...
       softroce-vm.sh --install-only

Run CMD (all arguments joined with spaces and run by bash, like ssh) as root
inside a throw-away QEMU VM that boots Debian's stock kernel (it ships rdma_rxe)
on this host's own root filesystem.  CMD's stdout and stderr are streamed back;
the exit status is CMD's.  Before CMD runs, a two-ended Soft-RoCE lab is set up.

Options:
  --no-lab        plain VM: skip the lab setup below
  --install-only  install the missing host packages, then exit (for CI images)
  -h, --help      show this help

The lab (unless --no-lab), in the VM's own (initial) network namespace:
  veth-a 10.77.0.1/24  <-- veth pair -->  veth-b 10.77.0.2/24
  rxe-a on veth-a                         rxe-b on veth-b
  RoCE v2 GIDs ::ffff:10.77.0.1 / ::ffff:10.77.0.2 (GID index 1 on 6.1)
  Policy routing makes traffic between the two addresses cross the veth pair
  (as between two hosts), so XDP/TC programs on the veths see every packet:
    ip rule: 10 iif lo to 10.77.0.2 lookup 102; 11 iif lo to 10.77.0.1 lookup 101;
             100 lookup local (moved from 0)
  accept_local=1 and rp_filter=0 on all/veth-a/veth-b.
  Both devices are created by scripts/setup-softroce.sh (the script users run);
  its result lines are in /run/softroce-lab inside the VM, e.g.
    rxe-a netdev=veth-a port=1 state=ACTIVE roce_v2_gid_index=1 gid=::ffff:10.77.0.1
    table 102: 10.77.0.2 dev veth-a src 10.77.0.1
    table 101: 10.77.0.1 dev veth-b src 10.77.0.2
  CMD sees SOFTROCE_LAB=1.  If the lab setup fails, CMD does not run.
  Measured on 6.1: rxe in a non-initial network namespace connects but moves
  no data; QPs on the same rxe device loop back inside rxe and never reach a
  netdev; rdma_cm does not work on 127.0.0.1 (use the veth addresses).

Inside the VM:
  * CMD runs as root in the caller's working directory, with stdin from
    /dev/null and `ulimit -l unlimited`; SOFTROCE_VM=1 is set.
  * Writable and kept: the repository root and VM_RW directories.  Writable
    but discarded: /etc /var /tmp /root /home /opt /srv /usr /run.  The rest
    of the host filesystem is read-only.
  * Mounted: proc, sysfs, devtmpfs, devpts, /dev/shm, mqueue, cgroup2, bpffs,
    tracefs (/sys/kernel/tracing) and debugfs; lo is up.  No network to the
    outside, no udev, no systemd.
  * PATH = /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    followed by the host's PATH without pyenv shims (the pyenv python3 shim
    takes 6-13 s to start in the VM; call interpreters by their real path).
  * Exported from the host when set: CI RUST_LOG RUST_BACKTRACE
    CARGO_TARGET_DIR, SECURE_RDMA_*, and the names listed in VM_PASS_ENV.
  * Process start-up costs ~20 ms under TCG: build on the host (cargo build,
    cargo test --no-run) and run the binaries in the VM; wrap servers and
    clients in `timeout`, and wait for ports with `ss -ltn` rather than sleep.
    A large binary on the (uncached) read-write share is read again at each
    start: give its directory in VM_CACHED.

Environment knobs:
  VM_RW=dir1:dir2    extra host directories mounted read-write at the same path
  VM_CACHED=d1:d2    directories inside a read-write share that the VM sees
                     read-only, as they were at boot, through the cached root
                     mount instead: for build outputs it only runs.  A read-write
                     share is uncached, so a 100 MB debug binary on it takes about
                     1.2 s to start under TCG, against 0.45 s cached
  VM_MEM=2G          guest memory              VM_CPUS=2   guest vCPUs
  VM_TIMEOUT=900     host-side limit for the whole run, in seconds
  VM_ACCEL=auto      auto|tcg|kvm (auto: kvm only with real VMX/SVM, not kvm_pvm)
  VM_CPU             qemu -cpu model (default Nehalem under tcg,
                     host,-arch-capabilities under kvm)
  VM_KVER            kernel version whose /boot/vmlinuz-* and /lib/modules/* are
                     used (default: the newest /boot/vmlinuz-*-amd64 whose modules
                     include drivers/infiniband/sw/rxe)
  VM_KERNEL=path     boot this kernel image instead (modules still from VM_KVER)
  VM_APPEND="..."    extra kernel command-line arguments
  VM_VERBOSE=1       print timings, the lab log and the console/qemu log tails
  VM_DMESG=file      save the guest's dmesg to file after the run
  VM_PASS_ENV="A B"  extra host environment variables to export into the VM
  VM_CACHE=dir       cache for the initramfs and vmlinux
                     (default ${XDG_CACHE_HOME:-~/.cache}/softroce-vm)

Host packages (installed with apt-get when missing; needs root):
  qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-utils
  ibverbs-providers perftest iproute2 cpio kmod binutils xz-utils
  (linux-image-amd64 only provides the VM's kernel and modules; the host keeps
  running its own kernel.  Where that package does not exist, e.g. Ubuntu,
  linux-modules-extra-$(uname -r) is installed and the host's kernel is booted.)

Exit status:
  CMD's exit status, or
  2    usage error or host-side problem (e.g. no usable kernel), VM not started
  123  the lab setup failed inside the VM; CMD did not run
  124  VM_TIMEOUT expired (the VM was killed)
  125  the VM stopped without reporting CMD's exit status
  130  interrupted (SIGINT/SIGTERM/SIGHUP); the VM was stopped

Examples:
  scripts/softroce-vm.sh 'rdma link show'
  scripts/softroce-vm.sh 'timeout 60 ibv_rc_pingpong -d rxe-a -g 1 & s=$!
      for i in $(seq 100); do ss -ltn | grep -q :18515 && break; sleep 0.1; done
      timeout 60 ibv_rc_pingpong -d rxe-b -g 1 10.77.0.1 && wait $s'
  scripts/softroce-vm.sh --no-lab 'uname -r'
  VM_RW=/tmp/results scripts/softroce-vm.sh 'ip -s link show veth-a > /tmp/results/veth-a.txt'
EOF
}

die() { # host-side problem before the VM started
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}
usage_error() {
    printf '%s: %s (see --help)\n' "$PROG" "$*" >&2
    exit 2
}
note() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# ---------------------------------------------------------------- arguments
LAB=1
INSTALL_ONLY=0
while (($#)); do
    case $1 in
        --no-lab) LAB=0 && shift ;;
        --install-only) INSTALL_ONLY=1 && shift ;;
        -h | --help) usage && exit 0 ;;
        --) shift && break ;;
        -*) usage_error "unknown option '$1'" ;;
        *) break ;;
    esac
done
CMD="$*"
if [[ $INSTALL_ONLY == 0 && -z ${CMD//[[:space:]]/} ]]; then
    usage_error "no command given"
fi

MEM=${VM_MEM:-2G}
CPUS=${VM_CPUS:-2}
TMO=${VM_TIMEOUT:-900}
VERBOSE=${VM_VERBOSE:-0}
CACHE=${VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/softroce-vm}
QEMU=qemu-system-x86_64
[[ $TMO =~ ^[0-9]+$ ]] || usage_error "VM_TIMEOUT must be a number of seconds, not '$TMO'"
[[ $CPUS =~ ^[0-9]+$ ]] || usage_error "VM_CPUS must be a number, not '$CPUS'"

# ---------------------------------------------------------------- host packages
# Newest kernel version with an rxe module: *-amd64 (Debian's stock kernel)
# first, any other /boot/vmlinuz-* second.  Sets KVER.
pick_kver() {
    if [[ -n ${VM_KVER:-} ]]; then
        KVER=$VM_KVER
        return 0
    fi
    local f k pattern
    local -a found
    for pattern in '/boot/vmlinuz-*-amd64' '/boot/vmlinuz-*'; do
        found=()
        for f in $pattern; do
            [[ -e $f ]] || continue
            k=${f#/boot/vmlinuz-}
            [[ -d /lib/modules/$k/kernel/drivers/infiniband/sw/rxe ]] && found+=("$k")
        done
        if ((${#found[@]})); then
            KVER=$(printf '%s\n' "${found[@]}" | sort -V | tail -n 1)
            return 0
        fi
    done
    return 1
}

static_busybox() { # prints the path of a statically linked busybox
    local b out
    for b in "$(command -v busybox 2>/dev/null || true)" /bin/busybox /usr/bin/busybox; do
        [[ -n $b && -x $b ]] || continue
        out=$(LC_ALL=C ldd "$b" 2>&1 || true) # exit status 1 for static binaries
        if [[ $out == *"not a dynamic executable"* || $out == *"statically linked"* ]]; then
            printf '%s\n' "$b"
            return 0
        fi
    done
    return 1
}

# Fills MISSING with the packages to install.
find_missing() {
    MISSING=()
    command -v "$QEMU" >/dev/null 2>&1 || MISSING+=(qemu-system-x86)
    static_busybox >/dev/null || MISSING+=(busybox-static)
    command -v cpio >/dev/null 2>&1 || MISSING+=(cpio)
    command -v modprobe >/dev/null 2>&1 || MISSING+=(kmod)
    command -v readelf >/dev/null 2>&1 || MISSING+=(binutils) # vmlinux extraction
    command -v xz >/dev/null 2>&1 || MISSING+=(xz-utils)      # Debian's vmlinuz is xz
    # used inside the VM (they live on the shared root filesystem)
    local -a guest_pkgs=(rdma-core ibverbs-utils ibverbs-providers perftest iproute2)
    local p st
    if command -v dpkg-query >/dev/null 2>&1; then
        local -A ok=()
        while read -r p st; do
            [[ $st == ii ]] && ok[$p]=1
        done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${guest_pkgs[@]}" 2>/dev/null || true)
        for p in "${guest_pkgs[@]}"; do
            [[ -n ${ok[$p]:-} ]] || MISSING+=("$p")
        done
    else
        command -v ibv_rc_pingpong >/dev/null 2>&1 || MISSING+=(ibverbs-utils)
        command -v rdma >/dev/null 2>&1 || MISSING+=(iproute2)
    fi
    NEED_KERNEL=0
    if [[ -z ${VM_KVER:-} ]] && ! pick_kver; then
        NEED_KERNEL=1
    fi
}

# The package that provides a kernel with rdma_rxe (needs fresh apt lists).
kernel_package() {
    local arch pkg policy
    arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
    for pkg in "linux-image-$arch" "linux-modules-extra-$(uname -r)"; do
        policy=$(apt-cache policy "$pkg" 2>/dev/null || true)
        if [[ $policy == *"Candidate: "[0-9]* ]]; then
            printf '%s\n' "$pkg"
            return 0
        fi
    done
    return 1
}

install_missing() {
    find_missing
    if ((${#MISSING[@]} == 0 && NEED_KERNEL == 0)); then
        return 0
    fi
    local what="${MISSING[*]}"
    ((NEED_KERNEL)) && what+="${what:+ }linux-image-amd64"
    [[ $EUID -eq 0 ]] || die "missing on this host: $what; run as root to install them, or: sudo apt-get install $what"
    command -v apt-get >/dev/null 2>&1 || die "missing on this host: $what (and apt-get is not available to install them)"
    note "installing missing host packages: $what"
    apt-get update -q >&2 || die "apt-get update failed"
    if ((NEED_KERNEL)); then
        local kpkg
        kpkg=$(kernel_package) ||
            die "no kernel with rdma_rxe found under /boot and no package provides one (tried linux-image-amd64, linux-modules-extra-$(uname -r)); set VM_KVER"
        MISSING+=("$kpkg")
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${MISSING[@]}" >&2 ||
        die "apt-get install ${MISSING[*]} failed"
    find_missing
    if ((${#MISSING[@]} || NEED_KERNEL)); then
        die "still missing after installation: ${MISSING[*]}$( ((NEED_KERNEL)) && echo ' a kernel with rdma_rxe')"
    fi
}

install_missing
if [[ $INSTALL_ONLY == 1 ]]; then
    pick_kver || true
    note "host ready (VM kernel ${KVER:-?})"
    exit 0
fi

pick_kver || die "no /boot/vmlinuz-* with an rxe module under /lib/modules; install linux-image-amd64 or set VM_KVER"
KIMAGE=/boot/vmlinuz-$KVER
[[ -n ${VM_KERNEL:-} || -r $KIMAGE ]] || die "kernel image $KIMAGE is not readable"
[[ -z ${VM_KERNEL:-} || -r $VM_KERNEL ]] || die "VM_KERNEL=$VM_KERNEL is not readable"
[[ -f /lib/modules/$KVER/modules.dep ]] || die "/lib/modules/$KVER/modules.dep is missing (run depmod $KVER)"
BUSYBOX=$(static_busybox) || die "no statically linked busybox (install busybox-static)"
if [[ $LAB == 1 && ! -r $SETUP_SCRIPT ]]; then
    die "$SETUP_SCRIPT not found (it sets up the lab; use --no-lab to skip)"
fi
mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE"

# ---------------------------------------------------------------- kernel
# Find the compressed payload in the bzImage, decompress it and keep it if it
# is an ELF with a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY, type 0x12).
extract_vmlinux() { # $1=bzImage $2=output
    local img=$1 out=$2 tmp="$2.tmp.$$" spec magic cmd off notes
    for spec in 'xz|\xfd7zXZ\x00|xz -dc' 'zstd|\x28\xb5\x2f\xfd|zstd -dc' \
        'gzip|\x1f\x8b\x08|gzip -dc' 'lz4|\x02\x21\x4c\x18|lz4 -dc'; do
        IFS='|' read -r _ magic cmd <<<"$spec"
        command -v "${cmd%% *}" >/dev/null 2>&1 || continue
        for off in $(LC_ALL=C grep -obUaP "$magic" "$img" 2>/dev/null | cut -d: -f1 | head -n 3); do
            # trailing data after the stream makes the decompressor complain: ignore
            tail -c +$((off + 1)) "$img" | $cmd >"$tmp" 2>/dev/null || true
            notes=$(readelf -n "$tmp" 2>/dev/null || true)
            if [[ $notes == *0x00000012* || $notes == *PHYS32_ENTRY* ]]; then
                mv -f "$tmp" "$out"
                return 0
            fi
        done
    done
    rm -f "$tmp"
    return 1
}
if [[ -n ${VM_KERNEL:-} ]]; then
    KERNEL=$VM_KERNEL
else
    KERNEL=$CACHE/vmlinux-$KVER
    if [[ ! -s $KERNEL || $KIMAGE -nt $KERNEL ]]; then
        extract_vmlinux "$KIMAGE" "$KERNEL" || KERNEL=$KIMAGE
    fi
fi

# ---------------------------------------------------------------- accelerator
ACCEL=${VM_ACCEL:-auto}
if [[ $ACCEL == auto ]]; then
    ACCEL=tcg
    # kvm_pvm only runs PVM-enlightened guests at speed; a stock kernel crawls.
    if [[ -w /dev/kvm && ! -d /sys/module/kvm_pvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
        ACCEL=kvm
    fi
fi
case $ACCEL in
    kvm) ACCEL_OPTS=(-accel kvm -cpu "${VM_CPU:-host,-arch-capabilities}") ;;
    tcg) ACCEL_OPTS=(-accel "tcg,thread=multi" -cpu "${VM_CPU:-Nehalem}") ;;
    *) usage_error "VM_ACCEL must be auto, tcg or kvm, not '$ACCEL'" ;;
esac

# ---------------------------------------------------------------- initramfs
# Stage 1 (/init): static busybox in the initramfs.  Loads the virtio/9p/
# overlay modules, mounts host "/" read-only with tmpfs overlays, the control
# share and the read-write shares, the pseudo filesystems, finds the
# virtio-serial ports and switch_roots into stage 2.
write_stage1() {
    cat <<'INIT_EOF'
#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m || echo "vm-init: insmod $m failed"; done
R=/newroot
P9="trans=virtio,version=9p2000.L,msize=512000"
n=0
until mount -t 9p -o $P9,ro,cache=loose hostroot $R; do
    n=$((n+1)); [ $n -gt 50 ] && { echo "vm-init: cannot mount the host root"; echo o > /proc/sysrq-trigger; }
    sleep 0.1
done
mount -t tmpfs -o mode=755 run $R/run
mkdir -p $R/run/vmctl $R/run/ovl
mount -t 9p -o $P9 vmctl $R/run/vmctl
for p in etc var tmp root home opt srv usr; do
    [ -d $R/$p ] || continue
    mkdir -p $R/run/ovl/$p/u $R/run/ovl/$p/w
    mount -t overlay ovl_$p -o lowerdir=$R/$p,upperdir=$R/run/ovl/$p/u,workdir=$R/run/ovl/$p/w $R/$p \
        || echo "vm-init: overlay on /$p failed"
done
chmod 1777 $R/tmp $R/var/tmp 2>/dev/null
# VM_CACHED: bind the cached read-only view of each directory aside before a
# read-write share hides it, and back over that share afterwards.
i=0
while read -r path; do
    mkdir -p $R/run/cached/$i
    mount --bind "$R$path" $R/run/cached/$i || echo "vm-init: cached view of $path failed"
    i=$((i+1))
done < $R/run/vmctl/cached
while read -r tag path; do
    mount -t 9p -o $P9 "$tag" "$R$path" || echo "vm-init: read-write mount of $path failed"
done < $R/run/vmctl/rwdirs
i=0
while read -r path; do
    if grep -q " $R/run/cached/$i " /proc/mounts; then
        mount --bind $R/run/cached/$i "$R$path" && mount -o remount,bind,ro "$R$path" ||
            echo "vm-init: cached view of $path failed"
        umount $R/run/cached/$i
    fi
    i=$((i+1))
done < $R/run/vmctl/cached
mount --move /proc $R/proc; mount --move /sys $R/sys; mount --move /dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm $R/dev/mqueue $R/run/lock $R/run/netns
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t mqueue mqueue $R/dev/mqueue
ln -sf /proc/self/fd $R/dev/fd; ln -sf /proc/self/fd/0 $R/dev/stdin
ln -sf /proc/self/fd/1 $R/dev/stdout; ln -sf /proc/self/fd/2 $R/dev/stderr
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup
mount -t debugfs debugfs $R/sys/kernel/debug
mount -t tracefs tracefs $R/sys/kernel/tracing
mount -t bpf bpf $R/sys/fs/bpf
# securityfs: rdma-monitor --kernel-limit reads the active LSMs there to say why it cannot attach.
mount -t securityfs securityfs $R/sys/kernel/security
ip link set lo up
hostname softroce-vm
OUT=/dev/null; ERR=/dev/null; n=0
while [ $n -lt 50 ]; do
    for p in $R/sys/class/virtio-ports/*; do
        [ -e "$p/name" ] || continue
        case "$(cat "$p/name")" in
            vm.stdout) OUT=/dev/${p##*/} ;;
            vm.stderr) ERR=/dev/${p##*/} ;;
        esac
    done
    [ "$OUT" != /dev/null ] && [ "$ERR" != /dev/null ] && break
    n=$((n+1)); sleep 0.1
done
echo "OUT=$OUT ERR=$ERR" > $R/run/vmports
cp /stage2 $R/run/vm-stage2; chmod 755 $R/run/vm-stage2
exec switch_root $R /run/vm-stage2
INIT_EOF
}

# Stage 2: the host's bash on the host's root.  Runs the lab setup (if
# requested), then CMD, records timings and the exit status in the control
# share and powers off.  Few forks: every exec costs ~20 ms under TCG.
write_stage2() {
    cat <<'STAGE2_EOF'
#!/bin/bash
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
. /run/vmports
ulimit -l unlimited; ulimit -n 65536
C=/run/vmctl
read -r up _ < /proc/uptime; echo "$up" > $C/t_boot
. $C/env
rc=0
if [ -f $C/lab.sh ]; then
    /bin/bash $C/lab.sh < /dev/null > $C/lab.log 2>&1
    lab_rc=$?
    echo $lab_rc > $C/lab_rc
    [ $lab_rc = 0 ] && export SOFTROCE_LAB=1 || rc=123
fi
read -r up _ < /proc/uptime; echo "$up" > $C/t_start
if [ $rc = 0 ]; then
    read -r cwd < $C/cwd
    cd "$cwd" 2>/dev/null || { echo "softroce-vm: warning: $cwd does not exist in the VM; running in /" > "$ERR"; cd /; }
    /bin/bash $C/cmd.sh < /dev/null > "$OUT" 2> "$ERR"
    rc=$?
fi
read -r up _ < /proc/uptime; echo "$up" > $C/t_end
echo $rc > $C/rc
[ -f $C/want_dmesg ] && dmesg > $C/dmesg.txt 2>/dev/null
sync
echo o > /proc/sysrq-trigger
sleep 2; echo b > /proc/sysrq-trigger
STAGE2_EOF
}

# Copy the modules stage 1 needs (and their dependencies, in load order),
# decompressed: busybox insmod does not read .ko.xz/.ko.zst/.ko.gz.
copy_modules() { # $1=destination dir; writes $1/order
    local dst=$1 m f base
    local -a files=()
    local -A seen=()
    for m in virtio_pci 9pnet_virtio 9p overlay virtio_console; do
        while read -r f; do
            [[ -n ${seen[$f]:-} ]] && continue
            seen[$f]=1
            files+=("$f")
        done < <(modprobe -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" { print $2 }')
    done
    : >"$dst/order"
    for f in "${files[@]}"; do
        base=${f##*/}
        case $f in
            *.ko) cp "$f" "$dst/$base" ;;
            *.ko.xz) base=${base%.xz} && xz -dc "$f" >"$dst/$base" ;;
            *.ko.zst) base=${base%.zst} && zstd -dc "$f" >"$dst/$base" ;;
            *.ko.gz) base=${base%.gz} && gzip -dc "$f" >"$dst/$base" ;;
            *) return 1 ;;
        esac || return 1
        printf '%s\n' "$base" >>"$dst/order"
    done
}

build_initramfs() { # $1=output
    local d out=$1
    d=$(mktemp -d) || return 1
    mkdir -p "$d"/{bin,mods,proc,sys,dev,newroot} &&
        cp "$BUSYBOX" "$d/bin/busybox" &&
        ln -s busybox "$d/bin/sh" &&
        copy_modules "$d/mods" &&
        write_stage1 >"$d/init" &&
        write_stage2 >"$d/stage2" &&
        chmod 755 "$d/init" "$d/stage2" &&
        (cd "$d" && find . | cpio -o -H newc --quiet | gzip -1) >"$out.tmp.$$" &&
        mv -f "$out.tmp.$$" "$out"
    local rc=$?
    rm -rf "$d" "$out.tmp.$$"
    return $rc
}

INITRD_KEY=$({
    cat "$SELF"
    printf '%s\n' "$KVER" "$BUSYBOX"
    stat -L -c '%Y %s' "$BUSYBOX" "/lib/modules/$KVER/modules.dep"
} | sha1sum | cut -c1-12)
INITRD=$CACHE/initramfs-softroce-vm-$KVER-$INITRD_KEY.cpio.gz
if [[ ! -s $INITRD ]]; then
    build_initramfs "$INITRD" || die "building the initramfs $INITRD failed"
    # drop images built by older versions of this script (not in use any more)
    find "$CACHE" -maxdepth 1 -name 'initramfs-softroce-vm-*.cpio.gz' ! -newer "$INITRD" \
        ! -name "${INITRD##*/}" -mmin +60 -delete 2>/dev/null || true
fi

# ---------------------------------------------------------------- per-run files
T=$(mktemp -d "${TMPDIR:-/tmp}/softroce-vm.XXXXXX") || die "mktemp failed"
CAT_PIDS=()
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
    local p
    for p in "${CAT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$T"
}
trap cleanup EXIT
mkdir -p "$T/ctl"
printf '%s\n' "$CMD" >"$T/ctl/cmd.sh"
printf '%s\n' "$PWD" >"$T/ctl/cwd"
if [[ -n ${VM_DMESG:-} ]]; then
    : >"$T/ctl/want_dmesg"
fi

# PATH in the VM: system directories first, then the host's PATH without pyenv
# shims (the pyenv python3 shim takes 6-13 s to start under TCG).
vm_path() {
    local out=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin d
    local -a parts
    IFS=: read -r -a parts <<<"${PATH:-}"
    for d in "${parts[@]}"; do
        [[ -n $d && $d == /* ]] || continue
        [[ $d == *pyenv*/shims || (-n ${PYENV_ROOT:-} && $d == "$PYENV_ROOT"/shims) ]] && continue
        [[ :$out: == *:"$d":* ]] || out+=:$d
    done
    printf '%s\n' "$out"
}

{
    printf 'export PATH=%q\n' "$(vm_path)"
    printf 'export HOME=/root TERM=dumb LANG=C.UTF-8 SOFTROCE_VM=1\n'
    declare -a pass=(CI RUST_LOG RUST_BACKTRACE CARGO_TARGET_DIR)
    for v in $(compgen -e); do
        if [[ $v == SECURE_RDMA_* ]]; then
            pass+=("$v")
        fi
    done
    read -r -a extra <<<"${VM_PASS_ENV:-}"
    pass+=("${extra[@]}")
    for v in "${pass[@]}"; do
        if [[ ! $v =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
            note "warning: VM_PASS_ENV: '$v' is not a variable name; ignored"
            continue
        fi
        if [[ -n ${!v+x} ]]; then
            printf 'export %s=%q\n' "$v" "${!v}"
        fi
    done
} >"$T/ctl/env"

if [[ $LAB == 1 ]]; then
    # The two-ends lab: two rxe devices that behave like two hosts.
    {
        printf 'SETUP=%q\n' "$SETUP_SCRIPT"
        cat <<'LAB_EOF'
set -eu
step="veth pair, addresses and policy routing"
trap 'echo "softroce-vm: lab setup failed at: $step" >&2' ERR
# Locally generated traffic to the peer address must leave through the veth
# instead of lo (the local table normally wins at pref 0), or rxe QPs fail RTR.
ip -batch - <<'IP_EOF'
link add veth-a type veth peer name veth-b
addr add 10.77.0.1/24 dev veth-a
addr add 10.77.0.2/24 dev veth-b
link set veth-a up
link set veth-b up
rule add pref 100 lookup local
rule del pref 0
rule add pref 10 iif lo to 10.77.0.2 lookup 102
rule add pref 11 iif lo to 10.77.0.1 lookup 101
route add 10.77.0.2 dev veth-a src 10.77.0.1 table 102
route add 10.77.0.1 dev veth-b src 10.77.0.2 table 101
IP_EOF
step="sysctls accept_local=1 rp_filter=0"
for i in all veth-a veth-b; do
    echo 1 > /proc/sys/net/ipv4/conf/$i/accept_local
    echo 0 > /proc/sys/net/ipv4/conf/$i/rp_filter
done
step="setup-softroce.sh --netdev veth-a --name rxe-a"
/bin/bash "$SETUP" --netdev veth-a --name rxe-a --quiet > /run/softroce-lab
step="setup-softroce.sh --netdev veth-b --name rxe-b"
/bin/bash "$SETUP" --netdev veth-b --name rxe-b --quiet >> /run/softroce-lab
cat /run/softroce-lab
LAB_EOF
    } >"$T/ctl/lab.sh"
fi

# ---------------------------------------------------------------- shares
FS_OPTS=(-fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
    -device "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot"
    -fsdev "local,id=vmctl,path=${T//,/,,}/ctl,security_model=none,multidevs=remap"
    -device "virtio-9p-pci,fsdev=vmctl,mount_tag=vmctl")
# Read-write shares: the repository root and VM_RW.  A directory inside
# another one is already covered; parents are mounted before children.
RW_DIRS=()
add_rw() {
    local dir
    if ! dir=$(realpath -e -- "$1" 2>/dev/null) || [[ ! -d $dir ]]; then
        die "read-write directory '$1' does not exist (VM_RW entries must be existing directories)"
    fi
    [[ $dir != / ]] || die "VM_RW must not contain / (the host root is shared read-only)"
    [[ $dir != *$'\n'* ]] || die "read-write directory names must not contain newlines"
    RW_DIRS+=("$dir")
}
add_rw "$REPO_ROOT"
IFS=: read -r -a VM_RW_LIST <<<"${VM_RW:-}"
for dir in "${VM_RW_LIST[@]}"; do
    if [[ -n $dir ]]; then
        add_rw "$dir"
    fi
done
: >"$T/ctl/rwdirs"
i=0
while read -r dir; do
    covered=0
    while read -r _ mounted; do
        [[ $dir == "$mounted" || $dir == "$mounted"/* ]] && covered=1
    done <"$T/ctl/rwdirs"
    ((covered)) && continue
    FS_OPTS+=(-fsdev "local,id=rw$i,path=${dir//,/,,},security_model=none,multidevs=remap"
        -device "virtio-9p-pci,fsdev=rw$i,mount_tag=rw$i")
    printf 'rw%s %s\n' "$i" "$dir" >>"$T/ctl/rwdirs"
    i=$((i + 1))
done < <(printf '%s\n' "${RW_DIRS[@]}" | awk '{ print length($0) "\t" $0 }' | sort -n -s | cut -f2-)
# VM_CACHED: directories the VM sees through the cached read-only root mount.
: >"$T/ctl/cached"
IFS=: read -r -a VM_CACHED_LIST <<<"${VM_CACHED:-}"
for dir in "${VM_CACHED_LIST[@]}"; do
    [[ -n $dir ]] || continue
    [[ -d $dir ]] || die "cached directory '$dir' does not exist (VM_CACHED entries must be existing directories)"
    dir=$(readlink -f -- "$dir")
    [[ $dir != *$'\n'* ]] || die "cached directory names must not contain newlines"
    printf '%s\n' "$dir" >>"$T/ctl/cached"
done

# ---------------------------------------------------------------- run
mkfifo "$T/out.fifo" "$T/err.fifo"
# If our stdout/stderr goes away (`softroce-vm.sh CMD | head`), the first cat
# dies of SIGPIPE (hence `|| true` under set -e) and the second one keeps
# draining the FIFO: otherwise the guest would block on the full virtio port
# until VM_TIMEOUT.
(cat || true; exec cat >/dev/null) <"$T/out.fifo" &
CAT_PIDS+=($!)
(cat >&2 || true; exec cat >/dev/null) <"$T/err.fifo" &
CAT_PIDS+=($!)

APPEND="console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init mitigations=off"
APPEND+=" rcupdate.rcu_cpu_stall_suppress=1 ${VM_APPEND:-}"
T0=$(date +%s.%N)
timeout --kill-after=10 "$TMO" "$QEMU" -name softroce-vm -machine q35 "${ACCEL_OPTS[@]}" \
    -smp "$CPUS" -m "$MEM" -nodefaults -no-user-config -display none -vga none -no-reboot \
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" \
    -chardev "file,id=con,path=${T//,/,,}/console.log" -serial chardev:con \
    "${FS_OPTS[@]}" \
    -device virtio-serial-pci,id=vser \
    -chardev "file,id=vout,path=${T//,/,,}/out.fifo" -device virtserialport,bus=vser.0,chardev=vout,name=vm.stdout \
    -chardev "file,id=verr,path=${T//,/,,}/err.fifo" -device virtserialport,bus=vser.0,chardev=verr,name=vm.stderr \
    </dev/null >"$T/qemu.log" 2>&1 &
QPID=$!
# Ctrl-C / SIGTERM must not leave an orphaned VM behind.
INTR=0
trap 'INTR=1; kill -TERM "$QPID" 2>/dev/null || true' INT TERM HUP
QRC=0
wait "$QPID" || QRC=$?
while kill -0 "$QPID" 2>/dev/null; do
    QRC=0
    wait "$QPID" || QRC=$?
done
trap - INT TERM HUP
T1=$(date +%s.%N)
# Unblock the readers if qemu never opened the FIFOs (an O_RDWR open never blocks).
{ exec 3<>"$T/out.fifo" 4<>"$T/err.fifo"; } 2>/dev/null || true
exec 3>&- 4>&-
wait "${CAT_PIDS[@]}" 2>/dev/null || true
CAT_PIDS=()

read_file() { # $1=file; prints its first line or nothing
    local v=""
    [[ -s $1 ]] && read -r v <"$1"
    printf '%s' "$v"
}
RC=$(read_file "$T/ctl/rc")
LAB_RC=$(read_file "$T/ctl/lab_rc")
if [[ -n $RC ]]; then
    if [[ -n $LAB_RC && $LAB_RC != 0 ]]; then
        note "lab setup failed inside the VM (exit $LAB_RC); the command did not run. Lab log:"
        sed 's/^/  | /' "$T/ctl/lab.log" >&2
    fi
elif [[ $INTR == 1 ]]; then
    RC=130
    note "interrupted; the VM was stopped"
elif [[ $QRC == 124 || $QRC == 137 ]]; then
    RC=124
    note "timed out after ${TMO}s (VM_TIMEOUT); the VM was killed"
else
    RC=125
    note "the VM stopped (qemu exit $QRC) without reporting the command's exit status"
fi
if [[ -n ${VM_DMESG:-} && -f $T/ctl/dmesg.txt ]]; then
    cp "$T/ctl/dmesg.txt" "$VM_DMESG" || note "warning: cannot write VM_DMESG=$VM_DMESG"
fi
if [[ $VERBOSE == 1 || -z $(read_file "$T/ctl/rc") ]]; then
    if [[ $VERBOSE == 1 && -s $T/ctl/lab.log ]]; then
        echo "---- $PROG: lab log ----" >&2
        cat "$T/ctl/lab.log" >&2
    fi
    echo "---- $PROG: qemu log (tail) ----" >&2
    tail -n 20 "$T/qemu.log" >&2
    echo "---- $PROG: console log (tail) ----" >&2
    tail -n 40 "$T/console.log" >&2
    t_boot=$(read_file "$T/ctl/t_boot")
    t_start=$(read_file "$T/ctl/t_start")
    t_end=$(read_file "$T/ctl/t_end")
    awk -v w0="$T0" -v w1="$T1" -v b="$t_boot" -v s="$t_start" -v e="$t_end" \
        -v k="$KERNEL" -v a="$ACCEL" -v c="$CPUS" -v m="$MEM" -v rc="$RC" -v p="$PROG" '
        function span(x, y) { return (x == "" || y == "") ? "n/a" : sprintf("%.2fs", y - x) }
        BEGIN {
            printf "---- %s: kernel=%s accel=%s cpus=%s mem=%s rc=%s\n", p, k, a, c, m, rc
            printf "---- %s: wall=%.2fs boot=%s lab=%s cmd=%s\n", p, w1 - w0, span(0, b), span(b, s), span(s, e)
        }' >&2
fi
exit "$RC"
