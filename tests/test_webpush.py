"""Web Push (app/notify/webpush.py) against a real push service (tests/push_service.py) that
verifies VAPID and decrypts every push as the browser would."""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pywebpush import WebPusher

from app.notify.webpush import (
    MAX_PAYLOAD,
    PushOutcome,
    Subscription,
    WebPushSender,
    generate_keys,
    subscription_refusal,
)
from tests.helpers import free_port
from tests.push_service import PushService, b64url, running_push_service, unb64url

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
SUBJECT = "mailto:ops@hubbub.example"
SERVICES = [
    "https://fcm.googleapis.com/",
    "https://updates.push.services.mozilla.com/wpush/",
    "https://web.push.apple.com/",
    "https://*.notify.windows.com/",
    "http://127.0.0.1:8999/push/",
]


def subscription(data: dict[str, Any]) -> Subscription:
    return Subscription(data["endpoint"], data["keys"]["p256dh"], data["keys"]["auth"])


def public_of(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


@pytest.fixture
async def service() -> AsyncIterator[PushService]:
    async with running_push_service() as running:
        yield running


@pytest.fixture
async def sender() -> AsyncIterator[WebPushSender]:
    private, _ = generate_keys()
    pusher = WebPushSender(private, SUBJECT, ttl_s=3600, timeout_s=5.0)
    await pusher.start()
    try:
        yield pusher
    finally:
        await pusher.close()


async def test_push_arrives_decrypted_with_the_exact_payload(
    service: PushService, sender: WebPushSender
) -> None:
    sub = subscription(service.subscribe(application_server_key=sender.public_key))
    payloads = [
        '{"type":"mention","room":"général","text":"@ana 👋"}'.encode(),
        bytes(range(256)) * 3,
        b"x" * MAX_PAYLOAD,  # the largest that fits the 4096 bytes a push service must take
    ]
    for payload in payloads:
        assert await sender.send(sub, payload) is PushOutcome.DELIVERED
    pushes = await service.received(sub.endpoint, count=len(payloads))
    assert [push.payload for push in pushes] == payloads
    assert not service.refused
    headers = pushes[0].headers
    assert headers["content-encoding"] == "aes128gcm"
    assert headers["ttl"] == "3600"
    assert headers["urgency"] == "high"
    assert headers["authorization"].startswith("vapid t=")
    claims = pushes[0].claims
    assert claims["aud"] == service.base_url
    assert claims["sub"] == SUBJECT
    assert time.time() < claims["exp"] <= time.time() + 24 * 3600


async def test_payload_size_is_checked_before_sending(
    service: PushService, sender: WebPushSender
) -> None:
    sub = subscription(service.subscribe())
    for payload in (b"", b"x" * (MAX_PAYLOAD + 1)):
        with pytest.raises(ValueError):
            await sender.send(sub, payload)
    assert not service.pushes and not service.refused


async def test_a_push_signed_by_another_key_than_the_pinned_one_is_refused(
    service: PushService, sender: WebPushSender
) -> None:
    pinned = WebPushSender(generate_keys()[0], SUBJECT, ttl_s=60, timeout_s=5.0)
    sub = subscription(service.subscribe(application_server_key=pinned.public_key))
    assert await sender.send(sub, b"hello") is PushOutcome.FAILED
    assert service.refused == {"vapid-key": 1}
    assert not service.pushes
    await pinned.start()
    try:
        assert await pinned.send(sub, b"hello") is PushOutcome.DELIVERED
    finally:
        await pinned.close()
    assert [push.payload for push in await service.received(sub.endpoint)] == [b"hello"]


def _forged(key: ec.EllipticCurvePrivateKey, service: PushService, case: str) -> str:
    """A VAPID header that breaks one rule (``case``), signed with ``key`` unless forged."""
    now = int(time.time())
    claims: dict[str, Any] = {"aud": service.base_url, "exp": now + 3600, "sub": SUBJECT}
    if case == "vapid-aud":
        claims["aud"] = "https://fcm.googleapis.com"
    elif case == "vapid-exp":
        claims["exp"] = now - 10
    elif case == "vapid-exp-far":
        claims["exp"] = now + 25 * 3600
    elif case == "vapid-sub":
        claims["sub"] = "ops@hubbub.example"
    token = jwt.encode(claims, key, algorithm="ES256")
    k = b64url(public_of(key))
    if case == "vapid-signature":
        k = b64url(public_of(ec.generate_private_key(ec.SECP256R1())))
    return f"vapid t={token}, k={k}"


@pytest.mark.parametrize(
    "case", ["ok", "vapid-aud", "vapid-exp", "vapid-exp-far", "vapid-sub", "vapid-signature"]
)
async def test_the_push_service_refuses_a_bad_vapid_jwt(service: PushService, case: str) -> None:
    """The stand-in checks each VAPID rule, so the tests above can trust a 201."""
    data = service.subscribe()
    key = ec.generate_private_key(ec.SECP256R1())
    body = WebPusher(data).encode(b"hello", "aes128gcm")["body"]
    headers = {
        "Authorization": _forged(key, service, case),
        "Content-Encoding": "aes128gcm",
        "TTL": "60",
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(data["endpoint"], data=body, headers=headers) as response:
            status = response.status
    if case == "ok":
        assert status == 201
        assert [push.payload for push in service.pushes] == [b"hello"]
    else:
        assert status == 403
        assert service.refused == {case.removesuffix("-far"): 1}
        assert not service.pushes


async def test_the_push_service_refuses_what_it_cannot_decrypt(
    service: PushService, sender: WebPushSender
) -> None:
    sub = subscription(service.subscribe())
    other = service.subscribe()  # right endpoint, another user agent's keys
    assert await sender.send(Subscription(sub.endpoint, **other["keys"]), b"hi") is (
        PushOutcome.FAILED
    )
    assert service.refused == {"decrypt": 1}


@pytest.mark.parametrize("status", [404, 410])
async def test_an_expired_or_unknown_subscription_is_gone(
    service: PushService, sender: WebPushSender, status: int
) -> None:
    sub = subscription(service.subscribe())
    assert await sender.send(sub, b"first") is PushOutcome.DELIVERED
    if status == 410:
        service.expire(sub.endpoint)
    else:
        del service.agents[sub.endpoint.rsplit("/", 1)[1]]
    assert await sender.send(sub, b"second") is PushOutcome.GONE
    assert service.refused == {"gone" if status == 410 else "unknown": 1}
    assert [push.payload for push in service.pushes] == [b"first"]


@pytest.mark.parametrize("status", [429, 500, 503, 400, 413])
async def test_other_statuses_fail_and_are_logged_without_the_endpoint_secret(
    service: PushService,
    sender: WebPushSender,
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sub = subscription(service.subscribe())
    service.fail_next.append(status)
    with caplog.at_level(logging.WARNING, logger="app.notify.webpush"):
        assert await sender.send(sub, b"hello") is PushOutcome.FAILED
    assert f"{service.base_url} answered {status}" in caplog.text
    assert "/push/" not in caplog.text
    assert await sender.send(sub, b"again") is PushOutcome.DELIVERED


async def test_redirects_are_not_followed(service: PushService, sender: WebPushSender) -> None:
    sub = subscription(service.subscribe())
    elsewhere = subscription(service.subscribe())
    service.redirect_next.append(elsewhere.endpoint)
    assert await sender.send(sub, b"hello") is PushOutcome.FAILED
    # A followed redirect would have been answered before send returned.
    assert not service.pushes and not service.refused


async def test_a_dead_port_fails_without_raising(
    service: PushService, sender: WebPushSender, caplog: pytest.LogCaptureFixture
) -> None:
    data = service.subscribe()
    dead = f"http://127.0.0.1:{free_port()}/push/secret-token"
    with caplog.at_level(logging.WARNING, logger="app.notify.webpush"):
        outcome = await sender.send(Subscription(dead, **data["keys"]), b"hello")
    assert outcome is PushOutcome.FAILED
    assert "push to http://127.0.0.1:" in caplog.text
    assert "secret-token" not in caplog.text


async def test_a_slow_push_service_times_out_as_failed(service: PushService) -> None:
    sender = WebPushSender(generate_keys()[0], SUBJECT, ttl_s=0, timeout_s=0.5)
    await sender.start()
    try:
        sub = subscription(service.subscribe())
        service.delay_s = 10.0
        started = time.monotonic()
        assert await sender.send(sub, b"hello") is PushOutcome.FAILED
        assert time.monotonic() - started < 3.0
        service.delay_s = 0.0
        assert await sender.send(sub, b"later") is PushOutcome.DELIVERED
        assert (await service.received(sub.endpoint))[0].headers["ttl"] == "0"
    finally:
        await sender.close()


async def test_send_before_start_is_a_programming_error() -> None:
    sender = WebPushSender(generate_keys()[0], SUBJECT, ttl_s=60, timeout_s=1.0)
    sub = subscription(PushService().subscribe())
    with pytest.raises(RuntimeError):
        await sender.send(sub, b"hello")


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://fcm.googleapis.com/fcm/send/abc:APA91b",
        "https://FCM.googleapis.com:443/wp/abc",
        "https://updates.push.services.mozilla.com/wpush/v2/gAAAAA",
        "https://web.push.apple.com/QGx",
        "https://wns2-par02p.notify.windows.com/w/?token=BQYAAA",
        "https://a.b.notify.windows.com/w/?token=x",
        "http://127.0.0.1:8999/push/tok",
        "https://fcm.googleapis.com/" + "a" * (2048 - 27),
    ],
)
def test_subscription_refusal_accepts_allowed_push_services(endpoint: str) -> None:
    assert subscription_refusal(endpoint, SERVICES) is None


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("http://fcm.googleapis.com/fcm/send/abc", "must use https"),
        ("https://127.0.0.1:8999/push/tok", "must use http"),
        ("https://user:pw@fcm.googleapis.com/fcm/send/abc", "userinfo"),
        ("https://fcm.googleapis.com@evil.example/x", "userinfo"),
        ("https://evil.example/fcm/send/abc", "not on an allowed"),
        ("https://fcm.googleapis.com.evil.example/x", "not on an allowed"),
        ("https://fcm.googleapis.com:8443/x", "not on an allowed"),
        ("https://notify.windows.com/w/", "not on an allowed"),
        ("https://evilnotify.windows.com/w/", "not on an allowed"),
        ("https://updates.push.services.mozilla.com/other/x", "not on an allowed"),
        ("http://127.0.0.1:9000/push/tok", "not on an allowed"),
        ("http://127.0.0.1:8999/admin", "not on an allowed"),
        ("http://127.0.0.1:8999/push/../admin", "dot segments"),
        ("https://fcm.googleapis.com/" + "a" * (2049 - 27), "too long"),
        ("https://fcm.googleapis.com/a\nb", "invalid characters"),
        ("https://fcm.googleapis.com/a b", "invalid characters"),
        ("ftp://fcm.googleapis.com/x", "not an http(s) URL"),
        ("fcm.googleapis.com/x", "not an http(s) URL"),
        ("https://fcm.googleapis.com:99999/x", "not a URL"),
    ],
)
def test_subscription_refusal_refuses_other_endpoints(endpoint: str, reason: str) -> None:
    refusal = subscription_refusal(endpoint, SERVICES)
    assert refusal is not None and reason in refusal


