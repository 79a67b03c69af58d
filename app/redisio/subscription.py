"""A Redis pub/sub connection whose pushes are parsed by hiredis and handled as they arrive.

redis-py's ``PubSub.get_message`` costs, per message, a few coroutines, a timeout context and a
dict; a busy worker receives every message of every room it serves through it. Here the
connection (opened by redis-py, see :mod:`app.redisio.redis_seam`) feeds hiredis directly from
``data_received``, and each push goes to the handler in the same callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Final

import hiredis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from app.redisio.redis_seam import hand_over

logger = logging.getLogger(__name__)

PushHandler = Callable[[list[Any]], None]
# Commands whose channels one call may list whatever they are. Not the sharded ones: all of
# an SSUBSCRIBE's channels must be in one slot.
_MERGED: Final = frozenset({"SUBSCRIBE", "UNSUBSCRIBE"})


class Subscription(asyncio.Protocol):
    """One subscribed connection: ``SUBSCRIBE`` / ``UNSUBSCRIBE`` out, pushes in.

    Contract:

    * **Delivery:** every push Redis sends (``[b"message", channel, data]``,
      ``[b"subscribe", channel, count]``, ...) reaches ``on_push`` once, in the order Redis
      sent it, from inside ``data_received``; ``on_push`` must not block.
    * **End:** :attr:`lost` resolves with the exception that ended the subscription: the
      connection's loss, an error reply, or an exception ``on_push`` raised (the connection is
      then aborted). Nothing is delivered after that. Whoever opened it calls :meth:`close`.
    * Subscribing is a write: the confirmation is the ``subscribe`` push. The commands of one
      event-loop iteration leave in one write, in order, consecutive ones of a kind merged
      (``SUBSCRIBE a`` then ``SUBSCRIBE b`` as ``SUBSCRIBE a b``: Redis confirms each
      channel as before; not the sharded commands, whose channels must share a slot): a
      connect storm subscribes hundreds of users' channels an iteration.
    * **Masters only:** :meth:`open` refuses a server that says it is a replica. A replica
      executes the PUBLISHes of its master's replication stream, but not those its master ran
      before the snapshot of a (re)sync: a subscription made on a replica while it syncs (a
      Sentinel that has not heard of a failover yet names the old master, back as a replica)
      would miss messages with nothing to tell, since the publishes' history, read on the
      master, holds them.
    """

    writer: asyncio.StreamWriter  # kept: see hand_over

    def __init__(self, on_push: PushHandler) -> None:
        self._on_push = on_push
        self._reader = hiredis.Reader(replyError=ResponseError)
        self.lost: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        # This iteration's commands, not written yet: [command name, *channels] each.
        self._unsent: list[list[str]] = []

    @classmethod
    async def open(cls, redis: Redis, on_push: PushHandler) -> Subscription:
        """Connect as ``redis`` would (its URL, credentials and timeouts); raises
        ``ConnectionError`` when the server is not a master (see the class' contract)."""
        subscription = cls(on_push)
        subscription.writer, role = await hand_over(redis, subscription, ("ROLE",))
        if not (isinstance(role, list) and role and role[0] == b"master"):
            subscription.close()
            kind = role[0].decode() if isinstance(role, list) and role else repr(role)
            raise RedisConnectionError(f"will not subscribe on a {kind}, only on a master")
        return subscription

    def subscribe(self, *channels: str) -> None:
        """Ask for ``channels``; raises ``ConnectionError`` once the subscription is lost."""
        self._write("SUBSCRIBE", channels)

    def unsubscribe(self, *channels: str) -> None:
        self._write("UNSUBSCRIBE", channels)

    def ssubscribe(self, *channels: str) -> None:
        """Sharded pub/sub (Redis Cluster): every channel must be in a slot of this node; the
        confirmations are ``ssubscribe`` pushes, the messages ``smessage`` ones."""
        self._write("SSUBSCRIBE", channels)

    def sunsubscribe(self, *channels: str) -> None:
        self._write("SUNSUBSCRIBE", channels)

    def _write(self, name: str, channels: tuple[str, ...]) -> None:
        if self.lost.done() or self.writer.transport.is_closing():
            raise RedisConnectionError("pub/sub connection lost")
        unsent = self._unsent
        if not unsent:
            asyncio.get_running_loop().call_soon(self._send)
        if unsent and unsent[-1][0] == name and name in _MERGED:
            unsent[-1].extend(channels)
        else:
            unsent.append([name, *channels])

    def _send(self) -> None:
        unsent, self._unsent = self._unsent, []
        if not self.lost.done() and not self.writer.transport.is_closing():
            self.writer.transport.write(b"".join(_pack(command) for command in unsent))

    def data_received(self, data: bytes) -> None:
        if self.lost.done():
            return
        reader = self._reader
        reader.feed(data)
        try:
            while (push := reader.gets()) is not False:
                if isinstance(push, Exception):
                    raise push
                self._on_push(push)
        except Exception as exc:
            self._end(exc)
            self.writer.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(RedisConnectionError(f"pub/sub connection lost: {exc!r}"))

    def close(self) -> None:
        self._end(RedisConnectionError("pub/sub closed"))
        self.writer.transport.close()

    def _end(self, exc: Exception) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


def _pack(command: list[str]) -> bytes:
    # hiredis' stub types a command as a 1-tuple
    packed: bytes = hiredis.pack_command(tuple[Any, ...](command))
    return packed
