"""OpenTelemetry traces of a message's path (app/ops/tracing.py), read back from a real Jaeger
(the tests' OTLP collector and trace store): publish, fan-out on each server, archiving and the
webhook in one trace that continues the sender's W3C traceparent; sampling; tracing off adds
nothing; exemplars link the publish latency histogram to traces, under gunicorn too."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import pytest
import pytest_asyncio

from app.ops.tracing import in_frame, parse
from app.protocol import message_frame, message_frame_parts
from tests.helpers import ChatClient, make_settings, run_server
from tests.processes import AppProcess, JaegerServer, RedisServer
from tests.test_durable import connected, redis_and_postgres
from tests.webhook_receiver import running_receiver

pytestmark = pytest.mark.timeout(120)

SERVICE = "s" * 40
HOOK_SECRET = "h" * 40


@pytest_asyncio.fixture
async def jaeger() -> AsyncIterator[JaegerServer]:
    server = JaegerServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _ids() -> tuple[str, str]:
    """A new trace id and span id, as a sender's tracer makes them."""
    return secrets.token_hex(16), secrets.token_hex(8)


def _traced_settings(jaeger: JaegerServer, **overrides: Any) -> Any:
    return make_settings(
        tracing_endpoint=jaeger.otlp_url, tracing_export_interval_s=0.1, **overrides
    )


def _ops(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["operationName"] == name]


def _parents(span: dict[str, Any]) -> list[str]:
    return [ref["spanID"] for ref in span["references"] if ref["refType"] == "CHILD_OF"]


def _tag(span: dict[str, Any], key: str) -> Any:
    return next(tag["value"] for tag in span["tags"] if tag["key"] == key)


async def _first(client: ChatClient, kind: str) -> dict[str, Any]:
    """The next frame of type ``kind`` (others are skipped)."""
    while (frame := await client.next_frame())["type"] != kind:
        pass
    return frame


async def _message(client: ChatClient, text: str) -> dict[str, Any]:
    while (frame := await client.next_frame(skip=("ping", "presence", "member")))["type"] != (
        "message"
    ) or frame["text"] != text:
        pass
    return frame


