#!/usr/bin/env bash
# Runs test_openai.py in the venv venv.sh made; 77 (skipped) with the reason when there is none.
venv=$1
shift
if [ -f "$venv.unavailable" ] || [ ! -x "$venv/bin/python" ]; then
  echo "SKIP: the openai client is not installed: $(cat "$venv.unavailable" 2>/dev/null || echo 'no venv')"
  exit 77
fi
exec "$venv/bin/python" "$3" "$1" "$2"
