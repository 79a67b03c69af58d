"""Broker: where every published message goes, and where each worker's Hub hears it from.

The interface is a :class:`typing.Protocol` so mypy checks each implementation structurally.
:func:`create_broker` picks the implementation from the settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from app.settings import Settings

OnMessage = Callable[[str, bytes], None]
"""Called with ``(room, payload)`` for each message of a subscribed room; must not block."""


@dataclass(frozen=True, slots=True)
class Published:
    """What :meth:`Broker.publish` assigned: the message id, and whether it was a retry."""

    id: int
    duplicate: bool = False


class Broker(Protocol):
    """Publish/subscribe for rooms, shared by every worker that uses the same backend.

    Contract:
    - ``publish`` gives each message an id that increases within its room, and delivers the
      encoded ``message`` frame to ``on_message`` of every worker subscribed to that room,
      the publisher's own included, in id order. Every subscriber of a room sees the same order.
    - Delivery is at most once: a message published while a worker is disconnected from the
      backend does not reach it live.
    - A ``publish`` carrying a ``cid`` the same user already used in that room within the dedup
      window returns the first message's id with ``duplicate=True`` and delivers nothing.
    - ``subscribe``/``unsubscribe`` take effect in call order. The Hub reference-counts rooms,
      so each is called once per room transition.
    - Every method but ``ready`` raises :class:`~app.errors.BrokerUnavailable` when the backend
      cannot be reached.
    """

    @property
    def ready(self) -> bool:
        """True while the broker can publish and deliver."""
        ...

    async def start(self, on_message: OnMessage) -> None: ...

    async def stop(self) -> None: ...

    async def subscribe(self, room: str) -> None: ...

    async def unsubscribe(self, room: str) -> None: ...

    async def publish(
        self, room: str, user: str, text: str, cid: str | int | None
    ) -> Published: ...


def create_broker(settings: Settings) -> Broker:
    """The broker the settings ask for (the embedded memory broker for now)."""
    from app.broker.memory import MemoryBroker

    return MemoryBroker(settings.dedup_ttl_s, settings.dedup_max_entries)
