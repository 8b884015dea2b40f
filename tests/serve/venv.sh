#!/usr/bin/env bash
# Makes (once) the venv the Python client tests run in: python3 -m venv, then pip install of the
# official openai client and selenium (the chat-page test) from PyPI. A venv that already imports
# them is kept, so reruns cost nothing. What cannot be installed is noted in $1.unavailable
# (openai) or $1.no-selenium, and the script exits 0: those tests then report themselves skipped.
set -u
venv=$1
rm -f "$venv.unavailable" "$venv.no-selenium"
if ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >"$venv.log" 2>&1; then
    echo "python3 -m venv failed (Debian: python3-venv; see $venv.log)" > "$venv.unavailable"
    echo "no venv" > "$venv.no-selenium"
    exit 0
  fi
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check "openai>=1.40,<3" >>"$venv.log" 2>&1; then
    echo "pip install openai failed (no PyPI? see $venv.log)" > "$venv.unavailable"
  fi
fi
if ! "$venv/bin/python" -c "import selenium" 2>/dev/null &&
   ! "$venv/bin/pip" install --quiet --disable-pip-version-check "selenium>=4.10,<5" >>"$venv.log" 2>&1; then
  echo "pip install selenium failed (no PyPI? see $venv.log)" > "$venv.no-selenium"
fi
exit 0
