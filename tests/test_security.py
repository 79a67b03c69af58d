"""Security and abuse resistance: JWT authentication, the Origin allow-list, per-user and
per-address quotas across servers, moderation (kick, ban), and fuzzed input on a live socket."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from app.errors import CloseCode
from app.settings import SettingsError, load_settings
from tests.helpers import ChatClient, LiveServer, make_settings, raw_upgrade, run_server, wait_until
from tests.processes import AppProcess, NginxServer, RedisServer, server_on
from tests.prom import scrape
from tests.test_direct_writes import RawReader

SECRET = "a-test-secret-that-is-long-enough-for-hs256"


def token(
    sub: str = "ada", ttl_s: float = 60, key: Any = SECRET, algorithm: str = "HS256", **claims: Any
) -> str:
    headers = claims.pop("headers", None)
    payload = {"sub": sub, "exp": int(time.time() + ttl_s), **claims}
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


async def refused_with(url: str, first_frame: dict[str, Any] | None = None) -> tuple[int, str]:
    """Connect, optionally send one frame, and return the close code and reason."""
    async with connect(url, open_timeout=5) as ws:
        if first_frame is not None:
            await ws.send(json.dumps(first_frame))
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(10):
                while True:
                    await ws.recv()
        assert ws.close_code is not None
        return ws.close_code, ws.close_reason or ""


@contextlib.asynccontextmanager
async def jwt_server(**overrides: Any) -> AsyncIterator[LiveServer]:
    settings = make_settings(auth_mode="jwt", **({"jwt_secret": SECRET} | overrides))
    async with run_server(settings) as server:
        yield server


def ws_url(server: LiveServer, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.port}/ws{query}"


# -- tokens -------------------------------------------------------------------------------


async def test_valid_token_in_query_or_first_frame() -> None:
    async with jwt_server() as server:
        async with ChatClient.connect(ws_url(server, f"?token={token('ada')}")) as ada:
            assert ada.hello["user"] == "ada"
            assert ada.hello["exp"] > time.time()
            await ada.join("r")
        async with connect(ws_url(server), open_timeout=5) as ws:
            await ws.send(json.dumps({"type": "auth", "token": token("bob")}))
            hello = json.loads(str(await ws.recv()).split("\n")[0])
            assert (hello["type"], hello["user"]) == ("hello", "bob")
        # ?name= means nothing in jwt mode: without a token nobody gets in.
        code, _ = await refused_with(ws_url(server, "?name=ada"), {"type": "join", "room": "r"})
        assert code == CloseCode.AUTH_FAILED


@pytest.mark.parametrize(
    ("case", "bad"),
    [
        ("expired", lambda: token(ttl_s=-120)),
        ("wrong secret", lambda: token(key="another-secret-of-at-least-32-bytes!!")),
        ("alg none", lambda: jwt.encode({"sub": "ada", "exp": time.time() + 60}, "", "none")),
        ("no exp", lambda: jwt.encode({"sub": "ada"}, SECRET, "HS256")),
        ("bad sub", lambda: token(sub="not a name!")),
        ("garbage", lambda: "not.a.token"),
    ],
)
async def test_bad_tokens_are_refused(case: str, bad: Any) -> None:
    async with jwt_server() as server:
        code, reason = await refused_with(ws_url(server, f"?token={bad()}"))
        assert code == CloseCode.AUTH_FAILED, (case, reason)
        code, _ = await refused_with(ws_url(server), {"type": "auth", "token": bad()})
        assert code == CloseCode.AUTH_FAILED, case
        assert await server_still_serves(server)


async def server_still_serves(server: LiveServer) -> bool:
    async with ChatClient.connect(ws_url(server, f"?token={token('probe')}")) as probe:
        return await probe.is_responsive()


async def test_no_auth_frame_in_time_or_another_frame_first() -> None:
    async with jwt_server(auth_timeout_s=0.3) as server:
        started = time.monotonic()
        code, reason = await refused_with(ws_url(server))
        assert (code, reason) == (CloseCode.AUTH_FAILED, "no auth frame in time")
        assert time.monotonic() - started < 3
        code, _ = await refused_with(ws_url(server), {"type": "join", "room": "r"})
        assert code == CloseCode.AUTH_FAILED


def _keys(tmp_path: Path) -> dict[str, Any]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_public = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "rsa.pem").write_bytes(rsa_public)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk | {"kid": "k1", "alg": "ES256"}]}))
    return {"rsa": rsa_key, "rsa_public": rsa_public, "ec": ec_key}


async def test_public_key_modes_refuse_algorithm_confusion(tmp_path: Path) -> None:
    """RS256 with a PEM key, ES256 from a JWKS by ``kid``: valid tokens pass; an HS256 token
    "signed" with the public key as the secret (the classic confusion attack) does not."""
    keys = _keys(tmp_path)
    pem = str(tmp_path / "rsa.pem")
    async with jwt_server(jwt_secret=None, jwt_public_key_file=pem) as server:
        good = token("ada", key=keys["rsa"], algorithm="RS256")
        async with ChatClient.connect(ws_url(server, f"?token={good}")) as ada:
            assert ada.hello["user"] == "ada"
        forged = _forge_hs256(keys["rsa_public"])
        code, _ = await refused_with(ws_url(server, f"?token={forged}"))
        assert code == CloseCode.AUTH_FAILED
    jwks = str(tmp_path / "jwks.json")
    async with jwt_server(jwt_secret=None, jwt_jwks_file=jwks) as server:
        good = token("eve", key=keys["ec"], algorithm="ES256", headers={"kid": "k1"})
        async with ChatClient.connect(ws_url(server, f"?token={good}")) as eve:
            assert eve.hello["user"] == "eve"
        unknown = token("eve", key=keys["ec"], algorithm="ES256", headers={"kid": "k2"})
        code, reason = await refused_with(ws_url(server, f"?token={unknown}"))
        assert (code, reason) == (CloseCode.AUTH_FAILED, "unknown key id (kid)")


def _forge_hs256(public_pem: bytes) -> str:
    """An HS256 token whose HMAC key is the server's public key (PyJWT refuses to make one,
    so it is assembled by hand)."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "ada", "exp": int(time.time() + 60)}).encode())
    signature = hmac.new(public_pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(signature)}"


