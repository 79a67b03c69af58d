"""Reports: anyone who may read a message may report it; moderators work through the queue.

Contract:
- **Reporting** (the ``report`` frame): the reporter must be allowed to read the message's
  conversation now (the one access decision, :mod:`app.access.conversations`: the same
  answer as any frame about it), and the message must exist and not be deleted
  (``not_found``). What it says then is kept with the report. Reporting the same message
  again answers the first report and queues nothing. At most ``CHAT_USER_REPORTS_PER_S``
  per user (``rate_limited``). A new report is queued as the signed ``message.reported``
  webhook (with webhooks on) and counted (``hubbub_reports_total``).
- **The queue** is read and resolved by the backend API (every report), and in the page by
  users whose token's ``roles`` claim holds ``moderator``, who see only reports of
  conversations they may read now (the one access decision again: a moderator does not read
  a private room, or someone's direct messages, through a report). Others are ``forbidden``.
- **Resolving**: ``dismiss`` (nothing else happens) or ``delete`` (the message is deleted
  in its conversation, as its author or a moderator deleting it would: every client gets
  ``deleted``, its files go); the report records who resolved it, when and how. A report
  resolved already is answered as it is. Kicking or banning its author is a separate
  decision (the ``kick`` and ``ban`` frames, the moderation API).
- Needs the store (``no_store`` without one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import orjson

from app.access.auth import Identity
from app.access.conversations import ConversationAccess
from app.access.quotas import Quotas
from app.broker import Broker
from app.conversations.history import ConversationHistory, HistoryUnavailable
from app.conversations.lifecycle import Change, Kind
from app.conversations.names import is_direct, members_of_direct
from app.conversations.rooms import RoomError
from app.errors import BrokerUnavailable, ErrorCode, FrameError, MessageGone, QuotaExceeded
from app.files.service import Files
from app.ops.metrics import Metrics
from app.protocol import is_message_frame
from app.store.database import StoreError
from app.store.reports import Report, ReportStore

logger = logging.getLogger(__name__)

Action = Literal["dismiss", "delete"]
# Queues a webhook event with its data (app.webhooks.queue.WebhookQueue.enqueue).
Enqueue = Callable[[str, dict[str, Any]], Awaitable[bool]]

_OUTCOMES: dict[Action, str] = {"dismiss": "dismissed", "delete": "deleted"}


def described(report: Report) -> dict[str, Any]:
    """A report as frames, the backend API and the webhook show it."""
    where: dict[str, Any] = (
        {"with": list(members_of_direct(report.conversation))}
        if is_direct(report.conversation)
        else {"room": report.conversation}
    )
    return {
        "id": report.id, **where,
        "message": {"id": report.message_id, "user": report.author, "text": report.text},
        "reporter": report.reporter, "reason": report.reason, "ts": report.created_ms,
        "resolved": None if report.open else {
            "by": report.resolved_by, "outcome": report.outcome, "ts": report.resolved_ms,
        },
    }  # fmt: skip


def _unavailable() -> FrameError:
    return FrameError(ErrorCode.STORE_UNAVAILABLE, "reports unavailable, try again")


class Reports:
    """One per worker (see the module's contract)."""

    def __init__(
        self,
        store: ReportStore,
        access: ConversationAccess,
        history: ConversationHistory,
        broker: Broker,
        quotas: Quotas,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._access = access
        self._history = history
        self._broker = broker
        self._quotas = quotas
        self._metrics = metrics
        # Set by the app when webhooks are on (message.reported) and with file storage.
        self.enqueue: Enqueue | None = None
        self.files: Files | None = None

    async def report(
        self, identity: Identity, conversation: str, message_id: int, reason: str
    ) -> dict[str, Any]:
        """Report message ``message_id`` of ``conversation`` (which ``identity`` may read:
        the caller checked, as for any frame about it). Raises :class:`FrameError`."""
        if not await self._quotas.allow("report", identity.user):
            raise FrameError(ErrorCode.RATE_LIMITED, "too many reports, slow down")
        try:
            page = await self._history.history_before(conversation, message_id + 1, 1)
        except BrokerUnavailable:
            raise FrameError(ErrorCode.BROKER_UNAVAILABLE, "not reported, try again") from None
        except HistoryUnavailable:
            raise _unavailable() from None
        message = orjson.loads(page[0].payload) if page and page[0].id == message_id else None
        if message is None or not is_message_frame(page[0].payload) or message.get("deleted"):
            raise FrameError(ErrorCode.NOT_FOUND, f"no message {message_id} to report")
        try:
            report, new = await self._store.add(
                conversation, message_id, str(message["user"]), str(message["text"]),
                identity.user, reason, _now_ms(),
            )  # fmt: skip
        except StoreError:
            raise _unavailable() from None
        shown = described(report)
        if new:
            self._metrics.reports.labels("reported").inc()
            logger.info(
                "message reported",
                extra={"report": report.id, "conversation": conversation, "user": identity.user},
            )
            if self.enqueue is not None:
                try:
                    await self.enqueue("message.reported", {"report": shown})
                except BrokerUnavailable:  # the report is stored: moderators find it anyway
                    logger.warning("message.reported for report %d not queued", report.id)
        return shown

    async def queue(
        self, moderator: Identity | None, resolved: bool, before: int | None, limit: int
    ) -> dict[str, Any]:
        """A page of open (oldest first) or ``resolved`` (newest first) reports:
        ``{"reports", "next"}`` (``next``: the ``before`` of the next page, None on the
        last). ``moderator`` None: the backend API, every report; else a moderator's, only
        those it may read now."""
        self._require_moderator(moderator)
        try:
            found = await self._store.listed(resolved, before, limit)
        except StoreError:
            raise _unavailable() from None
        shown = found
        if moderator is not None:
            readable = await self._readable(moderator, {r.conversation for r in found})
            shown = [r for r in found if r.conversation in readable]
        return {
            "reports": [described(r) for r in shown],
            "next": found[-1].id if len(found) == limit else None,
        }

    async def resolve(
        self, report_id: int, action: Action, moderator: Identity | None, by: str
    ) -> dict[str, Any]:
        """Resolve report ``report_id`` with ``action``, as ``by`` (``moderator`` None: the
        backend API). Raises :class:`FrameError` (``not_found`` also for a report a
        moderator may not read)."""
        self._require_moderator(moderator)
        try:
            report = await self._store.get(report_id)
        except StoreError:
            raise _unavailable() from None
        if report is None or (
            moderator is not None
            and report.conversation not in await self._readable(moderator, {report.conversation})
        ):
            raise FrameError(ErrorCode.NOT_FOUND, f"no report {report_id}")
        if not report.open:
            return described(report)
        if action == "delete":
            await self._delete(report, by)
        try:
            resolved = await self._store.resolve(report_id, by, _OUTCOMES[action], _now_ms())
        except StoreError:
            raise _unavailable() from None
        assert resolved is not None  # reports are never removed
        report, changed = resolved
        if changed:
            self._metrics.reports.labels(_OUTCOMES[action]).inc()
            logger.info(
                "report resolved", extra={"report": report_id, "outcome": report.outcome, "by": by}
            )
        return described(report)

    async def _delete(self, report: Report, by: str) -> None:
        change = Change(Kind.DELETED, report.message_id, by)
        try:
            await self._broker.publish_event(report.conversation, change, None, None)
        except MessageGone:
            return  # deleted meanwhile: what was asked is done
        except QuotaExceeded:
            raise FrameError(ErrorCode.RATE_LIMITED, "too many changes, slow down") from None
        except BrokerUnavailable:
            raise FrameError(ErrorCode.BROKER_UNAVAILABLE, "not done, try again") from None
        if self.files is not None:
            await self.files.forget_message(report.conversation, report.message_id)

    async def _readable(self, moderator: Identity, conversations: set[str]) -> set[str]:
        try:
            return await self._access.visible(moderator, conversations)
        except RoomError:
            raise _unavailable() from None

    @staticmethod
    def _require_moderator(moderator: Identity | None) -> None:
        if moderator is not None and not moderator.moderator:
            raise FrameError(ErrorCode.FORBIDDEN, "only moderators may read or resolve reports")


def _now_ms() -> int:
    return int(time.time() * 1000)
