"""One conformance suite for every client SDK: the same scenarios, on real servers, through
each SDK's driver (``clients/js/conformance/driver.mjs``, ``clients/python/conformance/
driver.py``). A driver reads one command a line (``{"seq", "op", "client", ...}``) and writes
its answer (``{"seq", "result"}`` or ``{"seq", "error": {"code"}}``) and every event of its
clients (``{"client", "event", "detail"}``); the suite owns the servers (kills, drains,
restarts them) and judges what the SDK did.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.helpers import ChatClient, make_settings, run_server
from tests.processes import ROOT, AppProcess, RedisServer

pytestmark = pytest.mark.timeout(120)
SECRET = "a-conformance-secret-long-enough-for-hs256"
Event = dict[str, Any]


class DriverError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Driver:
    """One SDK's driver process: ``call`` an op, ``event`` waits for what a client saw."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[tuple[str, str, Any]] = []  # (client, type, detail), as they came
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            message = json.loads(line)
            if "event" in message:
                self.events.append((message["client"], message["event"], message["detail"]))
                self._changed.set()
                continue
            future = self._answers.pop(message["seq"])
            if "error" in message:
                error = message["error"]
                future.set_exception(DriverError(error["code"], error["message"]))
            else:
                future.set_result(message["result"])

    async def call(self, op: str, client: str, timeout: float = 15, **args: Any) -> Any:
        assert self.proc.stdin is not None
        number = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._answers[number] = future
        command = {"seq": number, "op": op, "client": client, **args}
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()
        async with asyncio.timeout(timeout):
            return await future

    def seen(self, client: str, kind: str) -> list[Any]:
        return [detail for who, what, detail in self.events if who == client and what == kind]

    async def event(
        self, client: str, kind: str, match: Callable[[Any], bool] = lambda _: True,
        timeout: float = 10,
    ) -> Any:  # fmt: skip
        """The first ``kind`` event of ``client`` that ``match`` accepts (past or coming)."""
        async with asyncio.timeout(timeout):
            while True:
                for detail in self.seen(client, kind):
                    if match(detail):
                        return detail
                self._changed.clear()
                await self._changed.wait()

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.call("exit", "", timeout=5)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()


def _js_command() -> list[str]:
    sdk = ROOT / "clients" / "js"
    assert (sdk / "node_modules" / ".installed").exists(), "run `make node-deps` (npm ci)"
    return ["node", str(sdk / "conformance" / "driver.mjs")]


def _python_command() -> list[str]:
    return [sys.executable, str(ROOT / "clients" / "python" / "conformance" / "driver.py")]


DRIVERS: dict[str, Callable[[], list[str]]] = {
    "js": _js_command, "js-sse": _js_command, "python": _python_command,
}  # fmt: skip
# The drivers whose clients use the HTTP fallback transport only (the rest: WebSockets).
OVER_SSE = {"js-sse"}


