"""``make bench-moderation`` (``python -m loadtest.moderation_cost``): what the moderation
hook costs the message path (docs/benchmarks.md, "Moderation hook").

Closed-loop throughput (``python -m loadtest rtt``: ``--clients`` clients, each sending its
next message as soon as its previous one came back) of a fresh ``python -m app`` (one uvicorn
worker, the memory broker) on core 0, with the generator on core 1 (``taskset``), in three
settings, alternating over ``--rounds`` rounds:

- ``off``: no ``CHAT_MODERATION_HOOK_URL`` (the default);
- ``on``: every message decided by a real endpoint (``loadtest.moderation_endpoint``: a
  uvicorn on core 1, like the generator; it checks each signature and accepts everything),
  with the default batching and concurrency;
- ``on, 1 request at a time``: the same with ``CHAT_MODERATION_HOOK_CONCURRENCY=1`` (larger
  batches, fewer requests).

Reports the medians, the range and, per round, each setting's ratio to ``off`` of the same
round (the median of those ratios is the figure: the machine is shared and noisy).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from loadtest.bench import (
    CLIENT_CPU,
    _pin,
    _wait_port,
    free_port,
)
from loadtest.tracing_cost import measure, parse, publish, report

SECRET = "bench-moderation-secret-of-32-characters"
# The hook's settings in each run (None: off).
SETTINGS: dict[str, dict[str, str] | None] = {
    "off": None,
    "on": {},
    "on, 1 request at a time": {"CHAT_MODERATION_HOOK_CONCURRENCY": "1"},
}


@contextlib.contextmanager
def endpoint() -> Iterator[str]:
    """The moderation endpoint, on the generator's core; its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [*_pin(CLIENT_CPU), sys.executable, "-m", "uvicorn", "loadtest.moderation_endpoint:app",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        env=os.environ | {"HOOK_SECRET": SECRET},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_port(port, proc, "moderation endpoint")
        yield f"http://127.0.0.1:{port}/moderate"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv, "python -m loadtest.moderation_cost", __doc__)
    started = time.time()
    with endpoint() as url:
        hook = {"CHAT_MODERATION_HOOK_URL": url, "CHAT_MODERATION_HOOK_SECRET": SECRET}
        settings = {name: {} if on is None else hook | on for name, on in SETTINGS.items()}
        results = measure(args, settings, "moderation hook")
    publish(args, started, results, report(results, args, "Moderation hook cost", "hook"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
