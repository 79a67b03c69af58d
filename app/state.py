"""ChatState: the per-worker objects the routes share, built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.auth import Authenticator
from app.broker import Broker
from app.flusher import Flusher
from app.hub import Hub
from app.lockout import FAILURE_WINDOW_S, MAX_FAILURES, FailedLogins
from app.metrics import Metrics
from app.origin import OriginPolicy
from app.pending import PendingAuth
from app.quotas import Quotas
from app.settings import Settings


@dataclass(slots=True)
class ChatState:
    settings: Settings
    broker: Broker
    hub: Hub
    metrics: Metrics
    quotas: Quotas
    origins: OriginPolicy
    authenticator: Authenticator | None  # None unless in jwt mode
    pending_auth: PendingAuth  # sockets waiting to send their token
    failed_logins: FailedLogins = field(
        default_factory=lambda: FailedLogins(MAX_FAILURES, FAILURE_WINDOW_S)
    )
    flusher: Flusher = field(default_factory=Flusher)  # writes every connection's outbox
