"""Who may open a chat socket: the user's identity (a verified JWT from ``?token=`` or a first
``auth`` frame; a guest identity from ``?name=`` and ``?guest=``; or, in ``names`` mode,
whatever ``?name=`` says) and the cross-server quotas (bans, connections per user, new
connections per address).

The Origin check comes before (it needs no socket: :mod:`app.access.origin`); everything here
runs on an accepted socket, so a refusal is a close code the client can act on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from dataclasses import dataclass

from starlette.websockets import WebSocket

from app.access.auth import AuthError, Identity
from app.access.guest import GuestError, identify_guest
from app.access.quotas import Refusal
from app.connection import Connection
from app.errors import CloseCode, FrameError
from app.protocol import USER_PATTERN, Auth, parse_client_frame
from app.state import ChatState

logger = logging.getLogger(__name__)
_USER = re.compile(USER_PATTERN)


@dataclass(frozen=True, slots=True)
class Refused:
    code: CloseCode
    reason: str


async def identify(ws: WebSocket, state: ChatState) -> Identity | Refused | None:
    """The connection's identity (see ``CHAT_AUTH_MODE``); a refusal (4001, or 1008 for a bad
    ``?name=`` or ``?guest=``); None when the client left before saying who it is."""
    mode = state.settings.auth_mode
    if mode == "guest":
        try:
            guest = identify_guest(ws.query_params.get("name"), ws.query_params.get("guest"))
        except GuestError as exc:
            return Refused(CloseCode.POLICY_VIOLATION, str(exc))
        return Identity(guest.user, guest_key=guest.new_key)
    authenticator = state.authenticator
    if mode == "names" or authenticator is None:
        name = ws.query_params.get("name") or f"guest-{secrets.token_hex(3)}"
        if not _USER.fullmatch(name):
            return Refused(CloseCode.POLICY_VIOLATION, "invalid name")
        return Identity(name)
    token = ws.query_params.get("token")
    if not token:
        ip = ws.client.host if ws.client else None
        full = state.pending_auth.enter(ip)
        if full is not None:
            return Refused(full.code, full.reason)
        try:
            async with asyncio.timeout(state.settings.auth_timeout_s):
                message = await ws.receive()
        except TimeoutError:
            return Refused(CloseCode.AUTH_FAILED, "no auth frame in time")
        finally:
            state.pending_auth.leave(ip)
        if message["type"] == "websocket.disconnect":
            return None
        try:
            frame = parse_client_frame(message.get("text") or "")
        except FrameError:
            frame = None
        if not isinstance(frame, Auth):
            return Refused(CloseCode.AUTH_FAILED, 'authenticate first: {"type":"auth","token":…}')
        token = frame.token
    try:
        return authenticator.verify(token)
    except AuthError as exc:
        return Refused(CloseCode.AUTH_FAILED, str(exc)[:120])


_REFUSALS = {
    Refusal.BANNED: CloseCode.FORBIDDEN,
    Refusal.TOO_MANY_CONNECTIONS: CloseCode.TOO_MANY_CONNECTIONS,
    Refusal.IP_RATE: CloseCode.TOO_MANY_CONNECTIONS,
}


async def admit(state: ChatState, conn: Connection) -> Refused | None:
    """Count ``conn`` against its user's quotas, or say why it may not open (its address was
    charged at the upgrade: :func:`admit_address`)."""
    refusal = await state.quotas.admit(conn.user, conn.id, None)
    if refusal is None:
        return None
    return Refused(_REFUSALS[refusal], refusal.value)


async def admit_address(state: ChatState, ip: str | None) -> Refused | None:
    """Charge a new socket to its address's connection rate, before anything else (4029)."""
    if await state.quotas.admit_address(ip):
        return None
    return Refused(CloseCode.TOO_MANY_CONNECTIONS, "too many new connections from this address")
