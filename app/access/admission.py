"""Who may open a chat socket: the user's identity (a verified JWT from a first ``auth`` frame
or, from old clients, ``?token=``; a guest identity from a first ``auth`` frame with ``name``
and ``guest`` or, from old clients, ``?name=`` and ``?guest=``; or, in ``names`` mode, whatever
the name says) and the cross-server quotas (bans, connections per user, new connections per
address).

Credentials belong in the first frame, not in the URL: a URL is written to access logs,
proxies' logs and the browser console's connection errors. A client says it sends them so
with ``?auth=frame`` (hubbub.js always does); in ``jwt`` mode a URL without ``?token=`` says
the same. The server then sends nothing and waits ``CHAT_AUTH_TIMEOUT_S`` for the ``auth``
frame (4001 without one). The log formatter redacts the credentials old clients still put in
the URL (:func:`app.ops.logs.redact`).

The Origin check comes before (it needs no socket: :mod:`app.access.origin`); everything here
runs on an accepted socket, so a refusal is a close code the client can act on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Final

import orjson
from starlette.websockets import WebSocket

from app.access.auth import AuthError, Identity
from app.access.guest import GuestError, identify_guest
from app.access.quotas import Refusal
from app.errors import CloseCode, FrameError
from app.protocol import USER_PATTERN, Auth, parse_client_frame
from app.sockets.connection import Connection
from app.state import ChatState
from app.transport.stream_socket import StreamSocket
from app.transport.uvicorn_seam import received_already

logger = logging.getLogger(__name__)
_USER = re.compile(USER_PATTERN)
# ``?auth=frame``: the client sends who it is in its first frame, not in the URL.
AUTH_IN_FRAME: Final = "frame"
_AUTH_FIRST_GUEST: Final = 'authenticate first: {"type":"auth","name":…,"guest":…}'


@dataclass(frozen=True, slots=True)
class Refused:
    code: CloseCode
    reason: str


async def identify(ws: WebSocket | StreamSocket, state: ChatState) -> Identity | Refused | None:
    """The connection's identity (see ``CHAT_AUTH_MODE``); a refusal (4001, or 1008 for a bad
    name or guest key); None when the client left before saying who it is."""
    mode, query = state.settings.auth_mode, ws.query_params
    authenticator = state.authenticator
    if mode == "guest" or mode == "names" or authenticator is None:
        name, key = query.get("name"), query.get("guest")
        if query.get("auth") == AUTH_IN_FRAME:
            first = await _first_frame(ws, state)
            if first is None or isinstance(first, Refused):
                return first
            credentials = _guest_credentials(first)
            if credentials is None:
                return Refused(CloseCode.AUTH_FAILED, _AUTH_FIRST_GUEST)
            # The frame's values, or the URL's (a name may ride there: it is no secret).
            name, key = credentials[0] or name, credentials[1] or key
        if mode == "guest":
            try:
                guest = identify_guest(name, key)
            except GuestError as exc:
                return Refused(CloseCode.POLICY_VIOLATION, str(exc))
            return Identity(guest.user, guest_key=guest.new_key)
        name = name or f"guest-{secrets.token_hex(3)}"
        if not _USER.fullmatch(name):
            return Refused(CloseCode.POLICY_VIOLATION, "invalid name")
        return Identity(name)
    token = query.get("token")
    if not token:
        first = await _first_frame(ws, state)
        if first is None or isinstance(first, Refused):
            return first
        try:
            frame = parse_client_frame(first)
        except FrameError:
            frame = None
        if not isinstance(frame, Auth):
            return Refused(CloseCode.AUTH_FAILED, 'authenticate first: {"type":"auth","token":…}')
        token = frame.token
    try:
        return authenticator.verify(token)
    except AuthError as exc:
        return Refused(CloseCode.AUTH_FAILED, str(exc)[:120])


async def _first_frame(ws: WebSocket | StreamSocket, state: ChatState) -> str | Refused | None:
    """The text of the client's first frame ("" for a binary one), waited for at most
    ``CHAT_AUTH_TIMEOUT_S`` (4001 after that); None when the client left first. The socket
    counts as waiting to authenticate meanwhile (:class:`app.access.pending.PendingAuth`).
    A frame that is there already is read without setting a timer (through Redis it usually
    is: it comes while the upgrade's address is charged there)."""
    ip = ws.client.host if ws.client else None
    full = state.pending_auth.enter(ip)
    if full is not None:
        return Refused(full.code, full.reason)
    try:
        if isinstance(ws, WebSocket) and received_already(ws):
            message = await ws.receive()  # no wait: nothing to time
        else:
            async with asyncio.timeout(state.settings.auth_timeout_s):
                message = await ws.receive()
    except TimeoutError:
        return Refused(CloseCode.AUTH_FAILED, "no auth frame in time")
    finally:
        state.pending_auth.leave(ip)
    if message["type"] == "websocket.disconnect":
        return None
    return str(message.get("text") or "")


def _guest_credentials(text: str) -> tuple[str | None, str | None] | None:
    """``name`` and ``guest`` (the key) of a first frame ``{"type":"auth",...}`` in ``guest``
    and ``names`` mode (either may be absent: a guest without a key gets a new one); None if
    the frame is not such a frame. The values are checked by the caller, as the URL's are."""
    try:
        frame = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(frame, dict) or frame.get("type") != "auth":
        return None
    name, key = frame.get("name"), frame.get("guest")
    if not (name is None or isinstance(name, str)) or not (key is None or isinstance(key, str)):
        return None
    return name, key


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
