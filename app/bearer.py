"""The bearer-token guard of the operators' HTTP APIs: the moderation API (``/admin``) and
the backend API (``/api/v1``). Each takes one static token from the settings; unset, the API
answers 404 as if it did not exist. Tokens are compared in constant time, and an address
that fails too often is locked out for a while (:mod:`app.access.lockout`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Header, HTTPException, Request
from pydantic import SecretStr

from app.access.lockout import check_bearer
from app.settings import Settings
from app.state import ChatState

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
        refused = check_bearer(
            state.failed_logins, address, authorization, token.get_secret_value(), time.monotonic()
        )
        if refused == 429:
            retry_after = {"Retry-After": str(int(state.failed_logins.window_s))}
            raise HTTPException(
                429, "too many failed attempts: try again later", headers=retry_after
            )
        if refused is not None:
            logger.warning("%s: failed login", api, extra={"ip": address})
            raise HTTPException(
                401, f"the {api}'s bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )
        return state

    return authorized
