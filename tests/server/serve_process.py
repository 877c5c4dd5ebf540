"""Starts `flashmap serve` on a free port for the server tests (standard library only)."""

import re
import subprocess
import sys
import threading
import time


def _drain(proc, log):
    """Gathers the server's stderr into log; a server that ends on its own with a failure (a
    sanitizer's report, an abort) prints what it wrote, so that the test that met it says why."""
    log.extend(proc.stderr)
    code = proc.wait()
    if code not in (0, -9, -15):
        sys.stderr.write(f"flashmap serve exited with {code}; its log:\n" + "".join(log))
        sys.stderr.flush()


def start(cmd, timeout=60):
    """Runs cmd (a `flashmap serve ... --port 0` command line) and waits for its listening line.
    Returns (process, port, log): log gathers the rest of its stderr, which a thread keeps reading
    so that the server never blocks on a full pipe."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            log = []
            threading.Thread(target=_drain, args=(proc, log), daemon=True).start()
            return proc, int(m.group(1)), log
    proc.kill()
    raise RuntimeError("server did not start:\n" + "".join(lines))
