#!/usr/bin/env bash
# The Debian packages ninfer's build, tests and demo need: the one list, used by the Makefile (so by
# `make`, `make demo` and `make test`) and by .ci/run. Installs only what is missing, as root or
# through sudo (without a password, or asking for it on a terminal); when it cannot, it names the
# packages and the command and exits non-zero.
#
#   tools/deps.sh            install what is missing (quiet when nothing is)
#   tools/deps.sh --list     print the list and exit
#
# NF_SKIP_DEPS=1 skips the check (a machine that is not Debian, or a build that brings its own).
set -euo pipefail

# build: build-essential cmake ninja-build git pkg-config libpcre2-dev libcjson-dev libmicrohttpd-dev (ninfer serve); make fuzz: clang
# libclang-rt-14-dev; make demo: python3 python3-pip (only `pip download`, which Debian's PEP 668
# guard allows: no venv needed) and ca-certificates (pip reaches PyPI over HTTPS; python3-pip
# depends on it, listed for clarity); the serve tests: python3-venv (a venv for the openai client and
# selenium), chromium and chromium-driver (the chat page in a headless browser; skipped without them).
packages=(build-essential cmake ninja-build git pkg-config libpcre2-dev libcjson-dev libmicrohttpd-dev clang libclang-rt-14-dev
          python3 python3-pip python3-venv ca-certificates chromium chromium-driver)

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
[ "${NF_SKIP_DEPS:-0}" = 1 ] && exit 0
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "deps: not a Debian system (no dpkg-query); make sure these are installed: ${packages[*]}" >&2
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then
    SUDO=sudo  # without a password, or asking for it on the terminal
  else
    why="not root and no sudo"
    command -v sudo >/dev/null 2>&1 && why="not root, and sudo needs a password but there is no terminal to ask on"
    echo "deps: error: missing Debian packages: ${missing[*]} ($why)" >&2
    echo "deps: install them as root:  $cmd" >&2
    echo "deps: (or set NF_SKIP_DEPS=1 if they are installed some other way)" >&2
    exit 1
  fi
fi
echo "deps: installing ${missing[*]}${SUDO:+ with sudo}" >&2
if ! { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2; then
  echo "deps: error: could not install ${missing[*]}; try by hand:  ${SUDO:+sudo }$cmd" >&2
  exit 1
fi
