"""Web Push: encrypted pushes (RFC 8030, RFC 8291 aes128gcm) signed with VAPID (RFC 8292).

Contract:
- :class:`Subscription` is a browser's ``PushSubscription`` JSON (endpoint, base64url keys);
  constructing one checks the keys' shape, not the endpoint: :func:`subscription_refusal`
  decides whether an endpoint may be used (an SSRF guard: only configured push services).
- :class:`WebPushSender` holds the VAPID key and one shared HTTP session. ``send`` encrypts
  the payload for the subscription, signs a VAPID JWT for the endpoint's origin and POSTs it;
  it answers a :class:`PushOutcome` and never raises for what the network or the push
  service does. Logs name the endpoint's origin only: its path is a bearer secret.
- ``python -m app.notify.webpush`` prints a new VAPID key pair as environment lines.
"""

from __future__ import annotations

import base64
import binascii
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import aiohttp
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02, VapidException
from pywebpush import WebPusher

from app.settings import ENV_PREFIX, Settings, SettingsError

logger = logging.getLogger(__name__)

MAX_ENDPOINT_LENGTH = 2048
# The largest plaintext whose aes128gcm body (86-byte header, 1-byte delimiter, 16-byte tag)
# fits the 4096 bytes every push service must accept (RFC 8291 section 4).
MAX_PAYLOAD = 4096 - 86 - 1 - 16
# VAPID JWTs are signed for this long (RFC 8292 allows at most 24 h) and reused, per origin,
# until less than _JWT_RENEW_S of that is left.
_JWT_LIFETIME_S = 12 * 3600
_JWT_RENEW_S = 3600
_JWT_CACHE_MAX = 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


class PushOutcome(enum.Enum):
    """What became of one push."""

    DELIVERED = "delivered"  # the push service accepted it (2xx)
    GONE = "gone"  # 404 or 410: the subscription expired; the caller removes it
    FAILED = "failed"  # anything else (network error, timeout, 429, 5xx, other 4xx)


def _b64url_decode(text: str) -> bytes:
    """Decode base64url (or base64), padded or not; ValueError for any other character."""
    stripped = text.strip().rstrip("=").replace("+", "-").replace("/", "_")
    try:
        padded = stripped + "=" * (-len(stripped) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def _b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class Subscription:
    """A browser's PushSubscription: ``endpoint`` and its ``keys.p256dh`` / ``keys.auth``.

    ``p256dh`` is the user agent's P-256 public key (65 bytes uncompressed) and ``auth`` its
    16-byte authentication secret, both base64url (padding optional). Raises ValueError if
    either is malformed; the endpoint is checked by :func:`subscription_refusal`.
    """

    endpoint: str
    p256dh: str
    auth: str

    def __post_init__(self) -> None:
        key = _b64url_decode(self.p256dh)
        if len(key) != 65 or key[0] != 0x04:
            raise ValueError("p256dh is not an uncompressed P-256 public key")
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key)  # ValueError if off
        if len(_b64url_decode(self.auth)) != 16:
            raise ValueError("auth is not a 16-byte secret")


class _Prefix(NamedTuple):
    scheme: str
    host: str  # lower case; "*.example.com" matches any subdomain of example.com
    port: int
    path: str


def _parse_prefix(prefix: str) -> _Prefix:
    """Parse an allowed push service prefix; ValueError if it is not an http(s) URL prefix."""
    parts = urlsplit(prefix)
    host = (parts.hostname or "").lower()
    if parts.scheme not in _DEFAULT_PORTS or not host or parts.username is not None:
        raise ValueError(f"push service prefix {prefix!r} is not an http(s) URL")
    if "*" in host.removeprefix("*."):
        raise ValueError(f"push service prefix {prefix!r}: only a leading '*.' is allowed")
    port = parts.port if parts.port is not None else _DEFAULT_PORTS[parts.scheme]
    return _Prefix(parts.scheme, host, port, parts.path or "/")