def test_subscription_refusal_with_no_services_refuses_everything() -> None:
    assert subscription_refusal("https://fcm.googleapis.com/x", []) is not None
    with pytest.raises(ValueError):
        subscription_refusal("https://fcm.googleapis.com/x", ["fcm.googleapis.com"])


def test_subscription_keys_are_checked() -> None:
    data = PushService().subscribe()
    keys = data["keys"]
    Subscription(data["endpoint"], keys["p256dh"], keys["auth"] + "==")  # padding is fine
    for p256dh, auth in [
        (keys["p256dh"][:-4], keys["auth"]),
        (b64url(b"\x05" + unb64url(keys["p256dh"])[1:]), keys["auth"]),  # not uncompressed
        (b64url(b"\x04" + b"\x01" * 64), keys["auth"]),  # not on the curve
        (keys["p256dh"], keys["auth"] + "AAAA"),
        (keys["p256dh"], "!!not base64!!"),
    ]:
        with pytest.raises(ValueError):
            Subscription(data["endpoint"], p256dh, auth)


def test_the_public_key_is_the_uncompressed_point_of_the_private_key() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    raw = b64url(key.private_numbers().private_value.to_bytes(32, "big"))
    public = unb64url(WebPushSender(raw, SUBJECT, ttl_s=60, timeout_s=1.0).public_key)
    assert len(public) == 65 and public[0] == 0x04
    assert public == public_of(key)
    private, generated_public = generate_keys()
    assert WebPushSender(private, SUBJECT, ttl_s=60, timeout_s=1.0).public_key == (generated_public)


