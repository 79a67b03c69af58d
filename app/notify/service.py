"""Notifications as a connection asks for them: which users a message mentions, the
mentions list, notification levels, and Web Push subscriptions. One per worker (with a store
and ``CHAT_NOTIFICATIONS``).

Contract:
- :meth:`Notifications.mentions_for_send` decides who a message mentions (docs/protocol.md,
  "Mentions and notifications"): named users who may read the conversation now (the one
  access decision, asked as each of them) and take part in it, at most
  ``CHAT_MENTIONS_PER_MESSAGE_MAX``, never the sender; ``@here`` in a room, refused
  (``forbidden``) to all but its owner and admins when more than
  ``CHAT_MENTION_HERE_OPEN_MAX`` are present.
- :meth:`~Notifications.mentions_page` lists only mentions in conversations the user may read
  now (the one access decision).
- Levels and subscriptions are the user's own: nobody reads or changes another's.
- A subscription's endpoint must be a push service in ``CHAT_PUSH_SERVICES``
  (:func:`app.notify.webpush.subscription_refusal`): nothing else is ever sent a request.
- Methods raise :class:`~app.conversations.rooms.RoomError` (its ``code`` is the error
  frame's) for a refusal, and for a store that cannot be read (``store_unavailable``).
"""

from __future__ import annotations

import time
from typing import Any

from app.access.auth import Identity
from app.access.conversations import ConversationAccess
from app.conversations.names import direct, is_direct, members_of_direct, peer
from app.conversations.rooms import RoomError, RoomRecord
from app.errors import ErrorCode
from app.notify.mentions import named, stored_form
from app.notify.rules import LEVEL_NAMES, LEVELS_BY_NAME, Level, default_level
from app.notify.webpush import Subscription, subscription_refusal
from app.presence import Presence
from app.settings import Settings
from app.store.database import StoreError
from app.store.notifications import LevelSetting, NotificationStore
from app.store.rooms import Role

_LEVELS_LISTED = 1000


def _unavailable(what: str) -> RoomError:
    return RoomError(ErrorCode.STORE_UNAVAILABLE, f"{what} unavailable, try again")


def conversation_of(user: str, room: str | None, with_user: str | None) -> str:
    """The conversation a frame names: ``room``, or ``user``'s direct one with ``with_user``."""
    return room if room is not None else direct(user, with_user or "")


def named_conversation(conversation: str, user: str) -> dict[str, str]:
    """``{"room": R}`` or ``{"with": U}``: how frames name ``conversation`` to ``user``."""
    if is_direct(conversation):
        return {"with": peer(conversation, user)}
    return {"room": conversation}


