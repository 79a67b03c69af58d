"""Who a connection is: a verified JWT (jwt mode), a guest (:mod:`app.access.guest`), or ``?name=``
(names mode).

Tokens are verified with PyJWT against exactly one key source from the settings — an HS256
secret, or an RS256/ES256 public key or JWKS file — and only the algorithms that key can
verify are accepted, so a token signed with another algorithm (``none``, or HS256 made with the
public key as secret) is refused. A token must carry ``sub`` (the user name) and ``exp``; the
optional rooms claim limits which rooms the user may join and send to.

A token verified once is remembered, per worker, until it expires (``CHAT_JWT_CACHE_SIZE``
of them, the oldest forgotten first): a client's next request or reconnection with it costs
a dictionary lookup and an expiry check instead of PyJWT's decoding, signature and claims
checks (about 50 µs for HS256, 100 for RS256, 155 for ES256: ``docs/benchmarks.md``). Only a
token that passed every check is remembered, and only its expiry can change its verdict
later: ``nbf``, ``iat`` and the lifetime limit hold more surely as time passes. A refused
token is checked in full each time.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from app.protocol import USER_PATTERN
from app.settings import Settings

_USER = re.compile(USER_PATTERN)
_ASYMMETRIC = ["RS256", "ES256"]


class AuthError(Exception):
    """The token was refused; the message says why (it goes into the close reason)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """A verified user: its name, the room patterns it may use (None: all), when its token
    expires (epoch seconds; None without a token), and whether it moderates."""

    user: str
    rooms: tuple[str, ...] | None = None
    expires_at: float | None = None
    # A guest key the server just made for this connection (handed back in `hello`).
    guest_key: str | None = None
    # The token's `roles` claim holds "moderator": may delete anyone's messages.
    moderator: bool = False

    def may_use(self, room: str) -> bool:
        return self.rooms is None or any(fnmatch.fnmatchcase(room, p) for p in self.rooms)


class Authenticator:
    """Verifies tokens for ``jwt`` mode. Build it once per worker (it reads the key files).
    ``clock`` is the time in epoch seconds (the expiry of a remembered token is checked
    against it; PyJWT reads the system clock)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock
        self._verified: dict[str, Identity] = {}  # token -> its identity, oldest first
        self._key: Any = None
        self._jwks: jwt.PyJWKSet | None = None
        if settings.jwt_secret is not None:
            self._key = settings.jwt_secret.get_secret_value()
            self._algorithms = ["HS256"]
        elif settings.jwt_public_key_file is not None:
            self._key = Path(settings.jwt_public_key_file).read_text()
            self._algorithms = _ASYMMETRIC
        elif settings.jwt_jwks_file is not None:
            self._jwks = jwt.PyJWKSet.from_json(Path(settings.jwt_jwks_file).read_text())
            self._algorithms = _ASYMMETRIC
        else:
            raise ValueError("jwt mode needs a secret, a public key file or a JWKS file")

    def verify(self, token: str) -> Identity:
        """The identity in ``token``; raises :class:`AuthError` if it is not valid now."""
        known = self._verified.get(token)
        if known is not None:
            assert known.expires_at is not None
            if known.expires_at + self._settings.jwt_leeway_s > self._clock():
                return known
            del self._verified[token]
            raise AuthError("token expired")
        identity = self._verify(token)
        capacity = self._settings.jwt_cache_size
        if capacity > 0:
            if len(self._verified) >= capacity:
                del self._verified[next(iter(self._verified))]
            self._verified[token] = identity
        return identity

    def _verify(self, token: str) -> Identity:
        """``verify`` without the remembered tokens: PyJWT's checks, then ours."""
        settings = self._settings
        try:
            key = self._key
            if self._jwks is not None:
                kid = jwt.get_unverified_header(token).get("kid")
                matching = [k for k in self._jwks.keys if k.key_id == kid]
                if not matching:
                    raise AuthError("unknown key id (kid)")
                key = matching[0].key
            claims = jwt.decode(
                token,
                key,
                algorithms=self._algorithms,
                audience=settings.jwt_audience,
                issuer=settings.jwt_issuer,
                leeway=settings.jwt_leeway_s,
                options={
                    "require": ["exp", "sub"],
                    "verify_aud": settings.jwt_audience is not None,
                },
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("token expired") from None
        except jwt.InvalidAlgorithmError:
            raise AuthError("token algorithm not allowed") from None
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise AuthError(f"invalid token: {exc}") from None
        user = claims["sub"]
        if not isinstance(user, str) or not _USER.fullmatch(user):
            raise AuthError("invalid token: sub is not a valid user name")
        issued = claims.get("iat")
        start = float(issued) if isinstance(issued, int | float) else time.time()
        if float(claims["exp"]) - start > settings.jwt_max_lifetime_s + settings.jwt_leeway_s:
            raise AuthError(
                f"token lives longer than {settings.jwt_max_lifetime_s:g} s "
                "(CHAT_JWT_MAX_LIFETIME_S): issue shorter-lived tokens and refresh them"
            )
        rooms = claims.get(settings.jwt_rooms_claim)
        if rooms is None and settings.jwt_require_rooms:
            raise AuthError(f"invalid token: no {settings.jwt_rooms_claim} claim")
        if rooms is not None and not (
            isinstance(rooms, list) and all(isinstance(r, str) for r in rooms)
        ):
            raise AuthError(f"invalid token: {settings.jwt_rooms_claim} must be a list of strings")
        roles = claims.get("roles", [])
        if not (isinstance(roles, list) and all(isinstance(r, str) for r in roles)):
            raise AuthError("invalid token: roles must be a list of strings")
        return Identity(
            user,
            None if rooms is None else tuple(rooms),
            float(claims["exp"]),
            moderator="moderator" in roles,
        )
