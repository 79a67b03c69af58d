"""Tokens verified once are remembered until they expire (``CHAT_JWT_CACHE_SIZE``): a
remembered token skips PyJWT's checks, is refused once expired, and the memory is bounded;
a refused token is never remembered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx2 as httpx
import jwt
import pytest

from app.access.auth import Authenticator, AuthError
from tests.helpers import make_settings
from tests.test_security import SECRET, jwt_server, token

pytestmark = pytest.mark.timeout(60)


class Clock:
    """The time an :class:`Authenticator` reads, moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens PyJWT decodes (its real ``decode``, counted)."""
    seen: list[str] = []
    real: Callable[..., Any] = jwt.decode

    def counted(token: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(token)
        return real(token, *args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counted)
    return seen


def authenticator(clock: Clock, **overrides: Any) -> Authenticator:
    settings = make_settings(auth_mode="jwt", jwt_secret=SECRET, **overrides)
    return Authenticator(settings, clock=clock)


def test_a_verified_token_is_checked_once_until_it_expires(decodes: list[str]) -> None:
    clock = Clock()
    auth = authenticator(clock, jwt_leeway_s=5)
    ada = token("ada", ttl_s=60, rooms=["team-*"])
    first = auth.verify(ada)
    assert first.user == "ada" and first.rooms == ("team-*",)
    assert auth.verify(ada) == first
    assert decodes == [ada]
    clock.now = first.expires_at + 4.9  # type: ignore[operator]  # within the leeway
    assert auth.verify(ada) == first
    clock.now = first.expires_at + 5  # type: ignore[operator]
    with pytest.raises(AuthError, match="token expired"):
        auth.verify(ada)
    assert decodes == [ada]
    # Forgotten once refused: PyJWT (on the real clock) decides again.
    clock.now = time.time()
    assert auth.verify(ada) == first
    assert decodes == [ada, ada]


def test_refused_tokens_are_not_remembered(decodes: list[str]) -> None:
    auth = authenticator(Clock())
    forged = token("ada", key="another-secret-that-is-long-enough-for-hs256")
    for _ in range(2):
        with pytest.raises(AuthError, match="invalid token"):
            auth.verify(forged)
    assert decodes == [forged, forged]


def test_the_oldest_token_is_forgotten_past_the_cache_size(decodes: list[str]) -> None:
    auth = authenticator(Clock(), jwt_cache_size=2)
    ada, bob, cy = token("ada"), token("bob"), token("cy")
    for t in (ada, bob, cy, bob, cy):
        auth.verify(t)
    assert decodes == [ada, bob, cy]
    assert auth.verify(ada).user == "ada"  # forgotten: checked again (and bob now is)
    assert decodes == [ada, bob, cy, ada]
    assert auth.verify(bob).user == "bob"
    assert decodes == [ada, bob, cy, ada, bob]


def test_a_cache_size_of_zero_checks_every_time(decodes: list[str]) -> None:
    auth = authenticator(Clock(), jwt_cache_size=0)
    ada = token("ada")
    auth.verify(ada)
    auth.verify(ada)
    assert decodes == [ada, ada]


async def test_a_remembered_bearer_token_is_refused_once_it_expires() -> None:
    """On a live server, the same bearer token on repeated requests: let in while valid (the
    room does not exist: 404), 401 once it expires (no leeway), though the worker remembered
    it."""
    async with jwt_server(jwt_leeway_s=0) as server:
        ada = token("ada", ttl_s=2)
        expires_at = jwt.decode(ada, options={"verify_signature": False})["exp"]
        bearer = {"authorization": f"Bearer {ada}"}
        url = f"{server.http_url}/rooms/nowhere/messages"
        async with httpx.AsyncClient(timeout=5) as http:
            for _ in range(2):
                assert (await http.get(url, headers=bearer)).status_code == 404
            async with asyncio.timeout(10):
                while (reply := await http.get(url, headers=bearer)).status_code == 404:
                    assert time.time() < expires_at + 1
                    await asyncio.sleep(0.05)
            assert reply.status_code == 401 and "token expired" in reply.text
            assert time.time() >= expires_at
