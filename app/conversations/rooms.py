"""Rooms with a record: public or private, with a title, a topic, members and their roles.

Contract:
- A room without a record is public, as every room always was: anyone its token allows joins
  it, reads it and writes in it (joining it makes it, as before).
- A private room (a record with ``private``) is joined, read (``history`` frames and HTTP)
  and written in by its members only. Records need the store: without one, rooms are public.
- Who may change what (:meth:`RoomDirectory.add`, :meth:`~RoomDirectory.remove`,
  :meth:`~RoomDirectory.describe`): an owner does everything but leave; an admin adds and
  removes members and describes the room; anyone leaves (removes themselves). The backend
  API (``by`` None) may do everything.
- Every change is stored first, then announced to every worker
  (:meth:`app.broker.Broker.room_changed`): each forgets its copy and rechecks who is in
  the room there, so a removed member's connections leave it on every worker at once
  (``left`` with reason ``removed``). A
  worker that lost its broker subscription (and may have missed notices) forgets every
  record when it is back and takes out of private rooms whoever is no longer a member.
- Records are read through a per-worker cache, at most ``CHAT_ROOM_CACHE_S`` old (notices
  make changes visible sooner).
- While the store cannot be read, chat goes on: a room's last record read is used however
  old, and a room never read is public unless the broker says it was made private (every
  private room is marked there before it is stored): then it is ``store_unavailable``.
- :class:`RoomError` says why a call was refused (its ``code`` is the error frame's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.broker import Broker
from app.errors import BrokerUnavailable, ErrorCode
from app.protocol import invited_frame, member_frame
from app.settings import Settings
from app.sockets.hub import Hub
from app.store.database import StoreError
from app.store.messages import MessageStore
from app.store.rooms import Role, Room, RoomStore

logger = logging.getLogger(__name__)

_CACHE_MAX = 10_000


class RoomError(Exception):
    """A room call refused: ``code`` and a message for the client."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def room_not_found(room: str) -> RoomError:
    """The one answer, about a room, to someone who may not see it: the same whether it has
    no record or is private and they are not a member (app.access.conversations)."""
    return RoomError(ErrorCode.NOT_FOUND, f"room {room!r} not found")


@dataclass(frozen=True, slots=True)
class RoomRecord:
    room: Room
    members: dict[str, Role]

    def describe(self, role: Role | None = None, members: bool = False) -> dict[str, Any]:
        """The room as frames and the API show it: with ``role``, the viewer's; with
        ``members``, every member's (user -> role)."""
        shown: dict[str, Any] = {
            "room": self.room.name, "private": self.room.private, "title": self.room.title,
            "topic": self.room.topic,
        }  # fmt: skip
        if role is not None:
            shown["role"] = role.value
        if members:
            shown["members"] = {user: r.value for user, r in sorted(self.members.items())}
        return shown


# A change of a member, for webhooks: (event, room, user, role, by).
MemberListener = Callable[[str, str, str, str | None, str | None], Awaitable[None]]


