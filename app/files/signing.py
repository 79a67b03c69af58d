"""Signed URLs for ``local`` file storage: what a URL allows (method, object, its query) and
until when, under an HMAC only this deployment's workers know.

Contract: :meth:`UrlSigner.verify` is true only for a query :meth:`UrlSigner.sign` signed for
the same method and key, unchanged, before its ``exp`` (Unix seconds). The secret is
``CHAT_FILE_URL_SECRET``, or else a random one kept in ``CHAT_FILE_DIR/.url-secret``, made
once by whichever worker comes first (every worker of the host reads the same).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping

from app.settings import Settings

SECRET_FILE = ".url-secret"


class UrlSigner:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def for_directory(cls, settings: Settings) -> UrlSigner:
        """The signer of the settings' secret, or of the one kept in the file directory."""
        if settings.file_url_secret is not None:
            return cls(settings.file_url_secret.get_secret_value().encode())
        directory = settings.files_directory
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SECRET_FILE
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(descriptor, "w") as file:
                file.write(secrets.token_hex(32))
        # Another worker may have made the file an instant ago: wait for its 64 characters.
        deadline = time.monotonic() + 5
        while len(secret := path.read_text().strip()) < 64 and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(secret) < 64:
            raise RuntimeError(f"{path} holds no URL secret: delete it and start again")
        return cls(secret.encode())

    def sign(self, method: str, key: str, query: Mapping[str, str]) -> str:
        """The signature of ``query`` (without ``sig``) for ``method`` on object ``key``."""
        message = "\n".join(
            [method, key, *(f"{k}={v}" for k, v in sorted(query.items()) if k != "sig")]
        )
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    def verify(self, method: str, key: str, query: Mapping[str, str]) -> bool:
        """Whether ``query`` carries a valid ``sig`` for ``method`` on ``key``, unexpired."""
        signature = query.get("sig", "")
        try:
            expires = int(query.get("exp", ""))
        except ValueError:
            return False
        return expires >= time.time() and hmac.compare_digest(
            signature, self.sign(method, key, query)
        )
