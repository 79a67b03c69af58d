"""The bearer-token guard of the operators' HTTP APIs: the moderation API (``/admin``) and
the backend API (``/api/v1``). Each takes one static token from the settings; unset, the API
answers 404 as if it did not exist. Tokens are compared in constant time, and failures lock
out the client's address, the proxy's that forwarded it, and past a budget every address for
a while (:mod:`app.access.lockout`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Header, HTTPException, Request
from pydantic import SecretStr

from app.access.lockout import LOCKED_OUT, check_bearer
from app.settings import Settings
from app.state import ChatState
from app.transport.uvicorn_seam import transport_peer

logger = logging.getLogger(__name__)


def bearer_guard(
    token_of: Callable[[Settings], SecretStr | None], api: str
) -> Callable[..., ChatState]:
    """A FastAPI dependency that admits requests bearing ``token_of(settings)`` and returns
    the worker's state; ``api`` names the API in the answers and the logs."""

    def authorized(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> ChatState:
        state: ChatState = request.app.state.chat
        token = token_of(state.settings)
        if token is None:
            raise HTTPException(404, "Not Found")
        address = request.client.host if request.client else None
        # The connection's own peer: a trusted proxy's address when it wrote ``address`` from
        # X-Forwarded-For, which a client of that proxy can fill with anything.
        peer = transport_peer(request.scope)
        addresses = (address,) if peer is None or peer == address else (address, peer)
        now = time.monotonic()
        refused = check_bearer(
            state.failed_logins, addresses, authorization, token.get_secret_value(), now
        )
        if refused == LOCKED_OUT:
            wait_s = math.ceil(state.failed_logins.retry_after_s(addresses, now))
            raise HTTPException(
                429,
                "too many failed attempts: try again later",
                headers={"Retry-After": str(max(wait_s, 1))},
            )
        if refused is not None:
            logger.warning("%s: failed login", api, extra={"ip": address, "peer": peer})
            raise HTTPException(
                401, f"the {api}'s bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )
        return state

    return authorized
