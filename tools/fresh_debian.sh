#!/usr/bin/env bash
# Checks the README's set-up on a fresh Debian 12 (bookworm): a chroot that has only build-essential,
# cmake, git and python3 installed, a clean `git clone` of this repository at <commit-ish> (default
# HEAD) in /root/ninfer, then, as root inside the chroot, `make demo` and `make test` (CUDA is OFF
# there: the chroot has no nvcc). Before that it checks, as an unprivileged user without sudo, that
# `make demo` stops at tools/deps.sh with the list of missing packages and the command to install them.
#
#   sudo tools/fresh_debian.sh [commit-ish]
#
# Needs root (debootstrap, chroot, mounts), the packages debootstrap and git, and network access to
# the Debian mirror and PyPI. Not part of CI; run it by hand when the set-up path changes.
#
# Where things go (outside the repository), under NF_FRESH_ROOT (default /var/tmp/ninfer-bookworm):
#   base.tar     the pristine root (debootstrap --variant=minbase + the four packages), made once
#                (several minutes of downloads); delete it to bootstrap again
#   root/        the chroot of the last run, unpacked from base.tar at every run (so each run starts
#                from the pristine state; a re-run takes minutes plus the build and tests)
#   run-<sha>.log the full output of the run
# The mirror is the one this machine's apt uses when it can be read from /etc/apt, else
# deb.debian.org; NF_FRESH_MIRROR overrides it. NF_FRESH_SHELL=1 opens a shell in the chroot at the end.
# What the host lends the chroot besides the clone: /etc/resolv.conf and its local CA certificates
# (/usr/local/share/ca-certificates/*.crt, e.g. a TLS-intercepting proxy's; none on an ordinary host).
set -euo pipefail