def _host_matches(host: str, pattern: str) -> bool:
    if pattern.startswith("*."):
        suffix = pattern[1:]  # ".example.com"
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def subscription_refusal(endpoint: str, services: Sequence[str]) -> str | None:
    """None if ``endpoint`` may be pushed to, else a short reason (an SSRF guard).

    The endpoint must be at most :data:`MAX_ENDPOINT_LENGTH` characters of printable ASCII,
    an absolute URL without userinfo or dot segments, whose host, port and path fall under one
    of ``services``: URL prefixes such as ``https://fcm.googleapis.com/``, whose host may
    start with one ``*.`` (any subdomain, not the domain itself). Its scheme must be the
    prefix's: https, unless the prefix itself is http. Raises ValueError for a malformed
    prefix in ``services``.
    """
    if len(endpoint) > MAX_ENDPOINT_LENGTH:
        return "endpoint too long"
    if not endpoint.isascii() or not endpoint.isprintable() or " " in endpoint:
        return "endpoint has invalid characters"
    try:
        parts = urlsplit(endpoint)
        port = parts.port  # None when implicit: the default of the prefix's scheme
    except ValueError:
        return "endpoint is not a URL"
    host = (parts.hostname or "").lower()
    if parts.scheme not in _DEFAULT_PORTS or not host:
        return "endpoint is not an http(s) URL"
    if "@" in parts.netloc:
        return "endpoint has userinfo"
    path = parts.path or "/"
    if any(segment in (".", "..") for segment in path.split("/")):
        return "endpoint has dot segments"
    schemes = {
        prefix.scheme
        for prefix in map(_parse_prefix, services)
        if _host_matches(host, prefix.host)
        and (port or _DEFAULT_PORTS[prefix.scheme]) == prefix.port
        and path.startswith(prefix.path)
    }
    if not schemes:
        return "endpoint is not on an allowed push service"
    if parts.scheme not in schemes:
        return f"endpoint must use {' or '.join(sorted(schemes))}"
    return None


def _load_private_key(private_key: str) -> ec.EllipticCurvePrivateKey:
    """A P-256 private key from PEM or a base64url raw 32-byte scalar; ValueError otherwise."""
    if "-----BEGIN" in private_key:
        try:
            key = serialization.load_pem_private_key(private_key.strip().encode(), None)
        except (ValueError, TypeError) as exc:
            raise ValueError("the VAPID private key is not a readable PEM key") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(
            key.curve, ec.SECP256R1
        ):
            raise ValueError("the VAPID private key is not a P-256 (prime256v1) key")
        return key
    raw = _b64url_decode(private_key)
    scalar = int.from_bytes(raw, "big")
    if len(raw) != 32 or not 0 < scalar < _P256_ORDER:
        raise ValueError("the VAPID private key is not a base64url 32-byte P-256 scalar")
    return ec.derive_private_key(scalar, ec.SECP256R1())


