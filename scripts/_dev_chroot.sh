# shellcheck shell=bash
# _dev_chroot.sh: the Debian chroots that scripts/dev-cluster runs Slurm 24.11 and 26.05 in.
# Sourced by scripts/dev-cluster (needs its log/die); not meant to run on its own.
#
# A chroot is built once per Debian suite with debootstrap from Debian's own packages, under
# $DLHPC_DEV_CHROOT_CACHE (default /var/cache/dlhpc-dev)/chroot-<suite>, and reused afterwards.
# No Python is installed in it: the project's interpreter prefix, its venv and the checkout are
# bind-mounted at their host paths (with /tmp, /var/tmp, /dev, /proc and /sys), so the jobs
# and tests run the same interpreter and torch wheel as on the host. Only the shared libraries
# that interpreter links against are installed.

CHROOT_CACHE="${DLHPC_DEV_CHROOT_CACHE:-/var/cache/dlhpc-dev}"
DEBIAN_MIRROR="${DLHPC_DEV_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# Daemons and tools, then libraries the host's Python 3.11 and the torch CPU wheel link against
# (found with ldd on the interpreter, lib-dynload/*.so and the venv's *.so; _tkinter and _nis
# excepted: forky has no libnsl2).
# A name that the suite renamed in the 64-bit time_t transition is tried with a "t64" suffix.
CHROOT_PACKAGES=(
    slurm-wlm slurmctld slurmd slurmdbd slurm-client munge mariadb-server mariadb-client
    procps iproute2 passwd ca-certificates
    libffi8 libsqlite3-0 libssl3 libuuid1 libncursesw6 libtinfo6 libbz2-1.0 liblzma5
    zlib1g libstdc++6 libgcc-s1
)

# chroot_suite VERSION: the Debian suite whose slurm-wlm is that Slurm version (none: host).
chroot_suite() {
    case $1 in
        24.11) echo trixie ;;
        26.05) echo forky ;;
        *) return 1 ;;
    esac
}

chroot_dir() { echo "$CHROOT_CACHE/chroot-$1"; }

# mounts_under DIR: the mount points at or below DIR, the last mounted first.
mounts_under() {
    local dir=$1
    awk -v d="$dir" '$2 == d || index($2, d "/") == 1 {print $2}' /proc/self/mounts | tac
}

# chroot_umount_all DIR: unmount everything at or below DIR. Last mounted first, in passes:
# a mount hidden under a later one at the same path shows again once that one is gone.
chroot_umount_all() {
    local dir=$1 m pass left
    for pass in 1 2 3 4 5; do
        left=$(mounts_under "$dir")
        [[ -n $left ]] || return 0
        while read -r m; do
            umount "$m" 2>/dev/null || true
        done <<<"$left"
    done
    die "could not unmount under $dir: $(mounts_under "$dir" | tr '\n' ' ')"
}

# bind_at CHROOT PATH [ro]: bind-mount host PATH at the same path inside CHROOT (idempotent).
bind_at() {
    local root=$1 path=$2 ro=${3:-} target
    target="$root$path"
    mountpoint -q "$target" 2>/dev/null && return 0
    if [[ -d $path ]]; then
        mkdir -p "$target"
    else
        mkdir -p "$(dirname "$target")"
        [[ -e $target ]] || touch "$target"
    fi
    mount --bind "$path" "$target" || die "could not bind-mount $path into $root"
    if [[ $ro == ro ]]; then
        mount -o remount,bind,ro "$target" || die "could not make $target read-only"
    fi
}

# The kernel file systems, for apt (build) and for the daemons (run).
chroot_mount_system() {
    local root=$1 d
    if ! mountpoint -q "$root/proc"; then
        mount -t proc proc "$root/proc" || die "could not mount proc in $root"
    fi
    # Recursive (for /dev/pts, /dev/shm), and slaves: unmounting them never reaches the host's.
    for d in /sys /dev; do
        mountpoint -q "$root$d" && continue
        mount --rbind "$d" "$root$d" || die "could not bind-mount $d into $root"
        mount --make-rslave "$root$d"
    done
}

# apt_name ROOT NAME: NAME, or NAMEt64, whichever the chroot's archive has.
apt_name() {
    local root=$1 name=$2 cand policy
    for cand in "$name" "${name}t64"; do
        # Captured first: grep -q closing the pipe early would fail the pipeline (pipefail).
        policy=$(chroot "$root" apt-cache policy "$cand" 2>/dev/null) || true
        if grep -q 'Candidate: [^(]' <<<"$policy"; then
            echo "$cand"
            return 0
        fi
    done
    die "no package $name (nor ${name}t64) in the chroot's archive ($root)"
}

chroot_provision() {
    local root=$1 suite=$2 p
    chroot_mount_system "$root"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    # Nothing may start a service while packages install.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 0755 "$root/usr/sbin/policy-rc.d"
    if [[ $suite == forky ]]; then
        # The testing suite's Release file may be past its Valid-Until date.
        echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99dlhpc-valid-until"
    fi
    export DEBIAN_FRONTEND=noninteractive
    # A failed step leaves no mounts behind (a later rm -rf of the chroot must not reach /dev).
    # shellcheck disable=SC2064 # expanded now: $root is local
    trap "chroot_umount_all '$root'" EXIT
    chroot "$root" apt-get update -q >&2 || die "apt-get update in $root failed"
    local -a names=()
    for p in "${CHROOT_PACKAGES[@]}"; do
        names+=("$(apt_name "$root" "$p")")
    done
    chroot "$root" apt-get install -y -q --no-install-recommends "${names[@]}" >&2 \
        || die "apt-get install in $root failed"
    chroot "$root" apt-get clean
    chroot_umount_all "$root"
    trap - EXIT
}