async def test_a_message_is_one_trace_from_publish_through_redis_to_fanout_archive_and_webhook(
    jaeger: JaegerServer,
) -> None:
    """Two servers on one Redis with a store and webhooks, sampling only what the sender
    asks for: its traceparent's trace gets the publish span (its child), a fan-out span on each
    server, the archive span and the webhook span, whose context is the webhook's header; the
    recipients see the context in the frame. Not-sampled and malformed traceparents trace
    nothing and lose nothing; the backend API's header does the same as the frame's field."""
    async with running_receiver(HOOK_SECRET) as receiver, redis_and_postgres() as (redis, _, url):
        settings = _traced_settings(
            jaeger, tracing_sample_ratio=0.0, redis_url=redis.url, database_url=url,
            webhook_url=receiver.url, webhook_secret=HOOK_SECRET, service_token=SERVICE,
            webhook_events="message.created", archive_interval_s=0.05,
        )  # fmt: skip
        async with (
            run_server(settings) as one,
            run_server(settings) as two,
            connected(one.ws_url("ada")) as ada,
            connected(two.ws_url("bob")) as bob,
        ):
            await ada.join("ops")
            await bob.join("ops")
            trace_id, parent = _ids()
            await ada.send({"type": "send", "room": "ops", "text": "deploy", "cid": "c1",
                            "traceparent": f"00-{trace_id}-{parent}-01"})  # fmt: skip
            ack = await _first(ada, "ack")
            got = await _message(bob, "deploy")
            version, seen_trace, publish_id, flags = got["traceparent"].split("-")
            assert (version, seen_trace, flags) == ("00", trace_id, "01")
            assert got["id"] == ack["id"]

            await receiver.wait_for(lambda: receiver.of_type("message.created"))
            (hook,) = receiver.of_type("message.created")
            assert hook["data"]["message"]["traceparent"] == got["traceparent"]
            header = receiver.headers[receiver.events.index(hook)]["traceparent"]
            assert header.startswith(f"00-{trace_id}-") and header.endswith("-01")

            def complete(spans: list[dict[str, Any]]) -> bool:
                return (
                    len(_ops(spans, "publish")) == 1 and len(_ops(spans, "fanout")) == 2
                    and len(_ops(spans, "archive")) == 1 and len(_ops(spans, "webhook")) == 1
                )  # fmt: skip

            spans = await jaeger.wait_for_spans(trace_id, complete)
            (publish,) = _ops(spans, "publish")
            assert publish["spanID"] == publish_id
            assert _parents(publish) == [parent]  # the sender's span
            assert _tag(publish, "span.kind") == "producer"
            assert _tag(publish, "messaging.destination.name") == "ops"
            assert _tag(publish, "messaging.message.id") == str(ack["id"])
            assert _tag(publish, "hubbub.via") == "socket"
            assert publish["process"]["serviceName"] == "hubbub"
            for stage in ("fanout", "archive", "webhook"):
                for span in _ops(spans, stage):
                    assert _parents(span) == [publish_id], stage
            # One span per server, not per recipient: each queued it on its one member.
            assert [_tag(s, "hubbub.recipients") for s in _ops(spans, "fanout")] == [1, 1]
            (webhook,) = _ops(spans, "webhook")
            assert header == f"00-{trace_id}-{webhook['spanID']}-01"
            assert _tag(webhook, "http.response.status_code") == 204

            # A traceparent that says "not sampled": delivered as usual, traced nowhere.
            quiet, quiet_parent = _ids()
            await ada.send({"type": "send", "room": "ops", "text": "quiet",
                            "traceparent": f"00-{quiet}-{quiet_parent}-00"})  # fmt: skip
            assert "traceparent" not in await _message(bob, "quiet")
            # A malformed one: a clear error, the connection goes on.
            await ada.send({"type": "send", "room": "ops", "text": "bad", "cid": "c2",
                            "traceparent": "00-not-a-trace"})  # fmt: skip
            error = await _first(ada, "error")
            assert (error["code"], error["cid"]) == ("bad_frame", "c2")
            assert "traceparent" in error["message"]

            # The backend API: its traceparent header is followed the same way; an invalid
            # one is ignored (W3C), and the message is published untraced.
            api_trace, api_parent = _ids()
            async with httpx.AsyncClient(
                base_url=f"{two.http_url}/api/v1", headers={"Authorization": f"Bearer {SERVICE}"}
            ) as api:
                published = await api.post(
                    "/rooms/ops/messages", json={"text": "from the backend"},
                    headers={"traceparent": f"00-{api_trace}-{api_parent}-01"},
                )  # fmt: skip
                assert published.status_code == 201, published.text
                from_api = await _message(ada, "from the backend")
                assert from_api["traceparent"].startswith(f"00-{api_trace}-")
                for garbage in ("garbage", f"00-{api_trace}-{api_parent}-01" * 20):
                    ignored = await api.post("/rooms/ops/messages", json={"text": "untraced"},
                                             headers={"traceparent": garbage})  # fmt: skip
                    assert ignored.status_code == 201, ignored.text
                    assert "traceparent" not in await _message(ada, "untraced")
            api_spans = await jaeger.wait_for_spans(
                api_trace, lambda s: len(_ops(s, "publish")) == 1 and len(_ops(s, "fanout")) == 2
            )
            (api_publish,) = _ops(api_spans, "publish")
            assert _parents(api_publish) == [api_parent]
            assert _tag(api_publish, "hubbub.via") == "api"
            # By now the not-sampled message's spans would have been exported with these.
            assert await jaeger.trace(quiet) == []


async def test_the_sample_ratio_traces_messages_that_come_without_a_traceparent(
    jaeger: JaegerServer,
) -> None:
    """Ratio 1: every message is a trace of its own (a root publish span); a direct
    message too, delivered to both of its users."""
    settings = _traced_settings(jaeger, tracing_sample_ratio=1.0)
    async with (
        run_server(settings) as live,
        ChatClient.connect(live.ws_url("ada")) as ada,
        ChatClient.connect(live.ws_url("bob")) as bob,
    ):
        await ada.join("lobby")
        await ada.say("lobby", "hello")
        frame = await _message(ada, "hello")
        context = parse(frame["traceparent"])
        assert context is not None and context.trace_flags.sampled
        trace_id = f"{context.trace_id:032x}"
        spans = await jaeger.wait_for_spans(
            trace_id, lambda s: len(_ops(s, "publish")) == 1 and len(_ops(s, "fanout")) == 1
        )
        (publish,) = _ops(spans, "publish")
        assert _parents(publish) == []  # a root: nobody asked
        await ada.say_to("bob", "psst")
        direct = await _message(bob, "psst")
        direct_trace = direct["traceparent"].split("-")[1]
        spans = await jaeger.wait_for_spans(direct_trace, lambda s: len(_ops(s, "fanout")) == 2)
        assert _tag(_ops(spans, "publish")[0], "messaging.destination.name") == "@ada:bob"


