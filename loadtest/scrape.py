"""Reading a server under test from outside: its Prometheus samples and its readiness."""

from __future__ import annotations

import subprocess
import time
import urllib.request


def samples(port: int, name: str) -> dict[str, float]:
    """The samples of metric ``name`` on ``127.0.0.1:port/metrics``, by their labels
    (``{generation="0",le="0.01"}``, or ``""``), summed over the lines that repeat them
    (gunicorn's workers, in multiprocess mode)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            labels, value = line[len(name) :].rsplit(" ", 1)
            found[labels] = found.get(labels, 0.0) + float(value)
    return found


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Until ``url`` answers; raises if ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
