"""Starting and stopping `ninfer serve` for the tests: any free port (read from its first line),
stopped with SIGTERM, whose exit status must be 0 (under ASan that includes no leaks)."""
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request


class Server:
    def __init__(self, ninfer, model, *extra):
        self.proc = subprocess.Popen([ninfer, "serve", "-m", model, "--port", "0", "--device", "cpu", "--threads", "1",
                                      *extra], stderr=subprocess.PIPE, text=True)
        self.lines = []
        line = self.proc.stderr.readline()
        self.lines.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError("ninfer serve did not start: " + line + self.proc.stderr.read())
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self._drain, daemon=True).start()
        for _ in range(300):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.05)
        raise RuntimeError("ninfer serve never became healthy")

    def kv_pages(self):
        """The KV pool's size in pages, as the server's 'ready:' line states it."""
        for _ in range(200):
            for line in list(self.lines):
                m = re.search(r"(\d+) KV pages of", line)
                if m:
                    return int(m.group(1))
            time.sleep(0.05)
        raise RuntimeError("no 'ready:' line with the KV pool's size")

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            sys.stderr.write("server: " + line)

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -999
