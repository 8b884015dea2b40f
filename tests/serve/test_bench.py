"""`ninfer bench serve` against `ninfer serve`: every request completes, and with ignore_eos every
request yields exactly --output-len tokens (from the usage chunks)."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

NINFER, MODEL = sys.argv[1], sys.argv[2]
s = Server(NINFER, MODEL)
try:
    out = subprocess.run([NINFER, "bench", "serve", "--url", s.url, "--model", "tiny", "-c", "4", "-n", "12",
                          "--input-len", "40", "--output-len", "16", "--id-max", "500"],
                         capture_output=True, text=True, timeout=300)
finally:
    rc = s.stop()
print(out.stdout, out.stderr)
m = re.search(r"completed (\d+), failed (\d+), duration ([\d.]+) s, output tokens (\d+)", out.stdout)
ok = out.returncode == 0 and m and m.group(1) == "12" and m.group(2) == "0" and m.group(4) == str(12 * 16) and rc == 0
for name in ("TTFT", "TPOT", "ITL", "E2EL"):
    ok = ok and re.search(r"^%s\s+ms\s+mean" % name, out.stdout, re.M) is not None
print("ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
