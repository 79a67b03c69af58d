"""``python -m app.ops.healthcheck``: exit 0 when this host's Hubbub answers ``/healthz``, else 1.

The Docker ``HEALTHCHECK`` runs it (slim images have no curl). It reads ``CHAT_PORT`` like the
server does, and asks 127.0.0.1 when the server binds every address.
"""

from __future__ import annotations

import sys
import urllib.request

from app.settings import load_settings

TIMEOUT_S = 2.0


def main() -> int:
    settings = load_settings()
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{host}:{settings.port}/healthz", timeout=TIMEOUT_S):
            return 0  # urlopen raises for any status but 2xx
    except OSError as exc:
        print(f"hubbub healthcheck: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