# ensure_chroot SUITE: build the chroot for SUITE (chroot_dir) unless a complete one is cached.
ensure_chroot() {
    local suite=$1 root marker want t0=$SECONDS
    root=$(chroot_dir "$suite")
    marker="$root/.dlhpc-chroot"
    want="packages: ${CHROOT_PACKAGES[*]}"
    [[ -f $marker && $(cat "$marker") == "$want" ]] && return 0
    install -d -m 0755 "$CHROOT_CACHE"
    exec 8>"$CHROOT_CACHE/.lock-$suite"
    flock -w 3600 8 || die "could not lock $CHROOT_CACHE/.lock-$suite"
    # Another up may have finished the build while this one waited for the lock.
    if [[ -f $marker && $(cat "$marker") == "$want" ]]; then
        exec 8>&-
        return 0
    fi
    if [[ ! -f $root/.debootstrap-done ]]; then
        [[ -z $(mounts_under "$root") ]] || die "$root is partly built and has mounts; unmount them first"
        command -v debootstrap >/dev/null || install_debootstrap
        log "building the $suite chroot in $root (debootstrap from $DEBIAN_MIRROR; several minutes)"
        rm -rf -- "$root"
        local -a script=()
        # Debian 12's debootstrap has no script for forky; sid's bootstraps it.
        [[ -f /usr/share/debootstrap/scripts/$suite ]] || script=(/usr/share/debootstrap/scripts/sid)
        debootstrap --variant=minbase --include=ca-certificates "$suite" "$root" "$DEBIAN_MIRROR" \
            "${script[@]}" >"$CHROOT_CACHE/debootstrap-$suite.log" 2>&1 8>&- \
            || { chroot_umount_all "$root"; die "debootstrap $suite failed" "$CHROOT_CACHE/debootstrap-$suite.log"; }
        touch "$root/.debootstrap-done"
    fi
    log "installing Slurm, munge and MariaDB into $root"
    chroot_provision "$root" "$suite"
    echo "$want" >"$marker"
    exec 8>&-
    log "chroot $suite ready ($((SECONDS - t0))s)"
}

install_debootstrap() {
    host_apt_install debootstrap
}

# missing_packages PKG...: those of the host's Debian packages not installed, one a line.
missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
    done
}

# host_apt_install PKG...: install those of the host's packages that are missing, one apt-get
# at a time: two `up`s at once (CI's lanes on a fresh machine) would otherwise both run apt-get
# and the second would fail on apt's lock.
host_apt_install() {
    local -a missing=()
    mapfile -t missing < <(missing_packages "$@")
    ((${#missing[@]} == 0)) && return 0
    install -d -m 0755 "$CHROOT_CACHE"
    exec 7>"$CHROOT_CACHE/.lock-apt"
    flock -w 1800 7 || die "could not lock $CHROOT_CACHE/.lock-apt"
    mapfile -t missing < <(missing_packages "$@")  # another up may have installed them meanwhile
    if ((${#missing[@]})); then
        log "installing ${missing[*]} (apt-get)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >&2 7>&- || die "apt-get update failed"
        apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 7>&- \
            || die "apt-get install ${missing[*]} failed"
    fi
    exec 7>&-
}

# chroot_mount_world ROOT PATH...: the kernel file systems, /tmp and /var/tmp (the clusters'
# state folders and the tests' files), and each PATH at its host path; a PATH inside one
# already bound is skipped. Idempotent; chroot_umount_all undoes it.
chroot_mount_world() {
    local root=$1 p b covered
    shift
    chroot_mount_system "$root"
    local -a done_paths=() paths=()
    # Sorted: a folder comes before the folders inside it, which it then covers.
    mapfile -t paths < <(printf '%s\n' "$@" | sort -u)
    for p in /tmp /var/tmp "${paths[@]}"; do
        covered=0
        for b in "${done_paths[@]}"; do
            [[ $p == "$b" || $p == "$b"/* ]] && covered=1
        done
        ((covered)) && continue
        [[ -d $p ]] || die "cannot bind-mount $p into $root: no such folder"
        bind_at "$root" "$p"
        done_paths+=("$p")
    done
}

# chroot_check_python ROOT VENV: the venv's interpreter runs in the chroot with the extension
# modules the project uses, and torch's libraries find every shared library they link.
chroot_check_python() {
    local root=$1 venv=$2 out torch_lib
    out=$(chroot "$root" "$venv/bin/python" -c '
import bz2, ctypes, hashlib, lzma, sqlite3, ssl, uuid, zlib
import importlib.util as u
s = u.find_spec("torch")
print(s.submodule_search_locations[0] if s else "")' 2>&1) \
        || die "the project's Python does not run in $root: $out"
    torch_lib=${out##*$'\n'}
    [[ -n $torch_lib && -d $torch_lib/lib ]] || return 0
    out=$(chroot "$root" sh -c 'for f in "$1"/lib/*.so*; do ldd "$f"; done' sh "$torch_lib" 2>&1 \
        | grep 'not found' | sort -u) || true
    [[ -z $out ]] || die "torch's libraries miss shared libraries in $root: $out"
}

# chroot_users ROOT: the pids of the processes whose root is ROOT (space-separated).
chroot_users() {
    local root=$1 d pids=()
    for d in /proc/[0-9]*; do
        [[ $(readlink "$d/root" 2>/dev/null) == "$root" ]] && pids+=("${d#/proc/}")
    done
    echo "${pids[*]}"
}
