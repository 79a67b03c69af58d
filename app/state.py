"""ChatState: the per-worker objects the routes share, built by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.access.auth import Authenticator
from app.access.conversations import ConversationAccess
from app.access.hiding import HiddenUsers
from app.access.lockout import FailedLogins
from app.access.origin import OriginPolicy
from app.access.pending import PendingAuth
from app.access.quotas import Quotas
from app.broker import Broker
from app.conversations.history import ConversationHistory
from app.conversations.rooms import RoomDirectory
from app.files.service import Files
from app.moderation.hook import ModerationHook
from app.moderation.reports import Reports
from app.notify.service import Notifications
from app.ops.metrics import Metrics
from app.ops.roster import Roster
from app.ops.tracing import Tracing
from app.presence import Presence
from app.previews.service import LinkPreviews
from app.settings import Settings
from app.sockets.hub import Hub
from app.sockets.rebalance import Rebalancer
from app.store.running import RunningStore
from app.transport.flusher import Flusher
from app.transport.stream_socket import Streams


@dataclass(slots=True)
class ChatState:
    settings: Settings
    broker: Broker
    hub: Hub
    presence: Presence
    metrics: Metrics
    quotas: Quotas
    origins: OriginPolicy
    authenticator: Authenticator | None  # None unless in jwt mode
    pending_auth: PendingAuth  # sockets waiting to send their token
    history: ConversationHistory  # the broker's history, continued into the store
    store: RunningStore | None  # None without CHAT_DATABASE_URL
    rooms: RoomDirectory  # private rooms, members and roles (public-only without a store)
    flusher: Flusher = field(default_factory=Flusher)  # writes every connection's outbox
    # Attached files (None: CHAT_FILE_STORAGE=off, or no store).
    files: Files | None = None
    # Mentions, levels and push subscriptions (None: no store, or CHAT_NOTIFICATIONS=false).
    notifications: Notifications | None = None
    # Link previews (None: CHAT_PREVIEWS=false).
    previews: LinkPreviews | None = None
    # Decides users' messages and edits before they are published (None: no hook).
    moderation: ModerationHook | None = None
    # Reports of messages and their queue (None: no store).
    reports: Reports | None = None
    # Traces of messages' paths (None: CHAT_TRACING_ENDPOINT unset, tracing off).
    tracing: Tracing | None = None
    # The census of workers (and, with Redis, the shedding after a scale-out).
    rebalancer: Rebalancer = field(init=False)
    # Who is connected where, across workers (the admin API).
    roster: Roster = field(init=False)
    # The HTTP fallback transport's streams held by this worker, and its POSTs' routing
    # (app.sockets.stream).
    streams: Streams = field(init=False)
    # Failed attempts at the admin and service tokens (app.web.bearer), from the settings.
    failed_logins: FailedLogins = field(init=False)
    # Who may do what to which conversation (every path asks it).
    access: ConversationAccess = field(init=False)
    # Whom each user mutes and blocks (every path that shows messages asks it).
    hidden: HiddenUsers = field(init=False)

    def __post_init__(self) -> None:
        self.access = ConversationAccess(self.rooms, self.quotas)
        self.hidden = HiddenUsers(
            self.store.hidden if self.store is not None else None,
            self.broker, self.hub, self.settings,
        )  # fmt: skip
        self.streams = Streams(self.broker, self.settings.redis_timeout_s)
        self.rebalancer = Rebalancer(self.hub, self.broker, self.settings, self.metrics)
        self.roster = Roster(self.hub, self.broker, self.settings.redis_timeout_s)
        self.failed_logins = FailedLogins.of(self.settings)
