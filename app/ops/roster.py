"""Who is connected where: the connections of a user or a room on every worker, and closing
one, for the admin API (app.web.admin).

Contract:
- The workers asked are those of the census (:mod:`app.sockets.rebalance`): each gets the
  question through the broker (:meth:`~app.broker.Broker.route_to_worker`, its control
  channel) and answers the same way with its matching connections. :meth:`find` returns
  what came within ``timeout_s``, with the workers that did not answer named (a worker
  that died in between, or one overloaded): the view is live, never cached.
- A connection is described by its id, user, transport, when it opened (epoch ms), its
  rooms, how many bytes wait in its outbox, and the worker (id, host, pid) holding it.
- :meth:`close` closes one connection, wherever it is, with 4003 (as a kick), and says
  whether the worker named held it.

Routed payloads of this module are JSON objects whose first key is ``"k"``
(:func:`is_roster_payload`); the HTTP fallback's are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.broker import Broker
from app.errors import BrokerUnavailable, CloseCode
from app.sockets.connection import Connection
from app.sockets.hub import Hub

logger = logging.getLogger(__name__)

CLOSE_REASON = "disconnected by an administrator"
# Most rooms listed per connection (a connection may be in many).
_ROOMS_LISTED = 100


def is_roster_payload(payload: bytes) -> bool:
    """Whether a routed payload is this module's (see the module's contract)."""
    return payload.startswith(b'{"k":')


@dataclass(slots=True)
class Found:
    """The answer of :meth:`Roster.find`."""

    connections: list[dict[str, Any]] = field(default_factory=list)
    asked: int = 0
    unanswered: list[str] = field(default_factory=list)


class Roster:
    """This worker's side of the questions (answering them) and the asking side."""

    def __init__(self, hub: Hub, broker: Broker, timeout_s: float) -> None:
        self._hub = hub
        self._broker = broker
        self._timeout_s = timeout_s
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._numbers = itertools.count()
        # Questions this worker asked: number -> {worker: its answer}.
        self._asked: dict[int, tuple[set[str], dict[str, Any], asyncio.Event]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- asking -------------------------------------------------------------------------------

    async def find(self, workers: list[str], user: str | None, room: str | None) -> Found:
        """The connections of ``user`` (or in ``room``, or both) on ``workers``. Raises
        BrokerUnavailable."""
        answers, _ = await self._ask(workers, {"q": "find", "user": user, "room": room})
        found = Found(asked=len(workers))
        for worker in workers:
            answer = answers.get(worker)
            if answer is None:
                found.unanswered.append(worker)
            else:
                found.connections.extend(answer["connections"])
        found.connections.sort(key=lambda c: (c["user"], c["opened_ms"]))
        return found

    async def close(self, worker: str, conn_id: str) -> bool | None:
        """Close connection ``conn_id`` on ``worker``: whether it held it (False too when no
        such worker listens), None when it did not answer in time. Raises
        BrokerUnavailable."""
        answers, gone = await self._ask([worker], {"q": "close", "conn": conn_id})
        if gone:
            return False
        answer = answers.get(worker)
        return None if answer is None else bool(answer["closed"])

    async def _ask(
        self, workers: list[str], question: dict[str, Any]
    ) -> tuple[dict[str, Any], set[str]]:
        """Ask ``workers``: their answers (those that came in time), and the workers nobody
        listens for (gone; never on Redis Cluster, where a publish cannot tell)."""
        number = next(self._numbers)
        waiting, done = set(workers), asyncio.Event()
        answers: dict[str, Any] = {}
        self._asked[number] = (waiting, answers, done)
        payload = orjson.dumps({"k": "ask", "n": number, "r": self._broker.worker_id, **question})
        gone = set()
        try:
            for worker in workers:
                if not await self._broker.route_to_worker(worker, payload):
                    gone.add(worker)  # nobody listens there
                    waiting.discard(worker)
            if waiting:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._timeout_s):
                        await done.wait()
            return dict(answers), gone
        finally:
            del self._asked[number]

    # -- answering ----------------------------------------------------------------------------

    def deliver_routed(self, payload: bytes) -> None:
        """A question from another worker (answered), or an answer to one of this worker's."""
        try:
            routed = orjson.loads(payload)
            if routed["k"] == "answer":
                asked = self._asked.get(int(routed["n"]))
                if asked is not None:
                    waiting, answers, done = asked
                    answers[routed["w"]] = routed
                    waiting.discard(routed["w"])
                    if not waiting:
                        done.set()
                return
            answer = self._answer(routed)
            reply = orjson.dumps({"k": "answer", "n": routed["n"], "w": self._broker.worker_id,
                                  **answer})  # fmt: skip
            task = asyncio.ensure_future(self._reply(str(routed["r"]), reply))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            logger.warning("dropped a malformed roster question")
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answer(self, question: dict[str, Any]) -> dict[str, Any]:
        if question["q"] == "close":
            for conn in self._hub.connections:
                if conn.id == question["conn"]:
                    conn.close(CloseCode.FORBIDDEN, CLOSE_REASON)
                    logger.info("admin: closed a connection", extra={"conn": conn.id})
                    return {"closed": True}
            return {"closed": False}
        user, room = question.get("user"), question.get("room")
        matching = [
            conn for conn in self._hub.connections
            if (user is None or conn.user == user) and (room is None or room in conn.rooms)
        ]  # fmt: skip
        return {"connections": [self.describe(conn) for conn in matching]}

    def describe(self, conn: Connection) -> dict[str, Any]:
        """What the admin API says of one connection (see the module's contract)."""
        age_s = asyncio.get_running_loop().time() - conn.opened_at
        return {
            "id": conn.id,
            "user": conn.user,
            "transport": conn.transport,
            "opened_ms": int((time.time() - age_s) * 1000),
            "rooms": sorted(conn.rooms)[:_ROOMS_LISTED],
            "room_count": len(conn.rooms),
            "queued_bytes": conn.queued_bytes,
            "worker": self._broker.worker_id,
            "host": self._host,
            "pid": self._pid,
        }

    async def _reply(self, worker: str, reply: bytes) -> None:
        with contextlib.suppress(BrokerUnavailable):  # the asker reports it unanswered
            await self._broker.route_to_worker(worker, reply)