async def test_rooms_claim_limits_joins_and_sends() -> None:
    async with jwt_server() as server:
        limited = token("ada", rooms=["team-*", "lobby"])
        async with ChatClient.connect(ws_url(server, f"?token={limited}")) as ada:
            assert (await ada.join("team-a"))["room"] == "team-a"
            assert (await ada.join("lobby"))["room"] == "lobby"
            await ada.send({"type": "join", "room": "secret"})
            error = await ada.expect("error")
            assert (error["code"], error["ref"]) == ("forbidden", "join")
            await ada.send({"type": "send", "room": "secret", "text": "x", "cid": "c"})
            assert (await ada.expect("error"))["code"] == "forbidden"
            await ada.send({"type": "send", "to": "bob", "text": "dm ok", "cid": "d"})
            frames = [await ada.next_frame() for _ in range(2)]  # own copy + ack
            assert {f["type"] for f in frames} == {"message", "ack"}


async def test_history_needs_the_sockets_token_and_its_rooms_claim() -> None:
    """In jwt mode `GET /rooms/{room}/messages` takes the socket's token as a bearer token:
    401 without one or with a bad one, 403 for a room outside its rooms claim."""
    async with jwt_server() as server:
        async with ChatClient.connect(ws_url(server, f"?token={token('ada')}")) as ada:
            await ada.join("team-a")
            await ada.say("team-a", "for the team only")
            await ada.expect("message")
        url = f"{server.http_url}/rooms/team-a/messages"
        outsider = token("eve", rooms=["lobby"])
        async with httpx.AsyncClient() as http:
            for headers in ({}, {"Authorization": "Bearer garbage"}, {"Authorization": "x y"}):
                refused = await http.get(url, headers=headers)
                assert refused.status_code == 401 and "team" not in refused.text
            forbidden = await http.get(url, headers={"Authorization": f"Bearer {outsider}"})
            assert forbidden.status_code == 403
            allowed = await http.get(url, headers={"Authorization": f"Bearer {token('bob')}"})
            assert allowed.status_code == 200
            assert [m["text"] for m in allowed.json()["messages"]] == ["for the team only"]


async def test_history_reads_are_rate_limited_per_user() -> None:
    """History reads count against the reader's quota (here its token's user): past the
    burst, 429 with Retry-After; another user is not affected."""
    async with jwt_server(history_reads_per_s=0.01, history_read_burst=3) as server:
        url = f"{server.http_url}/rooms/r/messages"
        async with ChatClient.connect(f"{server.ws_url()}?token={token('cy')}") as cy:
            await cy.join("r")  # in use: a room nobody uses is a 404
        async with httpx.AsyncClient() as http:
            ada = {"Authorization": f"Bearer {token('ada')}"}
            codes = [(await http.get(url, headers=ada)).status_code for _ in range(5)]
            assert codes == [200] * 3 + [429] * 2
            assert (await http.get(url, headers=ada)).headers["retry-after"] == "1"
            bob = {"Authorization": f"Bearer {token('bob')}"}
            assert (await http.get(url, headers=bob)).status_code == 200


