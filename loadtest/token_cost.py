"""``python -m loadtest.token_cost``: what verifying a token costs a worker, remembered or not.

A worker in ``jwt`` mode verifies a token on each WebSocket connection and each HTTP request
that carries one (a bearer token); it remembers the tokens it verified until they expire
(``CHAT_JWT_CACHE_SIZE``, :mod:`app.access.auth`). This starts one server (``python -m app``,
the embedded broker, pinned to ``--server-core``) per case and round, the cases alternating:
``CHAT_JWT_CACHE_SIZE`` 0 (every token checked in full) and the default, for tokens signed
with ``--algorithm`` (HS256 with a secret; RS256 or ES256 with a public key file). Each
round measures the server's CPU time (``/proc``: 10 ms ticks) over three phases:

- ``first``: ``--clients`` users, a token each, connect (``?auth=frame`` and an ``auth``
  frame, as the SDKs do), join a room and leave: every token is new to the worker;
- ``again``: the same users reconnect with the same tokens (a network blip, a page reload);
- ``http``: ``--requests`` history reads (``GET /rooms/{room}/messages``), the users' bearer
  tokens in turn, over ``--http-connections`` keep-alive connections.

Each phase's figure is the server's CPU a client (or request), in µs; the medians of the
rounds are printed, and written as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from websockets.asyncio.client import connect

from app.settings import Settings
from loadtest.bench import OPEN_LIMITS, free_port
from loadtest.redis_cost import cpu_s
from tests.processes import wait_for_port

ROOT = Path(__file__).resolve().parent.parent
SECRET = "a-token-cost-secret-that-is-long-enough-for-hs256"
PHASES = ("first", "again", "http")


class Signer:
    """Tokens for ``algorithm``, and the server settings that verify them."""

    def __init__(self, algorithm: str, folder: Path) -> None:
        self.algorithm = algorithm
        if algorithm == "HS256":
            self.key: Any = SECRET
            self.env = {"CHAT_JWT_SECRET": SECRET}
            return
        if algorithm == "RS256":
            private: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif algorithm == "ES256":
            private = ec.generate_private_key(ec.SECP256R1())
        else:
            raise ValueError(f"unknown algorithm {algorithm!r}")
        pem = folder / "public.pem"
        pem.write_bytes(
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self.key = private
        self.env = {"CHAT_JWT_PUBLIC_KEY_FILE": str(pem)}

    def token(self, user: str) -> str:
        now = int(time.time())
        claims = {"sub": user, "iat": now, "exp": now + 3600, "rooms": ["room-*"]}
        return jwt.encode(claims, self.key, algorithm=self.algorithm)


class Server:
    """``python -m app`` in jwt mode on ``core``, remembering ``cache_size`` tokens."""

    def __init__(self, signer: Signer, cache_size: int, core: int) -> None:
        self.port = free_port()
        env = {
            **os.environ, **OPEN_LIMITS, **signer.env, "CHAT_AUTH_MODE": "jwt",
            "CHAT_JWT_CACHE_SIZE": str(cache_size), "CHAT_PORT": str(self.port),
            "TMPDIR": tempfile.gettempdir(),
        }  # fmt: skip
        self._command = ("taskset", "-c", str(core), sys.executable, "-m", "app")
        self._env = env
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Server:
        self.proc = await asyncio.create_subprocess_exec(
            *self._command, cwd=ROOT, env=self._env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await wait_for_port(self.port, self.proc, "the server exited")
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()

    def cpu_s(self) -> float:
        assert self.proc is not None
        return cpu_s(self.proc.pid)


async def visit(port: int, token: str, room: str) -> None:
    """Connect with ``token`` in an ``auth`` frame, join ``room``, leave."""
    async with connect(f"ws://127.0.0.1:{port}/ws?auth=frame", compression=None) as ws:
        await ws.send(orjson.dumps({"type": "auth", "token": token}).decode())
        await ws.send(orjson.dumps({"type": "join", "room": room}).decode())
        while True:  # a message may hold several frames, a line each
            for line in str(await ws.recv()).splitlines():
                frame = orjson.loads(line)
                if frame.get("type") == "error":
                    raise RuntimeError(f"refused: {frame}")
                if frame.get("type") == "joined":
                    return


async def visits(port: int, tokens: list[str], concurrency: int) -> None:
    """Every token's :func:`visit`, ``concurrency`` at a time."""
    for start in range(0, len(tokens), concurrency):
        batch = tokens[start : start + concurrency]
        await asyncio.gather(*(visit(port, t, f"room-{i % 50}") for i, t in enumerate(batch)))


async def reads(port: int, tokens: list[str], requests: int, connections: int) -> None:
    """``requests`` history reads, the tokens in turn, on ``connections`` connections."""
    url = f"http://127.0.0.1:{port}/rooms/room-0/messages"

    async def one_connection(k: int) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            for n in range(k, requests, connections):
                bearer = {"authorization": f"Bearer {tokens[n % len(tokens)]}"}
                reply = await http.get(url, headers=bearer)
                if reply.status_code != 200:
                    raise RuntimeError(f"history read: {reply.status_code} {reply.text[:200]}")

    await asyncio.gather(*(one_connection(k) for k in range(connections)))


async def round_of(signer: Signer, cache_size: int, args: argparse.Namespace) -> dict[str, float]:
    """One server's µs of CPU a client (or request) in each phase."""
    tokens = [signer.token(f"user-{n}") for n in range(args.clients)]
    out: dict[str, float] = {}
    async with Server(signer, cache_size, args.server_core) as server:
        await visits(server.port, tokens[:20], 20)  # warm: imports, caches
        for phase in PHASES:
            before = server.cpu_s()
            if phase == "http":
                await reads(server.port, tokens, args.requests, args.http_connections)
                count = args.requests
            else:
                await visits(server.port, tokens, args.concurrency)
                count = len(tokens)
            out[phase] = (server.cpu_s() - before) / count * 1e6
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {args.generator_core})
    cases = {"unremembered": 0, "remembered": Settings.model_fields["jwt_cache_size"].default}
    rounds: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    with tempfile.TemporaryDirectory(prefix="hubbub-token-cost-") as folder:
        signer = Signer(args.algorithm, Path(folder))
        for _ in range(args.rounds):
            for case, size in cases.items():
                rounds[case].append(await round_of(signer, size, args))
    medians = {
        case: {phase: statistics.median(r[phase] for r in runs) for phase in PHASES}
        for case, runs in rounds.items()
    }
    return {
        "algorithm": args.algorithm, "clients": args.clients, "requests": args.requests,
        "rounds": rounds, "median_us": medians,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=("HS256", "RS256", "ES256"), default="HS256")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--http-connections", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--generator-core", type=int, default=min(1, (os.cpu_count() or 1) - 1))
    parser.add_argument("--json", type=Path, help="write the result here as JSON")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args))
    print(f"{args.algorithm}, server CPU µs a client (first, again) and a request (http), "
          f"medians of {args.rounds} rounds:")  # fmt: skip
    for case, phases in result["median_us"].items():
        print(f"  {case:13} " + "  ".join(f"{p} {v:7.1f}" for p, v in phases.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