async def test_tracing_off_puts_nothing_in_frames() -> None:
    """Without CHAT_TRACING_ENDPOINT a sender's traceparent is accepted and goes nowhere."""
    async with (
        run_server(make_settings()) as live,
        ChatClient.connect(live.ws_url("ada")) as ada,
    ):
        assert live.state.tracing is None and live.state.hub.tracing is None
        await ada.join("lobby")
        trace_id, parent = _ids()
        await ada.say("lobby", "plain", traceparent=f"00-{trace_id}-{parent}-01")
        assert "traceparent" not in await _message(ada, "plain")


def test_a_frame_carries_its_context_and_text_cannot_forge_one() -> None:
    """The context is read from where message_frame_parts puts it; a text that spells the
    field (JSON escapes its quotes) is not a context, nor are malformed or all-zero ids."""
    trace_id, span_id = _ids()
    traceparent = f"00-{trace_id}-{span_id}-01"
    frame = message_frame(message_frame_parts("room", "r", "ada", "hi", None, None, None,
                                              traceparent), 7, 1)  # fmt: skip
    context = in_frame(frame)
    assert context is not None
    assert (f"{context.trace_id:032x}", f"{context.span_id:016x}") == (trace_id, span_id)
    forged = f'","traceparent":"00-{trace_id}-{span_id}-01'
    plain = message_frame(message_frame_parts("room", "r", "ada", forged), 8, 1)
    assert in_frame(plain) is None
    for bad in ("", "00-xyz", f"01-{trace_id}-{span_id}-01", f"00-{'0' * 32}-{span_id}-01",
                f"00-{trace_id}-{'0' * 16}-01", f"00-{trace_id.upper()}-{span_id}-01"):  # fmt: skip
        assert parse(bad) is None, bad


async def test_exemplars_link_the_publish_latency_to_traces_under_gunicorn(
    jaeger: JaegerServer, redis_server: RedisServer
) -> None:
    """Gunicorn with two workers, every message traced: a scrape that accepts OpenMetrics gets
    exemplars on the publish latency histogram naming traces Jaeger holds (whichever worker
    answers the scrape); the Prometheus text format has none."""
    app = AppProcess(
        {"CHAT_REDIS_URL": redis_server.url, "CHAT_TRACING_ENDPOINT": jaeger.otlp_url,
         "CHAT_TRACING_SAMPLE_RATIO": "1", "CHAT_TRACING_EXPORT_INTERVAL_S": "0.1"},
        gunicorn_workers=2,
    )  # fmt: skip
    await app.start()
    try:
        async with ChatClient.connect(app.ws_url("ada")) as ada:
            await ada.join("lobby")
            for n in range(5):
                await ada.say("lobby", f"m{n}")
                await _message(ada, f"m{n}")
        exemplar = re.compile(
            r"^hubbub_broker_publish_duration_seconds_bucket\{.*\} \S+ "
            r'# \{trace_id="([0-9a-f]{32})"\}',
            re.MULTILINE,
        )
        found: list[str] = []
        async with httpx.AsyncClient() as http, asyncio.timeout(20):
            while not found:
                scrape = await http.get(
                    f"{app.http_url}/metrics",
                    headers={"Accept": "application/openmetrics-text; version=1.0.0"},
                )
                assert scrape.headers["content-type"].startswith("application/openmetrics-text")
                found = exemplar.findall(scrape.text)
                await asyncio.sleep(0.2)
            plain = await http.get(f"{app.http_url}/metrics")
        assert plain.headers["content-type"].startswith("text/plain")
        assert "hubbub_broker_publish_duration_seconds_bucket" in plain.text
        assert "# {" not in plain.text
        spans = await jaeger.wait_for_spans(found[0], lambda s: len(_ops(s, "publish")) == 1)
        assert _tag(_ops(spans, "publish")[0], "hubbub.via") == "socket"
    finally:
        await app.stop()