@pytest.mark.parametrize(
    ("case", "settings", "claims"),
    [
        ("lives too long", {}, {"ttl_s": 2 * 86_400}),
        (
            "lives too long by iat",
            {"jwt_max_lifetime_s": 60},
            {"ttl_s": 30, "iat": time.time() - 100},
        ),
        ("no rooms claim", {"jwt_require_rooms": True}, {}),
        ("wrong audience", {"jwt_audience": "chat"}, {"aud": "billing"}),
        ("no issuer", {"jwt_issuer": "https://id.example"}, {}),
    ],
)
async def test_token_policy_settings_refuse(
    case: str, settings: dict[str, Any], claims: dict[str, Any]
) -> None:
    """CHAT_JWT_MAX_LIFETIME_S (a day by default), CHAT_JWT_REQUIRE_ROOMS, CHAT_JWT_AUDIENCE
    and CHAT_JWT_ISSUER each refuse a token that does not meet them (4001)."""
    async with jwt_server(**settings) as server:
        code, _ = await refused_with(ws_url(server, f"?token={token('ada', **claims)}"))
        assert code == CloseCode.AUTH_FAILED, case
        good: dict[str, Any] = {"rooms": ["lobby"], "aud": "chat", "iss": "https://id.example"}
        async with ChatClient.connect(ws_url(server, f"?token={token('ada', **good)}")) as ok:
            assert ok.hello["user"] == "ada"


async def test_token_refresh_keeps_the_connection_and_its_absence_closes_it() -> None:
    async with jwt_server(token_refresh_before_s=1.5, jwt_leeway_s=0) as server:
        short = token("ada", ttl_s=2.5)
        async with (
            ChatClient.connect(ws_url(server, f"?token={short}")) as refreshed,
            ChatClient.connect(ws_url(server, f"?token={token('bob', ttl_s=2.5)}")) as idle,
        ):
            await refreshed.join("r")
            refresh = await refreshed.expect("refresh", timeout=5)
            assert refresh["exp"] == refreshed.hello["exp"]
            await refreshed.send({"type": "auth", "token": token("ada", ttl_s=60, rooms=["x"])})
            assert (await refreshed.expect("left"))["room"] == "r"  # the new claim drops r
            assert (await refreshed.expect("authenticated"))["exp"] > time.time() + 30
            assert await idle.closed_with(timeout=6) == CloseCode.TOKEN_EXPIRED
            assert await refreshed.is_responsive()  # past the first token's expiry
            await refreshed.send({"type": "auth", "token": token("mallory")})
            assert await refreshed.closed_with() == CloseCode.AUTH_FAILED


# -- Origin -------------------------------------------------------------------------------


async def test_foreign_origins_are_refused_before_the_socket_opens() -> None:
    settings = make_settings(allowed_origins="https://chat.example.com")
    async with run_server(settings) as server:
        url = server.ws_url("ada")
        for origin in ("https://evil.example", "null", f"http://127.0.0.1:{server.port + 1}"):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(url, origin=origin, open_timeout=5):  # type: ignore[arg-type]
                    pass
            assert refused.value.response.status_code == 403
        allowed: list[str | None] = [
            f"http://127.0.0.1:{server.port}", "https://chat.example.com", None,
        ]  # fmt: skip
        for maybe_origin in allowed:
            async with ChatClient.connect(url, origin=maybe_origin) as client:
                assert await client.is_responsive()
        metrics = await scrape(f"{server.http_url}/metrics")
        assert metrics.value("hubbub_upgrades_refused_total", reason="origin") == 3
        assert metrics.value("hubbub_connections_opened_total") == 3


# -- quotas across servers ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def two_processes(redis: RedisServer, env: dict[str, str]) -> AsyncIterator[list[AppProcess]]:
    apps = [AppProcess({"CHAT_REDIS_URL": redis.url, **env}) for _ in range(2)]
    try:
        await asyncio.gather(*(app.start() for app in apps))
        yield apps
    finally:
        for app in apps:
            await app.stop()


async def test_per_user_connection_cap_holds_across_servers(redis_server: RedisServer) -> None:
    async with two_processes(redis_server, {"CHAT_MAX_CONNECTIONS_PER_USER": "2"}) as (a, b):
        async with ChatClient.connect(a.ws_url("ada")), ChatClient.connect(b.ws_url("ada")):
            code, reason = await refused_with(a.ws_url("ada"))
            assert (code, reason) == (4029, "too many connections for this user")
            async with ChatClient.connect(a.ws_url("bob")) as bob:  # others are not affected
                assert await bob.is_responsive()
        # Both closed: the count went back down on both servers.
        async with asyncio.timeout(5):
            while True:
                try:
                    async with ChatClient.connect(b.ws_url("ada")) as again:
                        assert await again.is_responsive()
                        break
                except (ConnectionClosed, AssertionError):
                    await asyncio.sleep(0.1)