async def test_pem_and_raw_private_keys_both_sign(service: PushService) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    raw = b64url(key.private_numbers().private_value.to_bytes(32, "big"))
    pems = [
        key.private_bytes(encoding, format, serialization.NoEncryption()).decode()
        for encoding, format in [
            (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8),
            (serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL),
        ]
    ]
    sub = subscription(service.subscribe(application_server_key=b64url(public_of(key))))
    for number, private in enumerate([raw, raw + "=", *pems]):
        sender = WebPushSender(private, SUBJECT, ttl_s=60, timeout_s=5.0)
        assert unb64url(sender.public_key) == public_of(key)
        await sender.start()
        try:
            assert await sender.send(sub, f"push {number}".encode()) is PushOutcome.DELIVERED
        finally:
            await sender.close()
    pushes = await service.received(sub.endpoint, count=4)
    assert [push.payload for push in pushes] == [b"push 0", b"push 1", b"push 2", b"push 3"]


@pytest.mark.parametrize(
    "private_key",
    [
        b64url(b"\x01" * 31),
        b64url(b"\xff" * 32),  # above the curve order
        b64url(b"\x00" * 32),
        "not a key!",
        ec.generate_private_key(ec.SECP384R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode(),
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    ],
)
def test_bad_private_keys_are_refused(private_key: str) -> None:
    with pytest.raises(ValueError):
        WebPushSender(private_key, SUBJECT, ttl_s=60, timeout_s=1.0)


@pytest.mark.parametrize(
    ("subject", "ttl_s", "timeout_s"),
    [("ops@hubbub.example", 60, 1.0), (SUBJECT, -1, 1.0), (SUBJECT, 60, 0.0)],
)
def test_bad_settings_are_refused(subject: str, ttl_s: int, timeout_s: float) -> None:
    with pytest.raises(ValueError):
        WebPushSender(generate_keys()[0], subject, ttl_s=ttl_s, timeout_s=timeout_s)


async def test_the_module_prints_a_usable_key_pair(service: PushService) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.notify.webpush",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(30):
        stdout, _ = await process.communicate()
    assert process.returncode == 0
    lines = stdout.decode().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("CHAT_VAPID_PRIVATE_KEY=")
    assert lines[1].startswith("# public: ")
    private = lines[0].removeprefix("CHAT_VAPID_PRIVATE_KEY=")
    public = lines[1].removeprefix("# public: ")
    assert len(base64.urlsafe_b64decode(private + "=")) == 32
    sender = WebPushSender(private, SUBJECT, ttl_s=60, timeout_s=5.0)
    assert sender.public_key == public
    sub = subscription(service.subscribe(application_server_key=public))
    await sender.start()
    try:
        assert await sender.send(sub, b"hello") is PushOutcome.DELIVERED
    finally:
        await sender.close()
    assert (await service.received(sub.endpoint))[0].payload == b"hello"