class RoomDirectory:
    def __init__(
        self,
        store: RoomStore | None,
        broker: Broker,
        hub: Hub,
        settings: Settings,
        messages: MessageStore | None = None,
    ) -> None:
        self._store = store
        self._messages = messages  # a room with stored history is in use (create)
        self._broker = broker
        self._hub = hub
        self._settings = settings
        self._cache: OrderedDict[str, tuple[float, RoomRecord | None]] = OrderedDict()
        self._rechecks: set[asyncio.Task[None]] = set()
        self.member_listener: MemberListener | None = None
        hub.rooms_changed = self.forget

    # -- reading ---------------------------------------------------------------------------

    async def record(self, room: str) -> RoomRecord | None:
        """The room's record (None: none, a public room). Raises :class:`RoomError`
        (``store_unavailable``) when the store cannot be read."""
        if self._store is None:
            return None
        now = time.monotonic()
        cached = self._cache.get(room)
        if cached is not None and now - cached[0] < self._settings.room_cache_s:
            return cached[1]
        try:
            found = await self._store.get(room)
        except StoreError as exc:
            if cached is not None:
                return cached[1]  # stale beats unavailable
            logger.info("room %s: the store cannot be read (%s)", room, exc)
            try:
                private = await self._broker.is_private(room)
            except BrokerUnavailable:
                private = True  # unknown: closed
            if private:
                raise RoomError(
                    ErrorCode.STORE_UNAVAILABLE, "rooms unavailable, try again"
                ) from exc
            return None
        record = None if found is None else RoomRecord(*found)
        self._cache[room] = (now, record)
        self._cache.move_to_end(room)
        if len(self._cache) > _CACHE_MAX:
            self._cache.popitem(last=False)
        return record

    async def current(self, room: str) -> RoomRecord | None:
        """The room's record as stored now when it is private (its members decide who may
        read it: a change made through another server holds at once), else as :meth:`record`
        gives it. While the store cannot be read, the last record read is used."""
        cached = self._cache.get(room)
        if cached is None or cached[1] is None or not cached[1].room.private:
            return await self.record(room)  # read now if not cached
        del self._cache[room]
        try:
            return await self.record(room)
        except RoomError:
            return cached[1]  # stale beats unavailable, as record() does

    async def rooms_of(self, user: str) -> list[dict[str, Any]]:
        """The rooms ``user`` is a member of, with its role."""
        store = self._required()
        try:
            found = await store.rooms_of(user, self._settings.max_rooms_listed)
        except StoreError as exc:
            raise RoomError(ErrorCode.STORE_UNAVAILABLE, "rooms unavailable, try again") from exc
        return [RoomRecord(room, {}).describe(role) for room, role in found]

    async def directory(self, contains: str | None) -> list[dict[str, Any]]:
        """The public rooms with a record (see :meth:`RoomStore.public`), as ``rooms`` lists
        them (no role: the one asking may not be a member). Private rooms are never listed."""
        store = self._required()
        try:
            found = await store.public(contains, self._settings.max_rooms_listed)
        except StoreError as exc:
            raise RoomError(ErrorCode.STORE_UNAVAILABLE, "rooms unavailable, try again") from exc
        return [RoomRecord(room, {}).describe(None) for room in found if not room.private]

    # -- changing --------------------------------------------------------------------------

    async def create(
        self, room: str, creator: str, private: bool, title: str = "", topic: str = ""
    ) -> RoomRecord:
        """A new room, ``creator`` its owner. ``exists`` when it has a record or a history
        (a room people already use cannot be taken over)."""
        store = self._required()
        if await self.in_use(room):
            raise RoomError(ErrorCode.EXISTS, f"room {room!r} exists already")
        record = Room(room, private, title, topic, creator, int(time.time() * 1000))
        try:
            if private:  # first: a private room is never taken for public (see record())
                await self._broker.mark_private(room, True)
            created = await store.create(record)
        except BrokerUnavailable:
            raise RoomError(ErrorCode.BROKER_UNAVAILABLE, "cannot create now, try again") from None
        except StoreError as exc:
            raise RoomError(ErrorCode.STORE_UNAVAILABLE, "cannot create now, try again") from exc
        if not created:
            existing = await self._existing(room)
            with contextlib.suppress(BrokerUnavailable):
                await self._broker.mark_private(room, existing.room.private)
            raise RoomError(ErrorCode.EXISTS, f"room {room!r} exists already")
        await self._announce(room)
        await self._tell("member.added", room, creator, Role.OWNER, creator)
        return RoomRecord(record, {creator: Role.OWNER})

    async def in_use(self, room: str) -> bool:
        """Whether people use ``room``: the broker knows it, or the store holds its history
        (the broker's keys expire, and the embedded broker forgets everything on a restart)."""
        try:
            if await self._broker.room_exists(room):
                return True
        except BrokerUnavailable:
            raise RoomError(ErrorCode.BROKER_UNAVAILABLE, "not now, try again") from None
        if self._messages is None:
            return False
        try:
            return bool(await self._messages.before(room, None, 1))
        except StoreError as exc:
            raise RoomError(ErrorCode.STORE_UNAVAILABLE, "not now, try again") from exc

    async def describe(
        self, room: str, by: str | None, title: str | None, topic: str | None
    ) -> RoomRecord:
        """Change the title and/or topic (owners and admins; ``by`` None: the backend)."""
        record = await self._existing(room, by)
        if by is not None and record.members.get(by) not in (Role.OWNER, Role.ADMIN):
            raise RoomError(ErrorCode.FORBIDDEN, "only the room's owner or an admin may do that")
        await self._write(self._required().describe(room, title, topic))
        await self._announce(room)
        return await self._existing(room)

    async def add(self, room: str, user: str, role: Role, by: str | None) -> RoomRecord:
        """Make ``user`` a member with ``role``, or change its role. An owner may give any
        role but owner; an admin adds members; the backend (``by`` None) may do anything."""
        record = await self._existing(room, by)
        if by is not None:
            actor = record.members.get(by)
            current = record.members.get(user)
            allowed = (
                actor is Role.OWNER and role is not Role.OWNER and current is not Role.OWNER
            ) or (actor is Role.ADMIN and role is Role.MEMBER and current is None)
            if not allowed:
                raise RoomError(
                    ErrorCode.FORBIDDEN,
                    "owners add members and admins, admins add members"
                    if actor in (Role.OWNER, Role.ADMIN)
                    else "only the room's owner or an admin may add members",
                )
        cap = self._settings.room_members_max
        if user not in record.members and len(record.members) >= cap:
            raise RoomError(ErrorCode.TOO_MANY_MEMBERS, f"a room may have at most {cap} members")
        await self._write(self._required().set_role(room, user, role, int(time.time() * 1000)))
        await self._announce(room)
        await self._tell("member.added", room, user, role, by)
        changed = await self._existing(room)
        await self._notify(room, member_frame(room, user, "added", role.value, by),
                           (user, invited_frame(changed.describe(role), by)))  # fmt: skip
        return changed

    async def remove(self, room: str, user: str, by: str | None) -> RoomRecord:
        """Take ``user`` out of the members: by an owner (anyone but an owner), an admin (a
        member), the user itself (but an owner), or the backend. Its connections leave the
        room everywhere. Who is a member is told to members only: anyone else gets the same
        answer whoever ``user`` is."""
        record = await self._existing(room, by)
        if by is not None and by != user and by not in record.members:
            raise RoomError(
                ErrorCode.FORBIDDEN, "only the room's owner or an admin may remove members"
            )
        target = record.members.get(user)
        if target is None:
            raise RoomError(ErrorCode.NOT_FOUND, f"{user!r} is not a member of {room!r}")
        if by is not None:
            actor = record.members.get(by)
            allowed = target is not Role.OWNER and (
                by == user or actor is Role.OWNER or (actor is Role.ADMIN and target is Role.MEMBER)
            )
            if not allowed:
                raise RoomError(ErrorCode.FORBIDDEN, _why_not_removed(target, actor, by == user))
        store = self._required()
        await self._write(store.remove(room, user))
        await self._announce(room)
        await self._tell("member.removed", room, user, target, by)
        notice = member_frame(room, user, "removed", None, by)
        await self._notify(room, notice, (user, notice))
        return await self._existing(room)

    # -- keeping workers in step ---------------------------------------------------------------

    def forget(self, room: str | None) -> None:
        """A room changed (None: any may have, notices were missed): drop its cached record,
        and recheck who is in it here (a room made private just after someone joined it; a
        member removed) — every room this worker has connections in, for None."""
        if room is not None:
            self._cache.pop(room, None)
            if room not in self._hub.rooms_here:
                return
            rooms = [room]
        else:
            self._cache.clear()
            rooms = self._hub.rooms_here_names()
        task = asyncio.ensure_future(self._recheck(rooms))
        self._rechecks.add(task)
        task.add_done_callback(self._rechecks.discard)

    async def _recheck(self, rooms: list[str]) -> None:
        """Take out of private rooms the connections whose users are not members."""
        for room in rooms:
            try:
                record = await self.record(room)
            except RoomError:
                logger.warning("cannot recheck the members of %s: the store is unavailable", room)
                continue
            if record is None or not record.room.private:
                continue
            for conn in self._hub.members_here(room):
                if conn.user not in record.members:
                    await self._hub.expel(conn, room)

    async def _announce(self, room: str) -> None:
        """Forget ``room`` here (rechecking who is in it) and on every other worker."""
        self.forget(room)
        try:
            await self._broker.room_changed(room)
        except BrokerUnavailable:
            # Stored: the other workers see it within CHAT_ROOM_CACHE_S, and recheck every
            # room when the broker is back.
            logger.warning("room %s changed but the broker is unavailable to announce it", room)

    async def _notify(self, room: str, notice: bytes, to_user: tuple[str, bytes]) -> None:
        """Live notices, at most once: ``notice`` to the room, the other to one user."""
        with contextlib.suppress(BrokerUnavailable):
            await self._broker.broadcast(room, notice)
            await self._broker.notify_user(*to_user)

    async def _tell(
        self, event: str, room: str, user: str, role: Role | None, by: str | None
    ) -> None:
        if self.member_listener is not None:
            with contextlib.suppress(BrokerUnavailable):
                await self.member_listener(
                    event, room, user, None if role is None else role.value, by
                )

    async def _existing(self, room: str, by: str | None = None) -> RoomRecord:
        """The room's record as stored now; ``not_found`` when it has none, and (the same
        answer) when it is private and ``by`` is not a member."""
        self.forget(room)
        record = await self.record(room)
        if record is None:
            raise room_not_found(room)
        if by is not None and record.room.private and by not in record.members:
            raise room_not_found(room)
        return record

    def _required(self) -> RoomStore:
        if self._store is None:
            raise RoomError(ErrorCode.NO_STORE, "rooms with members need a store")
        return self._store

    async def _write(self, call: Awaitable[object]) -> None:
        try:
            await call
        except StoreError as exc:
            raise RoomError(ErrorCode.STORE_UNAVAILABLE, "not done, try again") from exc


def _why_not_removed(target: Role, actor: Role | None, self_removal: bool) -> str:
    if target is Role.OWNER:
        return "an owner cannot be removed (nor leave)"
    if self_removal:
        return "not allowed"
    if actor is Role.ADMIN:
        return "admins remove members, not other admins"
    return "only the room's owner or an admin may remove members"
