#!/usr/bin/env bash
# Makes (once) the venv the openai-client test runs in: python3 -m venv + pip install openai from
# PyPI. A venv that already imports openai is kept, so reruns cost nothing. Without PyPI it leaves
# a note in $1.unavailable and exits 0: the test then reports itself skipped, not failed.
set -u
venv=$1
rm -f "$venv.unavailable"
if "$venv/bin/python" -c "import openai" 2>/dev/null; then exit 0; fi
rm -rf "$venv"
if ! python3 -m venv "$venv" >"$venv.log" 2>&1; then
  echo "python3 -m venv failed (Debian: python3-venv; see $venv.log)" > "$venv.unavailable"
  exit 0
fi
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check "openai>=1.40,<3" >>"$venv.log" 2>&1; then
  echo "pip install openai failed (no PyPI? see $venv.log)" > "$venv.unavailable"
fi
exit 0
