"""Who may open a chat socket: the user's identity (``?name=``, or a verified JWT from
``?token=`` or a first ``auth`` frame) and the cross-server quotas (bans, connections per
user, new connections per address).

The Origin check comes before (it needs no socket: :mod:`app.origin`); everything here runs on
an accepted socket, so a refusal is a close code the client can act on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from dataclasses import dataclass

from starlette.websockets import WebSocket

from app.auth import AuthError, Identity
from app.connection import Connection
from app.errors import CloseCode, FrameError
from app.protocol import USER_PATTERN, Auth, parse_client_frame
from app.quotas import Refusal
from app.state import ChatState

logger = logging.getLogger(__name__)
_USER = re.compile(USER_PATTERN)


@dataclass(frozen=True, slots=True)
class Refused:
    code: CloseCode
    reason: str


async def identify(ws: WebSocket, state: ChatState) -> Identity | Refused | None:
    """The connection's identity; a refusal (4001, or 1008 for a bad ``?name=``); None when
    the client left before saying who it is."""
    authenticator = state.authenticator
    if authenticator is None:
        name = ws.query_params.get("name") or f"guest-{secrets.token_hex(3)}"
        if not _USER.fullmatch(name):
            return Refused(CloseCode.POLICY_VIOLATION, "invalid name")
        return Identity(name)
    token = ws.query_params.get("token")
    if not token:
        try:
            async with asyncio.timeout(state.settings.auth_timeout_s):
                message = await ws.receive()
        except TimeoutError:
            return Refused(CloseCode.AUTH_FAILED, "no auth frame in time")
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
    """Count ``conn`` against its user's and address's quotas, or say why it may not open."""
    refusal = await state.quotas.admit(conn.user, conn.id, conn.ip)
    if refusal is None:
        return None
    return Refused(_REFUSALS[refusal], refusal.value)
