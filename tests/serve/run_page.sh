#!/usr/bin/env bash
# Runs test_page.py (the chat page in headless Chromium) in the venv venv.sh made; 77 (skipped)
# with the reason when selenium, chromium or chromedriver is missing.
venv=$1
shift
if [ -f "$venv.no-selenium" ] || [ ! -x "$venv/bin/python" ]; then
  echo "SKIP: selenium is not installed: $(cat "$venv.no-selenium" 2>/dev/null || echo 'no venv')"
  exit 77
fi
for b in chromium chromedriver; do
  if ! command -v $b >/dev/null; then
    echo "SKIP: $b is not installed (Debian packages chromium and chromium-driver)"
    exit 77
  fi
done
exec "$venv/bin/python" "$3" "$1" "$2"