class Notifications:
    def __init__(
        self,
        settings: Settings,
        store: NotificationStore,
        access: ConversationAccess,
        presence: Presence,
        push_key: str | None,
    ) -> None:
        self._settings = settings
        self.store = store
        self._access = access
        self._presence = presence
        self.push_key = push_key  # the VAPID public key (None: no Web Push)

    async def mentions_for_send(
        self, sender: Identity, conversation: str, record: RoomRecord | None, text: str
    ) -> str | None:
        """Who a message of ``sender`` in ``conversation`` (``record``: its room's, if any)
        with ``text`` mentions, in the stored form (None: nobody). Raises RoomError."""
        names, here = named(text)
        if not names and not here:
            return None
        most = self._settings.mentions_per_message_max
        candidates = [name for name in names if name != sender.user][: most * 2]
        mentioned: list[str] = []
        if is_direct(conversation):
            mentioned = [name for name in candidates if name in members_of_direct(conversation)]
            here = False
        else:
            readers = [name for name in candidates if await self._may_read(name, conversation)]
            try:
                taking_part = await self.store.taking_part(conversation, readers)
            except StoreError:
                raise _unavailable("mentions") from None
            mentioned = [name for name in readers if name in taking_part]
            if here:
                await self._check_here(sender, conversation, record)
        return stored_form(mentioned[:most], here)

    async def _may_read(self, user: str, conversation: str) -> bool:
        try:
            await self._access.conversation(Identity(user), conversation)
        except RoomError as exc:
            if exc.code is ErrorCode.STORE_UNAVAILABLE:
                raise
            return False
        return True

    async def _check_here(self, sender: Identity, room: str, record: RoomRecord | None) -> None:
        present = await self._presence.of(room)
        if present.count <= self._settings.mention_here_open_max:
            return
        role = None if record is None else record.members.get(sender.user)
        if role not in (Role.OWNER, Role.ADMIN):
            raise RoomError(
                ErrorCode.FORBIDDEN,
                f"@here in a room with more than {self._settings.mention_here_open_max} people "
                "present is for its owner and admins: the message was not sent",
            )

    async def mentions_page(
        self,
        identity: Identity,
        before_ms: int | None,
        limit: int,
        hidden: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """The ``mentions`` frame's fields: ``identity``'s mentions it may read now, but for
        those by the users in ``hidden`` (app.access.hiding)."""
        user = identity.user
        cap = self._settings.unread_count_cap
        try:
            found = await self.store.mentions_of(user, before_ms, limit + 1, hidden)
            unread = await self.store.unread_mentions(user, cap, hidden)
        except StoreError:
            raise _unavailable("mentions") from None
        more = len(found) > limit
        found = found[:limit]
        readable = await self._access.visible(
            identity, {m.conversation for m in found} | set(unread)
        )
        listed = [
            {
                **named_conversation(m.conversation, user), "id": m.id, "user": m.user,
                "text": m.text, "ts": m.ts_ms, "unread": m.unread,
            }
            for m in found if m.conversation in readable
        ]  # fmt: skip
        total = sum(count for conversation, count in unread.items() if conversation in readable)
        return {"mentions": listed, "unread": total, "more": more}

    async def unread_mentions(self, identity: Identity) -> dict[str, int]:
        """Unread mentions per conversation (the inbox adds them; it asks the access
        decision itself)."""
        try:
            return await self.store.unread_mentions(identity.user, self._settings.unread_count_cap)
        except StoreError:
            raise _unavailable("mentions") from None

    async def level(self, identity: Identity, conversation: str) -> dict[str, Any]:
        """The ``notifications`` frame's fields for ``conversation``. Raises RoomError when
        the user may not read it."""
        await self._access.conversation(identity, conversation)
        try:
            chosen = await self.store.level_of(identity.user, conversation)
        except StoreError:
            raise _unavailable("notification levels") from None
        return self._described(identity.user, conversation, chosen)

    async def set_level(
        self, identity: Identity, conversation: str, level: str | None, mute_until: int | None
    ) -> dict[str, Any]:
        """Change ``identity``'s level and/or mute of ``conversation`` (``mute_until`` 0:
        unmute); its fields as :meth:`level`'s."""
        await self._access.conversation(identity, conversation)
        try:
            chosen = await self.store.level_of(identity.user, conversation)
            new_level = (
                LEVELS_BY_NAME[level]
                if level is not None
                else (chosen.level if chosen else default_level(conversation))
            )
            muted = chosen.muted_until_ms if chosen else None
            if mute_until is not None:
                muted = mute_until or None
            await self.store.set_level(identity.user, conversation, new_level, muted)
        except StoreError:
            raise _unavailable("notification levels") from None
        return self._described(
            identity.user, conversation, LevelSetting(conversation, new_level, muted)
        )

    async def levels(self, identity: Identity) -> list[dict[str, Any]]:
        """Every level ``identity`` chose, of conversations it may read now."""
        try:
            chosen = await self.store.levels(identity.user, _LEVELS_LISTED)
        except StoreError:
            raise _unavailable("notification levels") from None
        readable = await self._access.visible(identity, [c.conversation for c in chosen])
        return [
            self._described(identity.user, c.conversation, c)
            for c in chosen
            if c.conversation in readable
        ]

    @staticmethod
    def _described(user: str, conversation: str, chosen: LevelSetting | None) -> dict[str, Any]:
        level: Level = chosen.level if chosen else default_level(conversation)
        muted = chosen.muted_until_ms if chosen else None
        if muted is not None and muted <= time.time() * 1000:
            muted = None
        return {
            **named_conversation(conversation, user), "level": LEVEL_NAMES[level],
            "mute_until": muted,
        }  # fmt: skip

    async def subscribe(self, identity: Identity, endpoint: str, p256dh: str, auth: str) -> None:
        """Keep a Web Push subscription of ``identity``. Raises RoomError (``forbidden``: an
        endpoint that is not an allowed push service; ``no_store``: Web Push is off)."""
        if self.push_key is None:
            raise RoomError(ErrorCode.NO_STORE, "Web Push is off on this server")
        refusal = subscription_refusal(endpoint, self._settings.push_services)
        if refusal is not None:
            raise RoomError(ErrorCode.FORBIDDEN, f"push endpoint refused: {refusal}")
        try:
            Subscription(endpoint, p256dh, auth)
        except ValueError as exc:
            raise RoomError(ErrorCode.BAD_FRAME, f"push subscription keys: {exc}") from None
        try:
            await self.store.subscribe(
                identity.user, endpoint, p256dh, auth, int(time.time() * 1000),
                self._settings.push_subscriptions_per_user_max,
            )  # fmt: skip
        except StoreError:
            raise _unavailable("push subscriptions") from None

    async def unsubscribe(self, identity: Identity, endpoint: str) -> None:
        try:
            await self.store.unsubscribe(endpoint, identity.user)
        except StoreError:
            raise _unavailable("push subscriptions") from None