async def test_per_user_message_rate_is_shared_by_servers(redis_server: RedisServer) -> None:
    env = {"CHAT_USER_MESSAGES_PER_S": "0.1", "CHAT_USER_MESSAGE_BURST": "3"}
    async with (
        two_processes(redis_server, env) as (a, b),
        ChatClient.connect(a.ws_url("ada")) as on_a,
        ChatClient.connect(b.ws_url("ada")) as on_b,
        ChatClient.connect(b.ws_url("bob")) as bob,
    ):
        for client in (on_a, on_b, bob):
            await client.join("r")
        for k in range(3):
            await on_a.say("r", f"a{k}", cid=f"a{k}")
        acks = [await on_a.next_frame(skip=("ping", "presence", "message")) for _ in range(3)]
        assert [ack["cid"] for ack in acks] == ["a0", "a1", "a2"]  # the budget is spent
        await on_b.say("r", "one too many", cid="b0")
        error = await on_b.next_frame(skip=("ping", "presence", "message"))
        assert (error.get("code"), error.get("cid")) == ("rate_limited", "b0"), error
        await on_b.say_to("bob", "a direct message draws on the same budget", cid="d0")
        error = await on_b.next_frame(skip=("ping", "presence", "message"))
        assert (error.get("code"), error.get("cid")) == ("rate_limited", "d0"), error
        await bob.say("r", "bob has his own budget")
        got = [m["text"] for m in await bob.messages_until("bob has his own budget")]
        assert got == ["a0", "a1", "a2", "bob has his own budget"]


async def test_per_address_connection_rate_across_servers(redis_server: RedisServer) -> None:
    env = {"CHAT_IP_CONNECTIONS_PER_S": "0.01", "CHAT_IP_CONNECTION_BURST": "3"}
    async with two_processes(redis_server, env) as (a, b):
        for n, app in enumerate([a, b, a]):
            async with ChatClient.connect(app.ws_url(f"u{n}")) as client:
                assert await client.is_responsive()
        code, reason = await refused_with(b.ws_url("u3"))
        assert (code, reason) == (4029, "too many new connections from this address")


# -- moderation ---------------------------------------------------------------------------


async def test_kick_and_ban_reach_every_server(redis_server: RedisServer) -> None:
    admin = {"Authorization": "Bearer let-me-moderate-with-a-long-enough-token"}
    async with (
        two_processes(
            redis_server, {"CHAT_ADMIN_TOKEN": "let-me-moderate-with-a-long-enough-token"}
        ) as (a, b),
        httpx.AsyncClient() as http,
    ):
        async with (
            ChatClient.connect(b.ws_url("troll")) as troll1,
            ChatClient.connect(b.ws_url("troll")) as troll2,
            ChatClient.connect(b.ws_url("nice")) as nice,
        ):
            denied = await http.post(f"{a.http_url}/admin/users/troll/kick")
            assert denied.status_code == 401
            wrong = {"Authorization": "Bearer guess"}
            assert (
                await http.post(f"{a.http_url}/admin/users/troll/kick", headers=wrong)
            ).status_code == 401
            kicked = await http.post(f"{a.http_url}/admin/users/troll/kick", headers=admin)
            assert kicked.status_code == 202
            assert await troll1.closed_with() == CloseCode.FORBIDDEN
            assert await troll2.closed_with() == CloseCode.FORBIDDEN
            assert await nice.is_responsive()
        ban = {"duration_s": 60, "reason": "spam"}
        put = await http.put(f"{b.http_url}/admin/users/troll/ban", json=ban, headers=admin)
        assert put.status_code == 200
        assert await refused_with(a.ws_url("troll")) == (CloseCode.FORBIDDEN, "banned")
        info = (await http.get(f"{a.http_url}/admin/users/troll/ban", headers=admin)).json()
        assert info["reason"] == "spam" and 0 < info["expires_in_s"] <= 60
        bad = await http.put(
            f"{a.http_url}/admin/users/troll/ban", json={"duration_s": -1}, headers=admin
        )
        assert bad.status_code == 422
        assert (
            await http.delete(f"{a.http_url}/admin/users/troll/ban", headers=admin)
        ).status_code == 204
        async with ChatClient.connect(a.ws_url("troll")) as back:
            assert await back.is_responsive()


async def test_moderation_api_is_off_without_a_token(server: LiveServer) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{server.http_url}/admin/users/x/kick")
    assert response.status_code == 404


def test_a_short_admin_token_is_refused() -> None:
    """An admin token shorter than 32 characters can be guessed: the server refuses it."""
    with pytest.raises(SettingsError, match="ADMIN_TOKEN"):
        load_settings(auth_mode="guest", admin_token="let-me-in")


