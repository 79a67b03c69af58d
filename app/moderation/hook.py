"""The moderation hook: every message and edit a user sends is decided by the operator's
endpoint before it is published (off unless ``CHAT_MODERATION_HOOK_URL`` is set).

Contract (docs/backend.md, "Moderation hook"):
- **Request**: ``POST`` of ``{"messages": [ITEM, …]}``, JSON, signed as webhooks are
  (``Hubbub-Signature``, HMAC-SHA256 with ``CHAT_MODERATION_HOOK_SECRET``), where ITEM is
  ``{"id", "kind": "message"|"edit", "room"|"with", "user", "text", "attachments"}``
  (``with``: the two users of a direct conversation; ``attachments``: the files' metadata,
  name, size and sniffed type; ``id``: this request's own key for the item).
- **Answer**: 200 with ``{"results": [{"id", "action": "accept"|"reject"|"replace",
  "reason", "text"}, …]}``, one per item: ``reject`` refuses it (the sender gets error
  ``rejected`` with ``reason``, at most 200 characters), ``replace`` publishes ``text``
  instead (it must be a valid text: else the item failed). Anything else — another status,
  a missing or malformed result, a timeout (``CHAT_MODERATION_HOOK_TIMEOUT_S``), a refused
  connection — fails the items it concerns, and ``CHAT_MODERATION_HOOK_ON_FAILURE``
  decides them: ``reject`` (error ``moderation_unavailable``: nothing unchecked is
  published) or ``accept``.
- **Batching**: what is sent while ``CHAT_MODERATION_HOOK_CONCURRENCY`` requests are under
  way waits and goes together, up to ``CHAT_MODERATION_HOOK_BATCH_MAX`` an request: no
  added wait when the hook keeps up, fewer requests when it does not.
- Redirects are not followed; no proxy from the environment is used. Decisions are counted
  by kind (``hubbub_moderation_decisions_total``), and timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2 as httpx
import orjson

from app.conversations.names import is_direct, members_of_direct
from app.errors import ErrorCode, FrameError
from app.ops.metrics import Metrics
from app.protocol import storable
from app.settings import Settings
from app.webhooks.signing import HEADER, signature

logger = logging.getLogger(__name__)

Kind = Literal["message", "edit"]
_REASON_MAX = 200


@dataclass(slots=True)
class _Item:
    key: str
    body: dict[str, Any]
    queued: float
    decided: asyncio.Future[str] = field(default_factory=asyncio.Future)


class ModerationHook:
    """One per worker (see the module's contract). :meth:`check` is the only call paths
    make."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        assert settings.moderation_hook_url is not None
        assert settings.moderation_hook_secret is not None
        self._url = str(settings.moderation_hook_url)
        self._secret = settings.moderation_hook_secret.get_secret_value().encode()
        self._settings = settings
        self._metrics = metrics
        self._waiting: list[_Item] = []
        self._slots = asyncio.Semaphore(settings.moderation_hook_concurrency)
        self._keys = itertools.count(1)
        self._senders: set[asyncio.Task[None]] = set()
        self._http = httpx.AsyncClient(
            timeout=settings.moderation_hook_timeout_s, follow_redirects=False, trust_env=False
        )

    async def check(
        self,
        kind: Kind,
        conversation: str,
        user: str,
        text: str,
        attachments: list[dict[str, Any]] | None = None,
    ) -> str:
        """The text to publish (``text``, or the hook's replacement). Raises
        :class:`FrameError`: ``rejected`` (with the hook's reason) or
        ``moderation_unavailable``."""
        where: dict[str, Any] = (
            {"with": list(members_of_direct(conversation))}
            if is_direct(conversation)
            else {"room": conversation}
        )
        key = str(next(self._keys))
        body = {"id": key, "kind": kind, **where, "user": user, "text": text,
                "attachments": attachments or []}  # fmt: skip
        item = _Item(key, body, time.perf_counter())
        self._waiting.append(item)
        self._start_sender()
        timeout = self._settings.moderation_hook_timeout_s
        try:
            async with asyncio.timeout(timeout * 1.5):  # the request's own timeout, and its wait
                decision = await asyncio.shield(item.decided)
        except TimeoutError:
            decision = "failed"
        finally:
            self._metrics.moderation_hook_latency.observe(time.perf_counter() - item.queued)
        return self._apply(decision, text)

    def _apply(self, decision: str, text: str) -> str:
        action, _, detail = decision.partition(":")
        if action == "failed":
            if self._settings.moderation_hook_on_failure == "accept":
                self._metrics.moderation_decisions.labels("failed_accept").inc()
                return text
            self._metrics.moderation_decisions.labels("failed_reject").inc()
            raise FrameError(
                ErrorCode.MODERATION_UNAVAILABLE, "not sent: moderation is unavailable, try again"
            )
        self._metrics.moderation_decisions.labels(action).inc()
        if action == "reject":
            raise FrameError(ErrorCode.REJECTED, detail or "rejected by moderation")
        return detail if action == "replace" else text

    def _start_sender(self) -> None:
        if self._slots.locked() or not self._waiting:
            return  # a request under way takes what waits when it is done
        task = asyncio.get_running_loop().create_task(self._send())
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)

    async def _send(self) -> None:
        async with self._slots:
            while self._waiting:
                most = self._settings.moderation_hook_batch_max
                batch, self._waiting = self._waiting[:most], self._waiting[most:]
                self._metrics.moderation_hook_batch.observe(len(batch))
                decided = await self._request(batch)
                for item in batch:
                    if not item.decided.done():
                        item.decided.set_result(decided.get(item.key, "failed"))

    async def _request(self, batch: list[_Item]) -> dict[str, str]:
        """Each item's decision (``accept``, ``reject:<reason>``, ``replace:<text>``); an item
        left out failed."""
        body = orjson.dumps({"messages": [item.body for item in batch]})
        headers = {
            "Content-Type": "application/json",
            HEADER: signature(self._secret, int(time.time()), body),
        }
        try:
            answer = await self._http.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            logger.warning("moderation hook failed: %r", exc, extra={"messages": len(batch)})
            return {}
        if answer.status_code != 200:
            logger.warning(
                "moderation hook answered %d", answer.status_code, extra={"messages": len(batch)}
            )
            return {}
        try:
            results = orjson.loads(answer.content)["results"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            logger.warning("moderation hook answered no results", extra={"messages": len(batch)})
            return {}
        decided: dict[str, str] = {}
        if not isinstance(results, list):
            return decided
        for result in results:
            decision = _decision(result, self._settings.max_text_chars)
            if decision is not None:
                decided[str(result["id"])] = decision
        return decided

    async def close(self) -> None:
        for task in list(self._senders):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._senders, return_exceptions=True)
        await self._http.aclose()


def _decision(result: object, max_text_chars: int) -> str | None:
    """One result as a decision; None when it is malformed (its item then failed)."""
    if not isinstance(result, dict) or not isinstance(result.get("id"), str | int):
        return None
    action = result.get("action")
    if action == "accept":
        return "accept"
    if action == "reject":
        reason = result.get("reason")
        shown = reason[:_REASON_MAX] if isinstance(reason, str) else ""
        return "reject:" + shown
    if action == "replace":
        text = result.get("text")
        if not isinstance(text, str) or len(text) > max_text_chars:
            return None
        try:
            return "replace:" + storable(text)
        except ValueError:
            return None
    return None