die() { echo "fresh_debian: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts); run it with sudo"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"

REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
SHA=$(git -C "$REPO" rev-parse --verify "${1:-HEAD}^{commit}") || die "unknown commit-ish '${1:-HEAD}'"
TOP=${NF_FRESH_ROOT:-/var/tmp/ninfer-bookworm}
BASE=$TOP/base.tar
CHROOT=$TOP/root
LOG=$TOP/run-${SHA:0:12}.log
case "$TOP" in "$REPO"|"$REPO"/*) die "NF_FRESH_ROOT must be outside the repository";; esac

mirror=${NF_FRESH_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
fi
security=${mirror%/debian*}/debian-security

# The mounts this script makes under $1, deepest first.
mounts_under() { findmnt -rn -o TARGET | awk -v r="$1" 'index($0, r "/") == 1' | sort -r; }
unmount_all() {
  local m
  for m in $(mounts_under "$1"); do umount -l "$m" || true; done
  [ -z "$(mounts_under "$1")" ] || die "could not unmount everything under $1; not deleting it"
}
fresh_dir() { unmount_all "$1"; rm -rf --one-file-system "$1"; mkdir -p "$1"; }
enter() {  # mount what a chroot needs; $2 = ca: also the host's local CA certificates
  mount -t proc proc "$1/proc"
  mount -t sysfs sys "$1/sys"
  mount --bind /dev "$1/dev"
  mount --bind /dev/pts "$1/dev/pts"
  cp -L /etc/resolv.conf "$1/etc/resolv.conf"
  # The host's own CA certificates (e.g. a TLS-intercepting proxy's), like resolv.conf: the network
  # is the host's. ca-certificates (python3-pip depends on it) takes them in when deps.sh installs it;
  # update-ca-certificates does where it is already there.
  if [ "${2:-}" = ca ] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$1/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"
    [ ! -x "$1/usr/sbin/update-ca-certificates" ] || chroot "$1" update-ca-certificates >/dev/null 2>&1 || true
  fi
}
trap 'unmount_all "$CHROOT" 2>/dev/null; [ -d "$TOP/base" ] && unmount_all "$TOP/base" 2>/dev/null; true' EXIT

mkdir -p "$TOP"
if [ ! -s "$BASE" ]; then
  echo "fresh_debian: bootstrapping bookworm (minbase) from $mirror into $TOP/base ..." >&2
  fresh_dir "$TOP/base"
  debootstrap --variant=minbase bookworm "$TOP/base" "$mirror" >"$TOP/debootstrap.log" 2>&1 \
    || { tail -n 20 "$TOP/debootstrap.log" >&2; die "debootstrap failed (log: $TOP/debootstrap.log)"; }
  cat >"$TOP/base/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
  enter "$TOP/base"
  chroot "$TOP/base" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -qq && apt-get install -y -qq build-essential cmake git python3 && apt-get clean' \
    >>"$TOP/debootstrap.log" 2>&1 || { tail -n 20 "$TOP/debootstrap.log" >&2; die "installing the base packages failed"; }
  rm -f "$TOP/base/etc/resolv.conf"
  unmount_all "$TOP/base"
  tar -C "$TOP/base" -cpf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
  rm -rf --one-file-system "$TOP/base"
fi

echo "fresh_debian: fresh root from $BASE in $CHROOT; clone of $REPO at $SHA; log $LOG" >&2
fresh_dir "$CHROOT"
tar -C "$CHROOT" -xpf "$BASE"
enter "$CHROOT" ca
git -c advice.detachedHead=false clone -q --no-checkout "$REPO" "$CHROOT/root/ninfer"
git -C "$CHROOT/root/ninfer" -c advice.detachedHead=false checkout -q --detach "$SHA" || die "$SHA is not reachable from the clone (commit it on a branch)"

in_chroot() {  # user, home, command
  chroot --userspec="$1" "$CHROOT" /usr/bin/env -i HOME="$2" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb bash -c "$3"
}

status=0
{
  echo "== $(date -u +%FT%TZ) ninfer $SHA on $(. "$CHROOT/etc/os-release"; echo "$PRETTY_NAME") (mirror $mirror)"
  echo "== installed: $(chroot "$CHROOT" dpkg-query -W -f='${Package} ' build-essential cmake git python3)"

  echo "== 1. as an unprivileged user without sudo: make demo must stop at tools/deps.sh, naming packages and command"
  chroot "$CHROOT" useradd -m -u 1000 nfuser
  git -c advice.detachedHead=false clone -q "$CHROOT/root/ninfer" "$CHROOT/home/nfuser/ninfer"
  chroot "$CHROOT" chown -R nfuser: /home/nfuser/ninfer
  if in_chroot 1000:1000 /home/nfuser 'cd ~/ninfer && make demo' </dev/null >"$TOP/user.log" 2>&1; then
    cat "$TOP/user.log"; echo "FAIL: make demo succeeded as a user that cannot install packages"; status=1
  else
    cat "$TOP/user.log"
    if grep -q 'deps: error: missing Debian packages:' "$TOP/user.log" && grep -q 'apt-get install' "$TOP/user.log"; then
      echo "ok: deps.sh refused with the package list and the command"
    else
      echo "FAIL: no clear deps.sh message"; status=1
    fi
  fi

  echo "== 2. as root: make demo"
  start=$(date +%s)
  in_chroot 0:0 /root 'cd /root/ninfer && make demo' || { echo "FAIL: make demo (exit $?)"; status=1; }
  echo "== make demo took $(( $(date +%s) - start )) s"

  echo "== 3. as root: make test"
  start=$(date +%s)
  in_chroot 0:0 /root 'cd /root/ninfer && make test' || { echo "FAIL: make test (exit $?)"; status=1; }
  echo "== make test took $(( $(date +%s) - start )) s"

  [ "${NF_FRESH_SHELL:-0}" = 1 ] && in_chroot 0:0 /root 'cd /root/ninfer && exec bash -i' </dev/tty >/dev/tty 2>&1
  if [ $status -eq 0 ]; then echo "== PASS"; else echo "== FAIL"; fi
  exit $status
} 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
echo "fresh_debian: log in $LOG" >&2
exit "$status"