async def test_failed_admin_logins_are_limited() -> None:
    """Five wrong admin tokens from an address lock it out (429, even with the right token)
    for a minute: a token cannot be guessed online."""
    admin_token = "k" * 40
    async with run_server(make_settings(admin_token=admin_token)) as live:
        url = f"{live.http_url}/admin/users/x/kick"
        async with httpx.AsyncClient() as http:
            codes = [
                (await http.post(url, headers={"Authorization": f"Bearer guess{n}"})).status_code
                for n in range(6)
            ]
            assert codes == [401] * 5 + [429]
            right = await http.post(url, headers={"Authorization": f"Bearer {admin_token}"})
            assert right.status_code == 429


def _from(address: str) -> httpx.AsyncClient:
    """An HTTP client whose connections come from ``address`` (a loopback one)."""
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address))


async def test_rotating_forwarded_for_from_a_trusted_proxy_does_not_dodge_the_lockout() -> None:
    """A client at a trusted proxy's address (127.0.0.1 here, as behind `make run`'s
    defaults or in a cluster that trusts its pod network) writes a new X-Forwarded-For for
    every guess: each made-up address would get a fresh budget, but the failures count
    against the proxy's own address too, so the sixth guess gets 429, and so does the right
    token (admin or service: one lockout), whatever address the header names next. A
    backend on another address is not locked out."""
    admin_token, service_token = "k" * 40, "s" * 40
    settings = make_settings(admin_token=admin_token, service_token=service_token)
    async with run_server(settings) as live:
        kick, rooms = f"{live.http_url}/admin/users/x/kick", f"{live.http_url}/api/v1/users/x/rooms"

        def headers(n: int, token: str) -> dict[str, str]:
            return {"X-Forwarded-For": f"203.0.113.{n}", "Authorization": f"Bearer {token}"}

        async with _from("127.0.0.1") as attacker:
            codes = [
                (await attacker.post(kick, headers=headers(n, f"guess{n}"))).status_code
                for n in range(12)
            ]
            assert codes == [401] * 5 + [429] * 7, codes
            right = await attacker.post(kick, headers=headers(100, admin_token))
            assert right.status_code == 429 and 1 <= int(right.headers["Retry-After"]) <= 60
            assert (
                await attacker.get(rooms, headers=headers(101, service_token))
            ).status_code == 429
        async with _from("127.0.0.2") as backend:
            bearer = {"Authorization": f"Bearer {admin_token}"}
            assert (await backend.post(kick, headers=bearer)).status_code == 202


async def test_failures_from_every_address_together_are_bounded() -> None:
    """However many addresses guesses come from (forwarded or real), a worker takes no more
    than CHAT_BEARER_MAX_FAILURES_TOTAL failures per window: past them everyone gets 429,
    the right token too, until the window ends; then the right token works again."""
    admin_token = "k" * 40
    settings = make_settings(
        admin_token=admin_token,
        bearer_max_failures=1_000,  # no address runs out of its own budget here
        bearer_max_failures_total=8,
        bearer_failure_window_s=1.5,
    )
    async with run_server(settings) as live:
        kick = f"{live.http_url}/admin/users/x/kick"
        codes = []
        for n in range(12):
            # Half through a trusted proxy naming a new address each time, half from addresses
            # of their own.
            forwarded = {"X-Forwarded-For": f"198.51.100.{n}"} if n % 2 else {}
            async with _from("127.0.0.1" if n % 2 else f"127.0.0.{2 + n}") as guesser:
                bearer = {"Authorization": f"Bearer guess{n}", **forwarded}
                codes.append((await guesser.post(kick, headers=bearer)).status_code)
        assert codes == [401] * 8 + [429] * 4, codes
        async with _from("127.0.0.100") as backend:
            bearer = {"Authorization": f"Bearer {admin_token}"}
            locked = await backend.post(kick, headers=bearer)
            assert locked.status_code == 429 and int(locked.headers["Retry-After"]) <= 2
            await asyncio.sleep(1.6)
            assert (await backend.post(kick, headers=bearer)).status_code == 202


async def test_typing_is_limited_per_user_not_per_connection() -> None:
    """One user with three sockets typing as fast as it can: the room gets no more typing
    notices than the user's burst (CHAT_USER_TYPING_BURST); the rest are refused."""
    settings = make_settings(user_typing_per_s=0.01, user_typing_burst=4)
    async with run_server(settings) as live, contextlib.AsyncExitStack() as stack:
        tabs = [
            await stack.enter_async_context(ChatClient.connect(live.ws_url("spam")))
            for _ in range(3)
        ]
        reader = await stack.enter_async_context(ChatClient.connect(live.ws_url("reader")))
        for client in (reader, *tabs):
            await client.join("r")
        for _ in range(5):
            for tab in tabs:
                await tab.send({"type": "typing", "room": "r"})
        refused = 0
        async with asyncio.timeout(10):
            while refused < 11:
                for tab in tabs:
                    with contextlib.suppress(TimeoutError):
                        frame = await tab.next_frame(0.05, skip=("ping", "presence", "typing"))
                        assert (frame["type"], frame["code"]) == ("error", "rate_limited")
                        refused += 1
        await reader.send({"type": "ping"})  # a barrier: the notices came before its pong
        notices = 0
        while (frame := await reader.next_frame(skip=("ping", "presence")))["type"] != "pong":
            notices += frame["type"] == "typing"
        assert notices == 4


