"""A real Web Push service for tests, standing in for FCM or Mozilla's autopush, and the user
agents subscribed to it.

It runs under uvicorn on 127.0.0.1 and plays both parts of RFC 8030: :meth:`PushService.
subscribe` is a browser's ``pushManager.subscribe`` (a P-256 key pair and an auth secret per
subscription, the PushSubscription JSON back), and ``POST /push/{token}`` is the push
service, which checks what a real one checks and then decrypts the message as the user agent
would:

- ``Authorization: vapid t=<JWT>, k=<key>`` (RFC 8292): an ES256 JWT verified against ``k``
  (and against the subscription's application server key, when it was subscribed with one),
  ``aud`` the endpoint's origin, ``exp`` in the future and at most 24 h ahead, ``sub`` a
  ``mailto:`` or ``https:`` URL. Refused with 403.
- ``Content-Encoding: aes128gcm`` and a ``TTL`` header (RFC 8030 section 5.2), a body of at
  most 4096 bytes that decrypts (RFC 8291) with the subscription's keys. Refused with 400
  (413 for a larger body).
- An unknown token answers 404; one :meth:`PushService.expire` made answers 410.

Accepted pushes answer 201 and are recorded (:attr:`PushService.pushes`); each refusal counts
under its reason (:attr:`PushService.refused`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import http_ece
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.types import Receive, Scope, Send

from tests.helpers import free_port, serving

MAX_BODY = 4096  # what RFC 8291 says every push service accepts
MAX_EXP_AHEAD_S = 24 * 3600  # RFC 8292 section 2


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class UserAgent:
    """One subscription's user agent side: its keys, and the key it was restricted to."""

    private_key: ec.EllipticCurvePrivateKey
    auth: bytes
    application_server_key: bytes | None

    @property
    def p256dh(self) -> str:
        return b64url(
            self.private_key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
            )
        )


@dataclass
class Push:
    """One accepted push: decrypted as the user agent would, with what came with it."""

    token: str
    payload: bytes
    headers: dict[str, str]  # lower-case names
    claims: dict[str, Any]  # the VAPID JWT's


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class PushService:
    port: int = field(default_factory=free_port)
    agents: dict[str, UserAgent] = field(default_factory=dict)  # token -> its user agent
    expired: set[str] = field(default_factory=set)
    pushes: list[Push] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)  # reason -> requests refused
    fail_next: list[int] = field(default_factory=list)  # statuses for the next requests
    redirect_next: list[str] = field(default_factory=list)  # 307 to these, for the next ones
    delay_s: float = 0.0  # answer this late (the sender's timeout)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def subscribe(self, application_server_key: str | None = None) -> dict[str, Any]:
        """A new subscription's PushSubscription JSON, as ``pushManager.subscribe`` returns it.

        With ``application_server_key`` (base64url), pushes must be signed by that key.
        """
        token = secrets.token_urlsafe(24)
        self.agents[token] = UserAgent(
            private_key=ec.generate_private_key(ec.SECP256R1()),
            auth=os.urandom(16),
            application_server_key=(
                unb64url(application_server_key) if application_server_key else None
            ),
        )
        agent = self.agents[token]
        return {
            "endpoint": f"{self.base_url}/push/{token}",
            "keys": {"p256dh": agent.p256dh, "auth": b64url(agent.auth)},
        }

    def expire(self, token_or_endpoint: str) -> None:
        """Later pushes to this subscription answer 410 Gone."""
        self.expired.add(token_or_endpoint.rstrip("/").rsplit("/", 1)[-1])

    def to(self, token_or_endpoint: str) -> list[Push]:
        token = token_or_endpoint.rstrip("/").rsplit("/", 1)[-1]
        return [push for push in self.pushes if push.token == token]

    async def wait_for(self, condition: Callable[[], object], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.02)

    async def received(self, endpoint: str, count: int = 1, timeout: float = 10.0) -> list[Push]:
        """Wait until ``count`` pushes to ``endpoint`` arrived; return them all."""
        await self.wait_for(lambda: len(self.to(endpoint)) >= count, timeout)
        return self.to(endpoint)

    def _verify_vapid(self, agent: UserAgent, authorization: str) -> dict[str, Any]:
        scheme, _, rest = authorization.partition(" ")
        if scheme.lower() != "vapid":
            raise Refused(403, "vapid-missing")
        params = dict(part.strip().partition("=")[::2] for part in rest.split(",") if part.strip())
        if not params.get("t") or not params.get("k"):
            raise Refused(403, "vapid-missing")
        try:
            raw_key = unb64url(params["k"])
            public_key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw_key)
        except ValueError:
            raise Refused(403, "vapid-key-invalid") from None
        if agent.application_server_key is not None and raw_key != agent.application_server_key:
            raise Refused(403, "vapid-key")
        try:
            claims: dict[str, Any] = jwt.decode(
                params["t"],
                public_key,
                algorithms=["ES256"],
                audience=self.base_url,
                options={"require": ["aud", "exp", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise Refused(403, "vapid-exp") from None
        except jwt.InvalidAudienceError:
            raise Refused(403, "vapid-aud") from None
        except jwt.InvalidSignatureError:
            raise Refused(403, "vapid-signature") from None
        except jwt.InvalidTokenError:
            raise Refused(403, "vapid-token") from None
        if claims["exp"] > time.time() + MAX_EXP_AHEAD_S:
            raise Refused(403, "vapid-exp")
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub.startswith(("mailto:", "https:")):
            raise Refused(403, "vapid-sub")
        return claims

    def _accept(self, path: str, headers: dict[str, str], body: bytes) -> Push:
        prefix, _, token = path.rpartition("/")
        agent = self.agents.get(token)
        if prefix != "/push" or agent is None:
            raise Refused(404, "unknown")
        if token in self.expired:
            raise Refused(410, "gone")
        claims = self._verify_vapid(agent, headers.get("authorization", ""))
        if headers.get("content-encoding") != "aes128gcm":
            raise Refused(400, "content-encoding")
        if not headers.get("ttl", "").isdigit():
            raise Refused(400, "ttl")
        if len(body) > MAX_BODY:
            raise Refused(413, "too-large")
        try:
            payload: bytes = http_ece.decrypt(
                body, private_key=agent.private_key, auth_secret=agent.auth, version="aes128gcm"
            )
        except Exception:
            raise Refused(400, "decrypt") from None
        return Push(token, payload, headers, claims)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.delay_s:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.delay_s):
                    await self._closing.wait()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        response_headers: list[tuple[bytes, bytes]] = []
        if self.fail_next:
            status = self.fail_next.pop(0)
        elif self.redirect_next:
            status = 307
            response_headers.append((b"location", self.redirect_next.pop(0).encode()))
        elif scope["method"] != "POST":
            status = 405
        else:
            try:
                push = self._accept(scope["path"], headers, body)
            except Refused as refusal:
                self.refused[refusal.reason] += 1
                status = refusal.status
            else:
                self.pushes.append(push)
                status = 201
                location = f"/message/{len(self.pushes)}".encode()
                response_headers.append((b"location", location))
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def running_push_service() -> AsyncIterator[PushService]:
    service = PushService()
    async with serving(
        service, service.port, log_level="warning", lifespan="off", timeout_graceful_shutdown=5
    ):
        try:
            yield service
        finally:
            service._closing.set()  # cut a delayed answer short