def generate_keys() -> tuple[str, str]:
    """A new VAPID key pair: (private base64url raw scalar, public base64url uncompressed)."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_numbers().private_value.to_bytes(32, "big")
    public = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return _b64url_encode(private), _b64url_encode(public)


def _origin(endpoint: str) -> str:
    """``scheme://host[:port]`` of an endpoint: the JWT audience, and all that logs show."""
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class WebPushSender:
    """Sends encrypted Web Pushes with one VAPID identity and one shared aiohttp session.

    ``private_key`` is the VAPID key: a base64url raw 32-byte P-256 scalar (what ``vapid
    --gen`` and the web-push tools print) or a PEM (PKCS#8 or SEC 1). ``subject`` is the
    JWT ``sub``, a ``mailto:`` or ``https:`` URL the push service can reach the operator at.
    Each push asks the service to keep it ``ttl_s`` seconds for an offline user agent, with
    ``Urgency: high``, and gives up after ``timeout_s`` seconds. Raises ValueError for a
    bad key, subject, TTL or timeout. Call :meth:`start` before sending, :meth:`close` after.
    """

    generate_keys = staticmethod(generate_keys)

    def __init__(self, private_key: str, subject: str, ttl_s: int, timeout_s: float) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s must be >= 0")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self._vapid = Vapid02(private_key=_load_private_key(private_key))
        self._subject = subject
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._jwts: dict[str, tuple[str, int]] = {}  # origin -> (Authorization, exp)
        self._session: aiohttp.ClientSession | None = None
        try:  # py_vapid's own check of the subject, now rather than at every send
            self._authorization("https://push.example")
        except VapidException as exc:
            raise ValueError("subject must be a mailto: address or an https: URL") from exc
        self._jwts.clear()

    @property
    def public_key(self) -> str:
        """The application server key for ``pushManager.subscribe``: base64url, 65 bytes."""
        raw: bytes = self._vapid.public_key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return _b64url_encode(raw)

    async def start(self) -> None:
        """Open the shared HTTP session (idempotent)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s)
            )

    async def close(self) -> None:
        """Close the shared HTTP session (idempotent)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _authorization(self, origin: str) -> str:
        """``vapid t=<JWT>, k=<public key>`` for ``origin``, signed anew when near expiry."""
        now = int(time.time())
        cached = self._jwts.get(origin)
        if cached is not None and cached[1] - now > _JWT_RENEW_S:
            return cached[0]
        exp = now + _JWT_LIFETIME_S
        headers = self._vapid.sign({"aud": origin, "exp": exp, "sub": self._subject})
        authorization = str(headers["Authorization"]).replace(",k=", ", k=")
        if len(self._jwts) >= _JWT_CACHE_MAX:
            self._jwts.clear()
        self._jwts[origin] = (authorization, exp)
        return authorization

    async def send(self, subscription: Subscription, payload: bytes) -> PushOutcome:
        """Encrypt ``payload`` for ``subscription`` and POST it to its push service.

        DELIVERED on 2xx, GONE on 404 or 410 (remove the subscription), FAILED otherwise:
        another status, a network error or the timeout, which are logged (the endpoint's
        origin only), never raised. Redirects are not followed. Raises ValueError if the
        payload is empty or longer than :data:`MAX_PAYLOAD`, RuntimeError before
        :meth:`start`. The endpoint should have passed :func:`subscription_refusal`.
        """
        if not 0 < len(payload) <= MAX_PAYLOAD:
            raise ValueError(f"a push payload is 1 to {MAX_PAYLOAD} bytes")
        if self._session is None:
            raise RuntimeError("WebPushSender.send before start()")
        origin = _origin(subscription.endpoint)
        pusher = WebPusher(
            {
                "endpoint": subscription.endpoint,
                "keys": {"p256dh": subscription.p256dh, "auth": subscription.auth},
            }
        )
        body: bytes = pusher.encode(payload, "aes128gcm")["body"]
        headers = {
            "Authorization": self._authorization(origin),
            "Content-Encoding": "aes128gcm",
            "Content-Type": "application/octet-stream",
            "TTL": str(self._ttl_s),
            "Urgency": "high",
        }
        try:
            async with self._session.post(
                subscription.endpoint, data=body, headers=headers, allow_redirects=False
            ) as response:
                status = response.status
                if response.content_length is not None and response.content_length <= 65536:
                    await response.read()  # so that the connection can be reused
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            logger.warning("webpush: push to %s failed: %s", origin, type(exc).__name__)
            return PushOutcome.FAILED
        if 200 <= status < 300:
            return PushOutcome.DELIVERED
        if status in (404, 410):
            logger.info("webpush: %s answered %d: subscription gone", origin, status)
            return PushOutcome.GONE
        logger.warning("webpush: %s answered %d", origin, status)
        return PushOutcome.FAILED


def push_sender(settings: Settings) -> WebPushSender | None:
    """The sender ``CHAT_VAPID_PRIVATE_KEY`` asks for (None: unset, no Web Push). Raises
    :class:`~app.settings.SettingsError` for a key or subject that cannot sign."""
    if settings.vapid_private_key is None:
        return None
    try:
        return WebPushSender(
            settings.vapid_private_key.get_secret_value(),
            settings.vapid_subject,
            settings.push_ttl_s,
            settings.push_timeout_s,
        )
    except ValueError as exc:
        raise SettingsError(
            f"{ENV_PREFIX}VAPID_PRIVATE_KEY / {ENV_PREFIX}VAPID_SUBJECT: {exc}"
        ) from None


if __name__ == "__main__":
    _private, _public = generate_keys()
    print(f"CHAT_VAPID_PRIVATE_KEY={_private}")
    print(f"# public: {_public}")