async def test_rejoining_a_joined_room_costs_a_join() -> None:
    """A join of a room the connection is already in (an answer with the room's presence) is
    counted against the join quota like any join."""
    async with run_server(make_settings(user_joins_per_s=0.01, user_join_burst=3)) as live:
        async with ChatClient.connect(live.ws_url("u")) as client:
            answers = []
            for _ in range(5):
                await client.send({"type": "join", "room": "r"})
                frame = await client.next_frame()
                answers.append(frame["type"] if frame["type"] == "joined" else frame["code"])
            assert answers == ["joined"] * 3 + ["rate_limited"] * 2


# -- fuzzing ------------------------------------------------------------------------------


def _fuzz_frames(seed: int, count: int) -> list[str | bytes]:
    """Malformed and hostile frames: random bytes, broken and deeply nested JSON, huge
    numbers, very long names, wrong types, control characters."""
    rng = random.Random(seed)
    frames: list[str | bytes] = []
    makers: list[Callable[[], str | bytes]] = [
        lambda: rng.randbytes(rng.randint(0, 2000)),
        lambda: "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 300))),
        lambda: "[" * rng.randint(100, 20_000) + "]" * rng.randint(0, 100),
        lambda: '{"type":"join","room":' + "[" * 5000 + "]" * 5000 + "}",
        lambda: '{"type":"join","room":"r","since":' + "9" * rng.randint(20, 4000) + "}",
        lambda: '{"type":"send","room":"r","text":"x","cid":1e999999}',
        lambda: json.dumps({"type": "join", "room": "r" * rng.randint(65, 20_000)}),
        lambda: json.dumps({"type": "send", "to": "u" * 5000, "text": "x"}),
        lambda: json.dumps({"type": rng.choice(["send", "join", "auth", "typing", None, 7])}),
        lambda: json.dumps({"type": "send", "room": "r", "text": rng.choice([None, 5, [], {}])}),
        lambda: json.dumps({"type": "send", "room": "r", "text": "\x00\u202e\ud7ff", "cid": "c"}),
        lambda: json.dumps({"type": "auth", "token": "x" * 9000}),
        lambda: json.dumps([{"type": "ping"}] * 100),
        lambda: '{"type":"ping"' + "," * rng.randint(1, 50),
    ]
    for _ in range(count):
        frames.append(rng.choice(makers)())
    return frames


async def test_fuzzed_frames_break_nothing(server: LiveServer) -> None:
    """300 hostile frames on one socket: each gets an error frame (or is a frame the server
    may take), the socket stays usable, a bystander in a room sees nothing, and afterwards no
    connection or task is left over."""
    baseline_tasks = len(asyncio.all_tasks())
    async with (
        ChatClient.connect(server.ws_url("bystander")) as bystander,
        ChatClient.connect(server.ws_url("fuzzer")) as fuzzer,
    ):
        await bystander.join("r")
        await fuzzer.join("r")
        frames = _fuzz_frames(seed=7, count=300)
        for frame in frames:
            await fuzzer.ws.send(frame)
        await fuzzer.send({"type": "ping"})
        answers: list[dict[str, Any]] = []
        async with asyncio.timeout(20):  # every frame is answered, in order, before the pong
            while not answers or answers[-1]["type"] != "pong":
                answers.append(await fuzzer.next_frame(skip=("ping", "presence", "typing")))
        errors = [a for a in answers if a["type"] == "error"]
        assert len(errors) >= 250, f"only {len(errors)} error frames for {len(frames)} frames"
        assert {a["type"] for a in answers} <= {"error", "pong", "message", "ack"}
        await fuzzer.say("r", "still here")
        got = await bystander.messages_until("still here")
        assert {m["user"] for m in got} == {"fuzzer"}  # only the valid sends among the junk
        assert await bystander.is_responsive()
    # Invalid UTF-8 in a text frame is a protocol error: 1007, for that socket only.
    async with connect(server.ws_url("bad-utf8"), open_timeout=5) as ws:
        await ws.recv()
        await ws.send(b"\xff\xfe{}", text=True)
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(5):
                while True:
                    await ws.recv()
        assert ws.close_code == CloseCode.INVALID_DATA
    await wait_until(lambda: not server.state.hub.connections, 5)
    await wait_until(lambda: len(asyncio.all_tasks()) <= baseline_tasks, 5)