@pytest.fixture(params=sorted(DRIVERS))
async def driver(request: pytest.FixtureRequest, js_sdk: Path) -> AsyncIterator[Driver]:
    env = {**os.environ, "HUBBUB_SDK": str(js_sdk)}
    if request.param in OVER_SSE:
        env["HUBBUB_TRANSPORTS"] = "sse"
    proc = await asyncio.create_subprocess_exec(
        *DRIVERS[request.param](), cwd=ROOT, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    driver = Driver(proc)
    try:
        yield driver
        opened = [d for _, kind, d in driver.events if kind == "state" and d["state"] == "open"]
        if request.param in OVER_SSE:  # every connection the scenario made was a stream
            tries = [d for _, kind, d in driver.events if kind == "state" and "transport" in d]
            assert tries and {d["transport"] for d in tries} == {"sse"}, tries
        elif request.param == "js":  # servers killed and restarted did not keep it on the
            # fallback (taken only where a WebSocket fails and plain HTTP works: a server back
            # between the two tries may open the fallback, and the SDK's next WebSocket try
            # takes it straight back)
            transports = [d.get("transport") for d in opened]
            assert "sse" not in transports[-1:], opened
            assert all(
                after == "websocket"
                for before, after in itertools.pairwise(transports)
                if before == "sse"
            ), opened
    finally:
        await driver.stop()


@pytest.fixture(scope="session")
def js_sdk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TypeScript SDK's ESM build (made here, in a copy of clients/js)."""
    import shutil
    import subprocess

    sdk = ROOT / "clients" / "js"
    copy = tmp_path_factory.mktemp("js-sdk") / "js"
    shutil.copytree(sdk / "src", copy / "src")
    for name in ("package.json", "tsconfig.json", "build.mjs"):
        shutil.copy(sdk / name, copy / name)
    (copy / "node_modules").symlink_to(sdk / "node_modules")
    subprocess.run(
        ["node", "build.mjs"], cwd=copy, check=True, capture_output=True, timeout=120,
        env={**os.environ, "HUBBUB_BUNDLE_OUT": str(copy / "bundle.js")},
    )  # fmt: skip
    return copy / "dist" / "index.js"


# -- the scenarios ---------------------------------------------------------------------------


async def test_connect_join_send_with_ack_and_retry(driver: Driver, tmp_path: Path) -> None:
    """Connect (states connecting → open), join, send: the ack resolves the send, the other
    member gets the message once; a retry with the same cid is acked as a duplicate."""
    async with run_server(make_settings(database_url=f"sqlite:///{tmp_path}/c.db")) as live:
        assert (await driver.call("connect", "ada", url=live.ws_url(), name="ada"))["user"] == "ada"
        await driver.call("connect", "bob", url=live.ws_url(), name="bob")
        states = [change["state"] for change in driver.seen("ada", "state")]
        assert states == ["connecting", "open"]
        joined = await driver.call("join", "ada", room="lobby")
        assert joined["room"] == "lobby" and joined["count"] >= 1
        await driver.call("join", "bob", room="lobby")
        ack = await driver.call("send", "ada", room="lobby", text="hi", cid="k1")
        assert ack["cid"] == "k1" and ack["duplicate"] is False
        message = await driver.event("bob", "message", lambda m: m["text"] == "hi")
        assert message["id"] == ack["id"] and message["user"] == "ada"
        again = await driver.call("send", "ada", room="lobby", text="hi", cid="k1")
        assert again["duplicate"] is True and again["id"] == ack["id"]
        await driver.call("send", "ada", room="lobby", text="after")
        await driver.event("bob", "message", lambda m: m["text"] == "after")
        assert [m["text"] for m in driver.seen("bob", "message")] == ["hi", "after"]
        history = await driver.call("history", "bob", room="lobby")
        assert [m["text"] for m in history] == ["hi", "after"]


async def test_error_codes_reject_the_call_that_caused_them(driver: Driver, tmp_path: Path) -> None:
    """Each refusal rejects the SDK call with the server's code: text_too_long, not_joined,
    not_found (an edit of no message), forbidden (someone else's message), exists (create
    twice), too_many_rooms, and not_found for a private room an outsider tries to join."""
    settings = make_settings(
        database_url=f"sqlite:///{tmp_path}/c.db", max_text_chars=20, max_rooms_per_connection=2
    )
    async with run_server(settings) as live:
        await driver.call("connect", "ada", url=live.ws_url(), name="ada")
        await driver.call("connect", "eve", url=live.ws_url(), name="eve")
        await driver.call("join", "ada", room="r1")
        expected: list[tuple[str, dict[str, Any], str]] = [
            ("send", {"room": "r1", "text": "x" * 21}, "text_too_long"),
            ("send", {"room": "r9", "text": "hi"}, "not_joined"),
            ("edit", {"room": "r1", "id": 12345, "text": "no"}, "not_found"),
        ]
        for op, args, code in expected:
            with pytest.raises(DriverError) as refused:
                await driver.call(op, "ada", **args)
            assert refused.value.code == code, (op, args)
        ack = await driver.call("send", "ada", room="r1", text="mine")
        await driver.call("join", "eve", room="r1")
        with pytest.raises(DriverError) as refused:
            await driver.call("edit", "eve", room="r1", id=ack["id"], text="yours?")
        assert refused.value.code == "forbidden"
        await driver.call("create_room", "ada", room="secret", private=True)
        with pytest.raises(DriverError) as refused:
            await driver.call("create_room", "eve", room="secret")
        assert refused.value.code == "exists"
        with pytest.raises(DriverError) as refused:
            await driver.call("join", "eve", room="secret")
        assert refused.value.code == "not_found"
        await driver.call("join", "ada", room="r2")
        with pytest.raises(DriverError) as refused:
            await driver.call("join", "ada", room="r3")
        assert refused.value.code == "too_many_rooms"


async def test_limits_and_a_server_without_a_store_reject_with_their_codes(
    driver: Driver,
) -> None:
    """On a server without a store, ``create`` rejects with ``no_store``; past the user's
    message rate a send rejects with ``rate_limited`` (not retried: the app decides); a
    ``leave`` is answered (``left``)."""
    settings = make_settings(user_messages_per_s=0.1, user_message_burst=1)
    async with run_server(settings) as live:
        await driver.call("connect", "ada", url=live.ws_url(), name="ada")
        with pytest.raises(DriverError) as refused:
            await driver.call("create_room", "ada", room="team")
        assert refused.value.code == "no_store"
        await driver.call("join", "ada", room="lobby")
        await driver.call("send", "ada", room="lobby", text="one")
        with pytest.raises(DriverError) as refused:
            await driver.call("send", "ada", room="lobby", text="two")
        assert refused.value.code == "rate_limited"
        await driver.call("leave", "ada", room="lobby")
        assert (await driver.event("ada", "left", lambda f: f["room"] == "lobby"))["room"]


async def test_direct_messages_edits_reactions_typing_presence(
    driver: Driver, tmp_path: Path
) -> None:
    """DMs reach the other user (and its history), edits and reactions arrive as events on
    their target, typing and presence reach the room's members."""
    async with run_server(make_settings(database_url=f"sqlite:///{tmp_path}/c.db")) as live:
        await driver.call("connect", "ada", url=live.ws_url(), name="ada")
        await driver.call("connect", "bob", url=live.ws_url(), name="bob")
        await driver.call("join", "bob", room="lobby")
        await driver.call("join", "ada", room="lobby")
        await driver.event("bob", "presence", lambda p: p.get("user") == "ada")
        await driver.call("send_to", "ada", user="bob", text="psst")
        direct = await driver.event("bob", "direct", lambda m: m["text"] == "psst")
        assert direct["user"] == "ada" and direct["to"] == "bob"
        assert [m["text"] for m in await driver.call("direct_history", "bob", user="ada")] == [
            "psst"
        ]
        ack = await driver.call("send", "ada", room="lobby", text="draft")
        await driver.call("edit", "ada", room="lobby", id=ack["id"], text="final")
        edited = await driver.event("bob", "edited", lambda e: e["target"] == ack["id"])
        assert edited["text"] == "final"
        await driver.call("react", "bob", room="lobby", id=ack["id"], emoji="🎉")
        reaction = await driver.event("ada", "reaction", lambda e: e["target"] == ack["id"])
        assert reaction["on"] is True and reaction["user"] == "bob"
        await driver.call("typing", "ada", room="lobby")
        await driver.event("bob", "typing", lambda t: t["user"] == "ada")


async def test_private_rooms_invitations(driver: Driver, tmp_path: Path) -> None:
    """An invited member is told (invited) and may join and read; the room's members see it."""
    async with run_server(make_settings(database_url=f"sqlite:///{tmp_path}/c.db")) as live:
        await driver.call("connect", "ada", url=live.ws_url(), name="ada")
        await driver.call("connect", "bob", url=live.ws_url(), name="bob")
        created = await driver.call("create_room", "ada", room="team", private=True)
        assert created["private"] is True and created["role"] == "owner"
        await driver.call("join", "ada", room="team")
        await driver.call("send", "ada", room="team", text="welcome")
        await driver.call("invite", "ada", room="team", user="bob")
        invited = await driver.event("bob", "invited", lambda i: i["room"] == "team")
        assert invited["by"] == "ada"
        await driver.call("join", "bob", room="team")
        assert [m["text"] for m in await driver.call("history", "bob", room="team")] == ["welcome"]


async def test_jwt_tokens_are_asked_again_on_refresh(driver: Driver, tmp_path: Path) -> None:
    """With JWTs, the SDK sends its token in the first frame and, when the server says the
    token expires soon (refresh), asks for a new one: the connection goes on (authenticated)."""

    def token(ttl_s: float) -> str:
        claims = {"sub": "ada", "exp": int(time.time() + ttl_s)}
        return jwt.encode(claims, SECRET, "HS256")

    settings = make_settings(
        auth_mode="jwt", jwt_secret=SECRET, token_refresh_before_s=58,
        database_url=f"sqlite:///{tmp_path}/c.db",
    )  # fmt: skip
    async with run_server(settings) as live:
        tokens = [token(60), token(3600)]
        assert (await driver.call("connect", "ada", url=live.ws_url(), tokens=tokens))[
            "user"
        ] == "ada"
        authenticated = await driver.event("ada", "authenticated", timeout=15)
        assert authenticated["user"] == "ada" and authenticated["exp"] > time.time() + 1000
        await driver.call("join", "ada", room="lobby")
        await driver.call("send", "ada", room="lobby", text="still here")


@pytest.mark.parametrize("how", ["drained", "killed"])
async def test_recovery_after_a_server_restart(
    driver: Driver, redis_server: RedisServer, how: str
) -> None:
    """Two servers on one Redis; ada on A. A is drained (1012) or SIGKILLed and comes back on
    its port while bob, on B, sends: ada's SDK reconnects by itself, rejoins with ``since``
    and delivers every message once and in order; a send made while it was away is acked."""
    env = {"CHAT_REDIS_URL": redis_server.url, "CHAT_DRAIN_WINDOW_S": "0.2"}
    a, b = AppProcess(env), AppProcess(env)
    await a.start()
    await b.start()
    restarted: AppProcess | None = None
    options = {"baseDelayMs": 100, "maxDelayMs": 400, "base_delay_s": 0.1, "max_delay_s": 0.4}
    try:
        await driver.call("connect", "ada", url=f"ws://127.0.0.1:{a.port}/ws", name="ada",
                          options=options)  # fmt: skip
        await driver.call("connect", "bob", url=f"ws://127.0.0.1:{b.port}/ws", name="bob")
        await driver.call("join", "ada", room="rec")
        await driver.call("join", "bob", room="rec")
        await driver.call("send", "bob", room="rec", text="before")
        await driver.event("ada", "message", lambda m: m["text"] == "before")
        if how == "drained":
            a.signal(signal.SIGTERM)
            await a.wait()
        else:
            await a.stop()
        await driver.event("ada", "state", lambda s: s["state"] == "reconnecting")
        offline = asyncio.create_task(driver.call("send", "ada", room="rec", text="offline"))
        for k in range(10):
            await driver.call("send", "bob", room="rec", text=f"m{k}")
        restarted = AppProcess(env, port=a.port)
        await restarted.start()
        ack = await offline
        await driver.event("ada", "message", lambda m: m["text"] == "offline", timeout=20)
        texts = [m["text"] for m in driver.seen("ada", "message")]
        assert texts == ["before", *(f"m{k}" for k in range(10)), "offline"]
        assert driver.seen("ada", "message")[-1]["id"] == ack["id"]
        codes = [s.get("code") for s in driver.seen("ada", "state") if s["state"] == "reconnecting"]
        assert codes[0] == (1012 if how == "drained" else 1006), codes
        assert not driver.seen("ada", "resync")
    finally:
        for app in (a, b, restarted):
            if app is not None:
                await app.stop()


async def test_a_recovery_that_cannot_be_vouched_for_is_a_resync(
    driver: Driver, redis_server: RedisServer
) -> None:
    """More missed than the server replays (CHAT_RECOVERY_MAX_MESSAGES=2): the rejoin is
    answered ``recovered: false`` and the SDK says so (its discontinuity event)."""
    env = {
        "CHAT_REDIS_URL": redis_server.url, "CHAT_DRAIN_WINDOW_S": "0.2",
        "CHAT_RECOVERY_MAX_MESSAGES": "2",
    }  # fmt: skip
    a, b = AppProcess(env), AppProcess(env)
    await a.start()
    await b.start()
    restarted: AppProcess | None = None
    try:
        await driver.call("connect", "ada", url=f"ws://127.0.0.1:{a.port}/ws", name="ada")
        await driver.call("connect", "bob", url=f"ws://127.0.0.1:{b.port}/ws", name="bob")
        await driver.call("join", "ada", room="gap")
        await driver.call("join", "bob", room="gap")
        await driver.call("send", "bob", room="gap", text="seen")
        await driver.event("ada", "message", lambda m: m["text"] == "seen")
        a.signal(signal.SIGTERM)
        await a.wait()
        for k in range(5):
            await driver.call("send", "bob", room="gap", text=f"missed{k}")
        restarted = AppProcess(env, port=a.port)
        await restarted.start()
        gap = await driver.event("ada", "resync", timeout=20)
        assert gap["room"] == "gap"
    finally:
        for app in (a, b, restarted):
            if app is not None:
                await app.stop()


async def test_a_terminal_close_leaves_the_client_closed(driver: Driver) -> None:
    """1008 (an invalid name) is not retried: the connect fails, the state ends closed."""
    async with run_server(make_settings()) as live:
        with pytest.raises(DriverError) as refused:
            await driver.call("connect", "x", url=live.ws_url(), name="not a name!")
        assert refused.value.code == "close_1008"
        states = [(s["state"], s.get("code")) for s in driver.seen("x", "state")]
        assert states == [("connecting", None), ("closed", 1008)]


async def test_a_slow_consumer_is_cut_off_and_comes_back_whole(driver: Driver) -> None:
    """The SDK's process stops reading (SIGSTOP) while 6 MB arrive for it: the server closes
    it with 4008 (slow consumer) rather than queue without bound; resumed, the SDK reconnects
    by itself, rejoins with ``since`` and delivers every message once and in order."""
    settings = make_settings(
        outbox_max_bytes=65_536, history_size=5_000, recovery_max_messages=5_000
    )
    texts = [f"{n:05d}" + "x" * 2_000 for n in range(3_000)]
    async with run_server(settings) as live:
        await driver.call("connect", "ada", url=live.ws_url(), name="ada",
                          options={"baseDelayMs": 100, "base_delay_s": 0.1})  # fmt: skip
        await driver.call("join", "ada", room="flood")
        async with ChatClient.connect(live.ws_url("bob")) as bob:
            await bob.join("flood")
            os.kill(driver.proc.pid, signal.SIGSTOP)
            try:
                for text in texts:  # each after the last came back: bob is no slow reader
                    await bob.say("flood", text)
                    await bob.messages_until(text)
            finally:
                os.kill(driver.proc.pid, signal.SIGCONT)
        await driver.event("ada", "state", lambda s: s.get("code") == 4008, timeout=30)
        last = texts[-1]
        await driver.event("ada", "message", lambda m: m["text"] == last, timeout=60)
        assert [m["text"] for m in driver.seen("ada", "message")] == texts
        assert not driver.seen("ada", "resync")


async def test_a_redis_that_lost_everything_is_a_resync(driver: Driver) -> None:
    """Redis restarts empty under the server: the server tells the SDK its room may have a gap
    (``resync``); the SDK rejoins, is answered ``recovered: false`` and says so (its
    discontinuity event); sends are acked again once Redis is back."""
    redis = RedisServer()
    await redis.start()
    env = {"CHAT_REDIS_URL": redis.url, "CHAT_REDIS_RECONNECT_MAX_S": "0.3",
           "CHAT_CANARY_INTERVAL_S": "0.3", "CHAT_CANARY_TIMEOUT_S": "1"}  # fmt: skip
    app = AppProcess(env)
    await app.start()
    try:
        await driver.call("connect", "ada", url=f"ws://127.0.0.1:{app.port}/ws", name="ada")
        await driver.call("join", "ada", room="wiped")
        await driver.call("send", "ada", room="wiped", text="before")
        await redis.kill()
        await redis.start()
        gap = await driver.event("ada", "resync", timeout=30)
        assert gap["room"] == "wiped"
        async with asyncio.timeout(30):  # broker_unavailable until the server is back on it
            while True:
                try:
                    await driver.call("send", "ada", room="wiped", text="after", cid="a1")
                    break
                except DriverError as refused:
                    assert refused.code in ("broker_unavailable", "AckTimeoutError")
                    await asyncio.sleep(0.2)
        await driver.event("ada", "message", lambda m: m["text"] == "after")
    finally:
        await app.stop()
        await redis.stop()