async def test_no_log_line_carries_a_token() -> None:
    """With every log on (debug, uvicorn's request lines included), tokens in `?token=`, in
    an `auth` frame and in a bearer header, valid or not, appear in no log line."""
    good, bad = token("ada"), "garbage.token.value"
    app = AppProcess(
        {"CHAT_AUTH_MODE": "jwt", "CHAT_JWT_SECRET": SECRET, "CHAT_LOG_LEVEL": "debug"}
    )
    await app.start()
    try:
        async with connect(f"ws://127.0.0.1:{app.port}/ws?token={good}") as ws:
            await ws.recv()
        for query in (f"?token={bad}", f"?name=x&token={bad}&y=1"):
            code, _ = await refused_with(f"ws://127.0.0.1:{app.port}/ws{query}")
            assert code == CloseCode.AUTH_FAILED
        code, _ = await refused_with(
            f"ws://127.0.0.1:{app.port}/ws", {"type": "auth", "token": bad}
        )
        assert code == CloseCode.AUTH_FAILED
        async with httpx.AsyncClient() as http:
            for credential in (good, bad):
                await http.get(
                    f"{app.http_url}/rooms/r/messages",
                    headers={"Authorization": f"Bearer {credential}"},
                )
        # The refused sockets' lines carry their (redacted) URLs: wait until they are in.
        await wait_until(lambda: app.output().count("[redacted]") >= 2)
        log = app.output()
        assert "[redacted]" in log  # the request lines were logged, without their tokens
        for secret in (good, bad, good.split(".")[-1]):
            assert secret not in log
    finally:
        await app.stop()


async def test_a_ban_reason_too_long_for_a_close_frame_still_closes_cleanly() -> None:
    """A ban reason of 200 characters (400 bytes of UTF-8) is cut to what a close frame holds
    (123 bytes, whole characters): the client sees 4003 and the reason's start, not 1006."""
    admin_token = "m" * 32
    async with run_server(make_settings(admin_token=admin_token)) as live:
        async with ChatClient.connect(live.ws_url("loud")) as loud:
            async with httpx.AsyncClient() as http:
                banned = await http.put(
                    f"{live.http_url}/admin/users/loud/ban",
                    json={"duration_s": 60, "reason": "é" * 200},
                    headers={"Authorization": f"Bearer {admin_token}"},
                )
            assert banned.status_code == 200
            assert await loud.closed_with() == CloseCode.FORBIDDEN
            assert loud.ws.close_reason == "é" * 61


async def test_an_invalid_utf8_frame_is_one_info_line_not_an_error() -> None:
    """Any client can send a text frame that is not UTF-8: it is closed with 1007, and the
    log gets one INFO line, not an ERROR with a traceback per frame (a log-flooding lever)."""
    app = AppProcess({})
    await app.start()
    try:
        for _ in range(3):
            sock, rest = await raw_upgrade(app.port, 65536, "garbler")
            reader = RawReader(sock)
            reader.buffer = rest
            try:
                loop = asyncio.get_running_loop()
                await loop.sock_sendall(sock, b"\x81\x82\x00\x00\x00\x00\xff\xfe")
                # The hello may come first, in the upgrade's packet or after it.
                first, payload = await asyncio.wait_for(reader.frame(), 5)
                while first == 0x81:
                    first, payload = await asyncio.wait_for(reader.frame(), 5)
                assert first == 0x88 and int.from_bytes(payload[:2]) == 1007
            finally:
                sock.close()

        def logged() -> list[dict[str, Any]]:
            output = app.output().splitlines()
            return [json.loads(line) for line in output if line.startswith("{")]

        await wait_until(lambda: sum("UTF-8" in line["msg"] for line in logged()) >= 3)
        lines = logged()
        utf8 = [line for line in lines if "UTF-8" in line["msg"]]
        assert len(utf8) == 3 and all(line["level"] == "info" for line in utf8)
        assert not any(line["level"] == "error" or "exc" in line for line in lines)
    finally:
        await app.stop()


async def test_hello_names_no_host_or_process_by_default(server: LiveServer) -> None:
    """`hello`'s node tells worker processes apart without telling clients the host name or
    the pid (CHAT_HELLO_NAMES_PROCESS is for debugging)."""
    async with ChatClient.connect(server.ws_url("curious")) as client:
        node = client.hello["node"]
        assert node and socket.gethostname() not in node and str(os.getpid()) not in node


def test_trusting_every_proxy_is_refused() -> None:
    """CHAT_TRUSTED_PROXIES='*' would make the client's own X-Forwarded-For entry its
    address (per-address limits evaded, logs forged): the server refuses to start with it."""
    with pytest.raises(SettingsError, match="TRUSTED_PROXIES"):
        load_settings(auth_mode="guest", trusted_proxies="*")
    with pytest.raises(SettingsError, match="TRUSTED_PROXIES"):
        load_settings(auth_mode="guest", trusted_proxies="10.0.0.0/8, *")
    assert load_settings(auth_mode="guest", trusted_proxies="10.0.0.0/8").trusted_proxies


async def test_a_forged_forwarded_for_does_not_evade_the_address_limit() -> None:
    """Behind nginx (a trusted proxy), a client (here from 127.0.0.2) that writes its own
    X-Forwarded-For entries is still counted by the address nginx saw: rotating forged
    entries does not buy more connections than CHAT_IP_CONNECTION_BURST."""
    settings = make_settings(ip_connections_per_s=0.01, ip_connection_burst=3)
    async with run_server(settings) as live:
        proxy = NginxServer(f"127.0.0.1:{live.port}")
        await proxy.start()
        try:
            codes = []
            for n in range(5):
                headers = {"X-Forwarded-For": f"203.0.113.{n}"}
                try:
                    async with connect(
                        proxy.ws_url(f"f{n}"),
                        additional_headers=headers,
                        open_timeout=5,
                        local_addr=("127.0.0.2", 0),
                    ) as ws:
                        # the first of the text's frames (several are split by "\n")
                        first = json.loads(str(await ws.recv()).split("\n", 1)[0])
                        codes.append(first["type"])
                        if first["type"] == "hello":
                            continue
                except ConnectionClosed as closed:
                    codes.append(closed.rcvd.code if closed.rcvd else 1006)
            assert codes[:3] == ["hello"] * 3 and codes[3:] == [4029, 4029], codes
        finally:
            await proxy.stop()


async def _silent_sockets(url: str, count: int) -> tuple[list[Any], list[int]]:
    """Open ``count`` sockets that never authenticate: those still open, and the close codes
    of those the server refused at once."""
    held, refused = [], []
    for _ in range(count):
        ws = await connect(url, open_timeout=5)
        try:
            await asyncio.wait_for(ws.recv(), 0.3)
        except TimeoutError:
            held.append(ws)  # the server waits for its token
            continue
        except ConnectionClosed as closed:
            refused.append(closed.rcvd.code if closed.rcvd else 1006)
        await ws.close()
    return held, refused


async def test_unauthenticated_sockets_cannot_fill_a_worker() -> None:
    """Sockets that never send their token hold at most CHAT_MAX_PENDING_AUTH_PER_ADDRESS
    slots per address (the rest are closed with 4029 at once), so a real user still gets in
    on a worker capped at 20 connections."""
    async with jwt_server(max_connections=20, max_pending_auth_per_address=5) as server:
        held, refused = await _silent_sockets(ws_url(server), 25)
        try:
            assert len(held) == 5 and refused == [4029] * 20
            async with ChatClient.connect(ws_url(server, f"?token={token('ada')}")) as ada:
                assert ada.hello["user"] == "ada"
        finally:
            for ws in held:
                await ws.close()


async def test_the_address_pays_for_a_socket_before_it_authenticates() -> None:
    """The per-address connection rate is charged at the upgrade: unauthenticated sockets
    count, so an address cannot open them without limit."""
    settings = {"ip_connections_per_s": 0.01, "ip_connection_burst": 3}
    async with jwt_server(**settings) as server:
        held, refused = await _silent_sockets(ws_url(server), 6)
        try:
            assert len(held) == 3 and refused == [4029] * 3
        finally:
            for ws in held:
                await ws.close()


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_a_user_cannot_fill_redis_with_new_rooms(broker: str) -> None:
    """Each join of a room without a history brings one into being (keys kept for
    CHAT_HISTORY_TTL_S): a user may do that CHAT_USER_NEW_ROOM_BURST times, then joins of
    new rooms are refused (rate_limited) while joins of existing rooms still work."""
    quotas = {"user_new_rooms_per_s": 0.01, "user_new_room_burst": 3}
    async with server_on(broker, **quotas) as live:
        async with ChatClient.connect(live.ws_url("other")) as other:
            await other.join("existing")  # other's first new room
            async with ChatClient.connect(live.ws_url("filler")) as filler:
                answers = []
                for n in range(5):
                    await filler.send({"type": "join", "room": f"new-{n}"})
                    frame = await filler.next_frame()
                    answers.append(frame["type"] if frame["type"] == "joined" else frame["code"])
                assert answers == ["joined"] * 3 + ["rate_limited"] * 2
                assert (await filler.join("existing"))["room"] == "existing"
