"""``make attack`` (``python -m loadtest.attack``): the security counterpart of ``make chaos``.
Real deployments, a private room full of marker texts, and every identity that may not read
it trying every path into it; a checker (:func:`check`, a pure function) says, cell by cell
(an identity on a path), whether anything leaked.

**Deployments**, each started fresh on 127.0.0.1 and free ports, in a temporary directory, and
stopped by PID at the end (also on failure or Ctrl-C):

1. ``redis-postgres``: two gunicorn instances (``deploy/gunicorn.conf.py``, one worker each)
   on one ``redis-server``, the store in a PostgreSQL cluster of the run's own
   (``tests.processes.PostgresServer``: initdb as an unprivileged user when run as root),
   ``CHAT_AUTH_MODE=jwt`` with an HS256 secret, ``CHAT_SERVICE_TOKEN`` and
   ``CHAT_ADMIN_TOKEN`` set. Requests alternate between the instances: a change is made
   through one and read through the other, where the cached state lies (every cell is probed
   on both).
2. ``redis-sqlite``: the same with SQLite (``CHAT_DATABASE_URL=sqlite:///…``), on one
   instance: SQLite serves one process (docs/operations.md, "The store").
3. ``embedded``: ``python -m app`` as ``make run`` runs it (memory broker, SQLite, guest
   mode), restarted (SIGTERM, then started again on its port) in the middle of the scenario:
   what the SQLite file holds (the room, its members, the removal, the messages) must hold
   across the restart. Bans live in the process with the memory broker (docs/security.md):
   the ban is placed after the restart.

Per-user limits are out of the way (connections, messages, joins, history reads: the limits
are not what this checks).

**The scenario**, per deployment: a *pre-registered outsider* sends
``{"type":"read","room":R,"id":1}`` for the room name before anyone made it; the *owner*
creates R private (``create``, with a title and a topic that are markers too), invites a
*member* and the users who become the identities below, and everyone posts messages holding
the room's marker (``MARKER-…``); the owner edits one, the member reacts to one; the owner and
the member exchange direct messages with a marker of their own (``DMMARK-…``). Then:
the *removed* member (joined on one instance, posted and read there, so that instance caches
the room) is removed by the owner through the other; the *banned* member is banned through
``PUT /admin/users/{user}/ban``; the *narrowed* member sends a fresh token whose ``rooms``
claim excludes R (``auth`` frame; it uses that token from then on); the *expired* member's
token runs out (its socket is closed 4002; later it tries an expired token). The *outsider*
was never a member; the *namesake* (guest mode) is a guest whose display name is the
member's. The *service* (``CHAT_SERVICE_TOKEN``, the backend API) is the control: it must
see the markers and the title, which proves they are there to be leaked. So is the member.

**Paths** (each identity on each path is a cell; the real protocol over WebSockets, and HTTP):
``connect`` (``hello`` and the inbox pushed after it), ``join``, ``join since``,
``history before``, ``history after``, ``read``, ``send``, ``edit``, ``delete``, ``react``
(on a marker message's id), ``typing``, ``describe``, ``invite`` (of a new user), ``remove``
(of a member, and of a user who is not one), ``rooms``, ``inbox``, ``dm history`` (the
``history`` frame ``with`` the member), ``upload`` (a file into the room), ``file`` (the
links to a file of the room, whose name and bytes hold the marker), ``report`` (of a marker
message: the answer holds its text), ``mentions`` (the owner
mentioned every identity in the room while they were members), ``notifications`` (the
level of the room), ``live`` (what reaches
the identity's sockets: one joined before its removal, ban, narrowing or expiry, and a fresh
one per instance that tries to join, while the owner and the member keep posting, editing,
reacting, typing, describing the room, adding and removing someone, and writing to each
other; for the removed member,
after the removal's own notice: ``left`` and the ``member`` frame naming it and who removed
it), ``GET /rooms/{room}/messages``, ``GET /inbox``, ``GET /dms/{peer}/messages``,
``GET /search``, ``GET /mentions``; for the
service, ``GET /api/v1/rooms/{room}`` and ``GET /api/v1/rooms/{room}/messages`` (the backend
API with a user's token is left out: its failed attempts would lock the address out, and
tests/test_backend.py covers it).
Webhooks are not covered.

**What a leak is** (:func:`check`): for an identity that may not read the room, any byte of
any answer or pushed frame holding the room's marker, its title or topic, or a member's user
id (other than its own and the names it supplied itself); the DM's marker reaching anyone but
its two users. *Existence oracle*: for the identities that never were members (outsider,
pre-registered outsider, namesake), the answers to the real room (frame type, error code and
message, or HTTP status and body, with the room's name replaced by a placeholder) must equal
the answers to a never-used name of the same shape, on every path naming the room but
``join`` and ``join since``: rooms share one namespace, so a private room's ``join`` is
refused where an unused name's creates a public room, and ``create`` of a taken name answers
``exists``, by design. *Membership oracle*: for every identity that may not read the room,
``remove`` of a member and of a non-member must answer alike (the user names replaced). A
member's or the service's cell on a reading path must *see* the markers (else ``BLIND``: the
matrix would prove nothing).

Exit status: 0 when every cell passes, 1 when a cell fails (the table, then each failure
with the frame that leaked), 2 when a deployment could not be set up. ``--json PATH`` writes
the whole report. ``--smoke`` (the test suite runs it): ``redis-postgres`` and ``embedded``
only, each cell probed on one instance (alternating), under a minute and a half; every
identity and every path is covered at least once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jwt
import orjson
import uvloop
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from app.access.guest import guest_user
from loadtest.chaos import _die_with_parent
from tests.processes import ROOT, AppProcess, PostgresServer, RedisServer

# -- the checker (pure: no I/O) ------------------------------------------------------------------

LEAK = "leak"
EXISTENCE = "existence oracle"
MEMBERSHIP = "membership oracle"
BLIND = "blind"
ERROR = "error"
# The worst finding names a failed cell in the table.
SEVERITY = (LEAK, MEMBERSHIP, EXISTENCE, BLIND, ERROR)
SYMBOL = {LEAK: "LEAK", MEMBERSHIP: "M-ORACLE", EXISTENCE: "E-ORACLE", BLIND: "BLIND",
          ERROR: "ERROR"}  # fmt: skip
ROOM_PLACEHOLDER = "<ROOM>"
USER_PLACEHOLDER = "<USER>"
REMOVE_MEMBER = "remove member"
REMOVE_NON_MEMBER = "remove non-member"
NO_ANSWER = "no answer within"  # what Socket.exchange records when the pong never came


@dataclass(frozen=True)
class Secrets:
    """What the room and the DM hold: what must not leak, and what the controls must see.
    ``room_texts`` and ``dm_texts`` map a kind (``marker``, ``title``...) to its text;
    ``members`` maps each user id that was ever a member to who it is."""

    room: str
    room_texts: dict[str, str]
    dm_texts: dict[str, str]
    members: dict[str, str]

    def text(self, kind: str) -> str:
        return {**self.room_texts, **self.dm_texts}[kind]


@dataclass(frozen=True)
class Exchange:
    """One request (``label``) and everything that came back for it, raw, in order: frames as
    the server sent them (one JSON object each), ``close CODE REASON`` when the socket was
    closed, ``HTTP STATUS BODY`` for HTTP."""

    label: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Observation:
    """What one identity got on one path through one instance: the ``exchanges`` about the
    private room, and for the existence oracle the same requests about ``control_room``, a
    never-used name (``control``; None: not compared). ``supplied``: the names the identity
    put in its requests itself (a room, users): they may come back."""

    identity: str
    path: str
    instance: int
    own: str
    exchanges: tuple[Exchange, ...]
    supplied: tuple[str, ...] = ()
    control: tuple[Exchange, ...] | None = None
    control_room: str = ""
    error: str | None = None


@dataclass(frozen=True)
class Policy:
    """What an identity may get on a path: read the room, the DM; ``stranger``: never a
    member (the existence oracle applies); ``must_see``: kinds of secret (``Secrets``) the
    cell must see, a control's proof that the markers are there."""

    reads_room: bool
    reads_dm: bool
    stranger: bool = False
    must_see: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finding:
    """Something wrong: its ``kind`` (``LEAK``...), on which instance, ``what`` (what leaked,
    or which request answered differently) and ``detail`` (the evidence)."""

    kind: str
    instance: int
    what: str
    detail: str


def _excerpt(text: str, needle: str, width: int = 70) -> str:
    at = text.find(needle)
    start, end = max(0, at - width), min(len(text), at + len(needle) + width)
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")


def _normalized(
    exchanges: Iterable[Exchange], replace: dict[str, str]
) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for exchange in exchanges:
        answers = []
        for answer in exchange.answers:
            for old, new in replace.items():
                answer = answer.replace(old, new)
            answers.append(answer)
        out[exchange.label] = tuple(answers)
    return out


def check(observation: Observation, policy: Policy, secrets: Secrets) -> list[Finding]:
    """Everything wrong with one observation (empty: the cell passes on that instance)."""
    at = observation.instance
    if observation.error is not None:
        return [Finding(ERROR, at, "the probe", observation.error)]
    findings: list[Finding] = []
    for exchange in (*observation.exchanges, *(observation.control or ())):
        if any(answer.startswith(NO_ANSWER) for answer in exchange.answers):
            findings.append(Finding(ERROR, at, exchange.label, "the server did not answer"))
    answered = [
        (exchange.label, answer)
        for exchange in (*observation.exchanges, *(observation.control or ()))
        for answer in exchange.answers
    ]
    forbidden: dict[str, str] = {}  # text -> what it is
    if not policy.reads_room:
        forbidden |= {text: f"the room's {kind}" for kind, text in secrets.room_texts.items()}
        allowed = {observation.own, *observation.supplied}
        forbidden |= {
            user: f"the user id of the {who}"
            for user, who in secrets.members.items()
            if user not in allowed
        }
    if not policy.reads_dm:
        forbidden |= {text: f"the DM's {kind}" for kind, text in secrets.dm_texts.items()}
    for text, what in forbidden.items():
        hit = next(((label, a) for label, a in answered if text in a), None)
        if hit is not None:
            findings.append(Finding(LEAK, at, what, f"({hit[0]}) {_excerpt(hit[1], text)}"))
    if policy.stranger and observation.control is not None:
        real = _normalized(observation.exchanges, {secrets.room: ROOM_PLACEHOLDER})
        unused = _normalized(observation.control, {observation.control_room: ROOM_PLACEHOLDER})
        for label, answers in real.items():
            if unused.get(label) != answers:
                findings.append(
                    Finding(
                        EXISTENCE, at, label,
                        f"the private room answers {list(answers)}, a never-used name "
                        f"{list(unused.get(label, ()))}",
                    )
                )  # fmt: skip
    if not policy.reads_room:
        labels = {exchange.label for exchange in observation.exchanges}
        if {REMOVE_MEMBER, REMOVE_NON_MEMBER} <= labels:
            users = {u: USER_PLACEHOLDER for u in observation.supplied if u != secrets.room}
            both = _normalized(observation.exchanges, {secrets.room: ROOM_PLACEHOLDER} | users)
            if both[REMOVE_MEMBER] != both[REMOVE_NON_MEMBER]:
                findings.append(
                    Finding(
                        MEMBERSHIP, at, "remove",
                        f"remove of a member answers {list(both[REMOVE_MEMBER])}, of a "
                        f"non-member {list(both[REMOVE_NON_MEMBER])}",
                    )
                )  # fmt: skip
    for kind in policy.must_see:
        text = secrets.text(kind)
        if not any(text in answer for _, answer in answered):
            seen = [a[:120] for _, a in answered][:4]
            findings.append(Finding(BLIND, at, f"the {kind}", f"not seen; got {seen}"))
    return findings


@dataclass
class Cell:
    """An identity on a path, over the instances it was probed on."""

    identity: str
    path: str
    findings: list[Finding] = field(default_factory=list)
    instances: list[int] = field(default_factory=list)
    applicable: bool = True
    observed: list[Observation] = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.applicable:
            return "n/a"
        kinds = {finding.kind for finding in self.findings}
        return next((kind for kind in SEVERITY if kind in kinds), "ok")

    @property
    def passed(self) -> bool:
        return self.status in ("ok", "n/a")


# -- identities and paths ---------------------------------------------------------------------

MEMBER, REMOVED, BANNED, NARROWED, EXPIRED = "member", "removed", "banned", "narrowed", "expired"
OUTSIDER, PREREGISTERED, NAMESAKE, SERVICE = "outsider", "pre-registered", "namesake", "service"
IDENTITIES = (MEMBER, REMOVED, BANNED, NARROWED, EXPIRED, OUTSIDER, PREREGISTERED, NAMESAKE,
              SERVICE)  # fmt: skip
STRANGERS = (OUTSIDER, PREREGISTERED, NAMESAKE)
JWT_ONLY = (NARROWED, EXPIRED)
GUEST_ONLY = (NAMESAKE,)

CONNECT, LIVE = "connect", "live"
HTTP_MESSAGES = "GET /rooms/{room}/messages"
HTTP_INBOX = "GET /inbox"
HTTP_DM = "GET /dms/{peer}/messages"
HTTP_SEARCH = "GET /search?q=owner+message&order=best&limit=50"
HTTP_MENTIONS = "GET /mentions?limit=50"
API_ROOM = "GET /api/v1/rooms/{room}"
API_MESSAGES = "GET /api/v1/rooms/{room}/messages"
FRAME_PATHS = ("join", "join since", "history before", "history after", "read", "send", "edit",
               "delete", "react", "typing", "describe", "invite", "remove", "rooms", "directory",
               "inbox", "dm history", "search", "search room", "upload", "file", "mentions",
               "notifications", "report")  # fmt: skip
HTTP_PATHS = (HTTP_MESSAGES, HTTP_INBOX, HTTP_DM, HTTP_SEARCH, HTTP_MENTIONS)
API_PATHS = (API_ROOM, API_MESSAGES)
PATHS = (CONNECT, *FRAME_PATHS, LIVE, *HTTP_PATHS, *API_PATHS)
# Paths that name the room, where a stranger's answers are compared with a never-used name's
# (not join: rooms share one namespace, see the docstring).
ORACLE_PATHS = frozenset(
    {"history before", "history after", "read", "send", "edit", "delete", "react", "typing",
     "describe", "invite", "remove", "search room", "upload", "file", "notifications",
     "report", HTTP_MESSAGES}
)  # fmt: skip
# What the member must see on a path (a control); HTTP's per-user routes need jwt mode.
MEMBER_SEES: dict[str, tuple[str, ...]] = {
    CONNECT: ("marker", "dm marker"), "join": ("title",), "join since": ("marker",),
    "history before": ("marker",), "history after": ("marker",), "rooms": ("title",),
    "inbox": ("marker", "dm marker"), "dm history": ("dm marker",), LIVE: ("marker",),
    "search": ("marker",), "search room": ("marker",), "file": ("marker",),
    "mentions": ("marker",), "report": ("marker",),
}  # fmt: skip
MEMBER_SEES_JWT: dict[str, tuple[str, ...]] = {
    HTTP_MESSAGES: ("marker",), HTTP_INBOX: ("marker", "dm marker"), HTTP_DM: ("dm marker",),
    HTTP_SEARCH: ("marker",), HTTP_MENTIONS: ("marker",),
}  # fmt: skip
SERVICE_SEES: dict[str, tuple[str, ...]] = {API_ROOM: ("title",), API_MESSAGES: ("marker",)}


def applicable(identity: str, path: str, mode: str) -> bool:
    """Whether the cell exists in a deployment of ``mode`` (``jwt`` or ``guest``)."""
    if (identity in JWT_ONLY and mode != "jwt") or (identity in GUEST_ONLY and mode != "guest"):
        return False
    return (identity == SERVICE) == (path in API_PATHS)


def policy(identity: str, path: str, mode: str) -> Policy:
    if identity == MEMBER:
        sees = MEMBER_SEES | (MEMBER_SEES_JWT if mode == "jwt" else {})
        return Policy(True, True, must_see=sees.get(path, ()))
    if identity == SERVICE:
        return Policy(True, False, must_see=SERVICE_SEES.get(path, ()))
    return Policy(False, False, stranger=identity in STRANGERS)


# -- the client side ---------------------------------------------------------------------------

ANSWER_TIMEOUT_S = 5.0
INBOX_WAIT_S = 3.0
CONCURRENCY = 4


def _type(frame: str) -> str | None:
    if not frame.startswith("{"):
        return None
    try:
        kind = orjson.loads(frame).get("type")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def _field(frame: str, name: str) -> Any:
    try:
        return orjson.loads(frame).get(name)
    except (orjson.JSONDecodeError, AttributeError):
        return None


class Socket:
    """A chat connection that records every frame it receives, raw and in order (server
    pings are answered and not recorded); its close is recorded as ``close CODE REASON``."""

    def __init__(self, ws: ClientConnection | None, refused: str = "") -> None:
        self.ws = ws
        self.frames: list[str] = []
        self.closed = ws is None
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        if ws is None:
            self.frames.append(refused)
        else:
            self._reader = asyncio.create_task(self._read(ws))

    async def _read(self, ws: ClientConnection) -> None:
        try:
            async for data in ws:
                text = data if isinstance(data, str) else data.decode(errors="replace")
                for frame in text.split("\n"):
                    if frame == '{"type":"ping"}':
                        await ws.send('{"type":"pong"}')
                    else:
                        self.frames.append(frame)
                self._arrived.set()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.frames.append(f"close {ws.close_code} {ws.close_reason or ''}".rstrip())
            self._arrived.set()

    async def send(self, frame: dict[str, Any]) -> None:
        if self.ws is not None and not self.closed:
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(orjson.dumps(frame).decode())

    async def until(
        self, found: Callable[[str], bool], start: int = 0, within: float = ANSWER_TIMEOUT_S
    ) -> int | None:
        """The index of the first frame from ``start`` on for which ``found`` holds (None
        after ``within`` seconds, or once the socket is closed without it)."""
        deadline = time.monotonic() + within
        while True:
            for index in range(start, len(self.frames)):
                if found(self.frames[index]):
                    return index
            start = len(self.frames)
            left = deadline - time.monotonic()
            if self.closed or left <= 0:
                return None
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._arrived.wait()

    async def exchange(self, frame: dict[str, Any]) -> tuple[str, ...]:
        """Send ``frame`` then a ``ping``: everything that came back before the ``pong`` (the
        server answers a connection's frames in order)."""
        start = len(self.frames)
        if self.closed:
            return (self.frames[-1],)
        await self.send(frame)
        await self.send({"type": "ping"})
        end = await self.until(lambda f: _type(f) == "pong" or f.startswith("close "), start)
        if end is None:
            return (*self.frames[start:], f"{NO_ANSWER} {ANSWER_TIMEOUT_S:g} s")
        last = self.frames[end]
        return tuple(self.frames[start:end]) + (() if _type(last) == "pong" else (last,))

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(3):
                    await self._reader
            self._reader.cancel()


@dataclass
class User:
    """Someone in the scenario: ``name`` (the jwt ``sub``, or the guest's display name) and
    ``user``, its user id."""

    identity: str
    name: str
    user: str
    guest_key: str | None = None
    token: str | None = None  # the token its sockets and requests use now (jwt mode)


class SetupError(RuntimeError):
    """The scenario could not be set up: the deployment proves nothing."""


def _expect(answers: Iterable[str], kind: str, what: str) -> str:
    answers = tuple(answers)
    for answer in answers:
        if _type(answer) == kind:
            return answer
    raise SetupError(f"{what}: expected {kind!r}, got {[a[:200] for a in answers]}")


# -- deployments --------------------------------------------------------------------------------


class _App(AppProcess):
    """tests.processes.AppProcess serving the app of ``server_root``, and dying with the
    runner (as loadtest.chaos's children do)."""

    def __init__(
        self, env: dict[str, str], server_root: Path, gunicorn_workers: int | None = None
    ) -> None:
        super().__init__(env, gunicorn_workers)
        self.server_root = server_root

    async def start(self, wait_ready: bool = True) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.command(), cwd=self.server_root, env=self.env, stdout=self.log,
            stderr=self.log, start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        if wait_ready:
            await self.wait_status(200)


ENV = {
    "CHAT_USER_READS_PER_S": "100000", "CHAT_USER_READ_BURST": "100000",
    "CHAT_USER_SEARCHES_PER_S": "100000", "CHAT_USER_SEARCH_BURST": "100000",
    "CHAT_MAX_PENDING_AUTH_PER_ADDRESS": "100000", "CHAT_RATE_LIMIT_FRAMES_PER_S": "100000",
    "CHAT_RATE_LIMIT_BURST": "100000", "CHAT_DRAIN_WINDOW_S": "1", "CHAT_CLOSE_TIMEOUT_S": "1",
    "CHAT_HELLO_NAMES_PROCESS": "false", "CHAT_LOG_LEVEL": "warning",
}  # fmt: skip


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    description: str
    mode: str  # jwt or guest
    store: str  # postgres or sqlite
    instances: int  # gunicorn instances on Redis; 0: python -m app (embedded)


DEPLOYMENTS = (
    DeploymentSpec(
        "redis-postgres", "2 gunicorn instances (1 worker each), one Redis, PostgreSQL, jwt",
        "jwt", "postgres", 2,
    ),
    DeploymentSpec(
        "redis-sqlite", "1 gunicorn instance (SQLite serves one process), Redis, SQLite, jwt",
        "jwt", "sqlite", 1,
    ),
    DeploymentSpec(
        "embedded", "python -m app (memory broker, SQLite, guest), restarted mid-scenario",
        "guest", "sqlite", 0,
    ),
)  # fmt: skip
SMOKE_DEPLOYMENTS = ("redis-postgres", "embedded")


class Deployment:
    """The processes of one deployment; :meth:`stop` ends them all, by PID."""

    def __init__(self, spec: DeploymentSpec, root: Path, server_root: Path = ROOT) -> None:
        self.spec = spec
        self.server_root = server_root
        self.root = root / spec.name
        self.root.mkdir()
        self.jwt_secret = secrets.token_hex(32)
        self.admin_token = secrets.token_hex(24)
        self.service_token = secrets.token_hex(24)
        self.redis: RedisServer | None = None
        self.postgres: PostgresServer | None = None
        self.apps: list[_App] = []

    async def start(self) -> None:
        spec = self.spec
        env = {
            **ENV, "CHAT_AUTH_MODE": spec.mode, "CHAT_ADMIN_TOKEN": self.admin_token,
            "CHAT_SERVICE_TOKEN": self.service_token,
            # Files on local disk, one directory for the deployment's instances.
            "CHAT_FILE_DIR": str(self.root / "files"),
        }  # fmt: skip
        if spec.mode == "jwt":
            env["CHAT_JWT_SECRET"] = self.jwt_secret
        if spec.store == "postgres":
            self.postgres = PostgresServer()
            await self.postgres.start()
            env["CHAT_DATABASE_URL"] = await self.postgres.create_database("attack")
        else:
            env["CHAT_DATABASE_URL"] = f"sqlite:///{self.root / 'hubbub.db'}"
        if spec.instances:
            self.redis = RedisServer()
            await self.redis.start()
            env["CHAT_REDIS_URL"] = self.redis.url
            self.apps = [_App(env, self.server_root, 1) for _ in range(spec.instances)]
        else:
            self.apps = [_App(env, self.server_root)]
        await self._started()

    async def _started(self) -> None:
        try:
            await asyncio.gather(*(app.start() for app in self.apps))
        except (AssertionError, TimeoutError) as exc:
            said = "\n".join(line for app in self.apps for line in app.output().splitlines()[-3:])
            raise SetupError(f"the app did not start ({exc!r}); its log ends:\n{said}") from None

    async def restart(self) -> None:
        """SIGTERM every app (it drains, and the embedded one stores what it holds), then
        start it again on the same port."""
        for app in self.apps:
            app.signal(signal.SIGTERM)
            await app.wait(30)
        await self._started()

    def http_url(self, instance: int) -> str:
        return self.apps[instance % len(self.apps)].http_url

    def ws_url(self, instance: int) -> str:
        return f"ws://127.0.0.1:{self.apps[instance % len(self.apps)].port}/ws?auth=frame"

    async def stop(self, keep_logs: bool) -> None:
        for index, app in enumerate(self.apps):
            if keep_logs:
                with contextlib.suppress(OSError):
                    (self.root / f"app{index}.log").write_text(app.output())
            await app.stop()
        if self.redis is not None:
            await self.redis.stop()
        if self.postgres is not None:
            await self.postgres.stop()


# -- one deployment's run -----------------------------------------------------------------------


def _hex(n: int) -> str:
    return secrets.token_hex(n)


@dataclass
class Ids:
    first: int = 0  # the room's first message
    target: int = 0  # the marker message edits and reactions aim at
    doomed: int = 0  # the marker message deletions aim at
    file: str = ""  # a file attached to a marker message (its name and bytes hold the marker)
    last: int = 0
    # The first message the broker's log holds (recovery with `since` replays from there):
    # `first`, or after the embedded server's restart (its log starts empty) the first since.
    recoverable: int = 0


class Attack:
    """The scenario and the probes on one deployment; :attr:`observations` is the result."""

    def __init__(
        self, deployment: Deployment, both_instances: bool, say: Callable[[str], None]
    ) -> None:
        self.d = deployment
        self.mode = deployment.spec.mode
        self.instances = len(deployment.apps)
        self.both = both_instances and self.instances > 1
        self.say = say
        tag = _hex(3)
        self.room = f"priv-{_hex(4)}"
        self.secrets_texts = {
            "marker": f"MARKER-{_hex(6)}", "title": f"TITLE-{_hex(6)}",
            "topic": f"TOPIC-{_hex(6)}",
        }  # fmt: skip
        self.dm_marker = f"DMMARK-{_hex(6)}"
        self.users: dict[str, User] = {}
        guest_names = {
            "owner": "olive", MEMBER: "mona", REMOVED: "rex", BANNED: "bart", OUTSIDER: "otto",
            PREREGISTERED: "pia", NAMESAKE: "mona", "bystander": "yves", "passer-by": "zoe",
        }  # fmt: skip
        for who in ("owner", MEMBER, REMOVED, BANNED, NARROWED, EXPIRED, OUTSIDER,
                    PREREGISTERED, NAMESAKE, "bystander", "passer-by"):  # fmt: skip
            if not applicable(who, CONNECT, self.mode) and who in IDENTITIES:
                continue
            if self.mode == "jwt":
                name = f"{who.replace('-', '')}-{tag}"
                self.users[who] = User(who, name, name, token=self.token(name))
            else:
                key = _hex(12)
                name = guest_names[who]
                self.users[who] = User(who, name, guest_user(name, key), guest_key=key)
        self.invitee = f"newcomer-{tag}"  # invited by the probes: never a member
        self.nobody = f"nobody-{tag}"  # removed by the probes: never a member
        self.ids = Ids()
        self.observations: list[tuple[Observation, Policy]] = []
        self.sockets: list[Socket] = []
        self.http = httpx.AsyncClient(trust_env=False, timeout=10)
        self._probes = asyncio.Semaphore(CONCURRENCY)
        self._turn = 0

    @property
    def secrets(self) -> Secrets:
        members = {
            u.user: (who if who in IDENTITIES else f"{who} member")
            for who, u in self.users.items()
            if who not in (OUTSIDER, PREREGISTERED, NAMESAKE, "passer-by")
        }
        members[self.users["passer-by"].user] = "member added and removed live"
        return Secrets(self.room, self.secrets_texts, {"dm marker": self.dm_marker}, members)

    def token(self, sub: str, ttl: float = 900, **claims: Any) -> str:
        now = time.time()
        payload = {"sub": sub, "iat": int(now), "exp": int(now + ttl), **claims}
        return jwt.encode(payload, self.d.jwt_secret, "HS256")

    # -- connections ------------------------------------------------------------------------

    def instance(self) -> int:
        """The next instance, in turn: requests alternate between them."""
        self._turn += 1
        return self._turn % self.instances

    def auth(self, who: User) -> dict[str, Any]:
        if self.mode == "jwt":
            return {"type": "auth", "token": who.token}
        return {"type": "auth", "name": who.name, "guest": who.guest_key}

    async def open(self, who: User, instance: int) -> tuple[Socket, tuple[str, ...]]:
        """A socket of ``who`` on ``instance`` once it said who it is, and the frames it got
        before any request: ``hello`` and the inbox pushed after it (or its close)."""
        try:
            ws = await connect(
                self.d.ws_url(instance), open_timeout=5, close_timeout=1, compression=None,
                proxy=None, ping_interval=None, max_size=None,
            )  # fmt: skip
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            sock = Socket(None, f"refused {type(exc).__name__}: {exc}")
            return sock, tuple(sock.frames)
        sock = Socket(ws)
        self.sockets.append(sock)
        await sock.send(self.auth(who))
        hello = await sock.until(lambda f: _type(f) == "hello" or f.startswith("close "))
        if hello is not None and _type(sock.frames[hello]) == "hello":
            await sock.until(
                lambda f: _type(f) == "inbox" or _field(f, "ref") == "inbox", within=INBOX_WAIT_S
            )
        return sock, tuple(sock.frames)

    async def member_socket(self, who: str, instance: int, join: bool = True) -> Socket:
        sock, pre = await self.open(self.users[who], instance)
        _expect(pre, "hello", f"{who} connects")
        if join:
            _expect(await sock.exchange({"type": "join", "room": self.room}), "joined",
                    f"{who} joins")  # fmt: skip
        return sock

    async def post(self, sock: Socket, text: str, **to: str) -> int:
        where = to or {"room": self.room}
        cid = _hex(4)
        answers = await sock.exchange({"type": "send", **where, "text": text, "cid": cid})
        ack = next((a for a in answers if _type(a) == "ack" and _field(a, "cid") == cid), None)
        if ack is None:
            raise SetupError(f"send {text!r}: no ack, got {[a[:200] for a in answers]}")
        message_id = int(_field(ack, "id"))
        self.ids.last = max(self.ids.last, message_id)
        return message_id

    async def attach(self, sock: Socket, name: str, content: str) -> str:
        """Upload a file to the room and send it in a message (as the page does): its id."""
        data = content.encode()
        asked = {"type": "upload", "room": self.room, "name": name, "size": len(data)}
        target = orjson.loads(_expect(await sock.exchange(asked), "upload", "the owner uploads"))
        response = await self.http.put(f"{self.d.http_url(0)}{target['url']}", content=data)
        if response.status_code != 201:
            raise SetupError(f"upload: {response.status_code} {response.text[:200]}")
        file_id = str(target["file"])
        message = {"type": "send", "room": self.room, "text": "", "cid": "file",
                   "attachments": [file_id]}  # fmt: skip
        _expect(await sock.exchange(message), "ack", "the owner sends the file")
        return file_id

    async def admin(self, method: str, path: str, body: dict[str, Any], instance: int) -> None:
        response = await self.http.request(
            method, f"{self.d.http_url(instance)}{path}", json=body,
            headers={"Authorization": f"Bearer {self.d.admin_token}"},
        )  # fmt: skip
        if response.status_code >= 300:
            raise SetupError(f"{method} {path}: {response.status_code} {response.text[:200]}")

    # -- the scenario -------------------------------------------------------------------------

    async def run(self) -> None:
        say, marker, room, users = self.say, self.secrets_texts["marker"], self.room, self.users
        embedded = self.d.spec.instances == 0
        # The pre-registered outsider marks the name read before the room exists.
        early, _ = await self.open(users[PREREGISTERED], self.instance())
        await early.exchange({"type": "read", "room": room, "id": 1})
        await early.close()
        owner = await self.member_socket("owner", 0, join=False)
        _expect(
            await owner.exchange({
                "type": "create", "room": room, "private": True,
                "title": self.secrets_texts["title"], "topic": self.secrets_texts["topic"],
            }),
            "room", "the owner creates the private room",
        )  # fmt: skip
        for who in (MEMBER, REMOVED, BANNED, NARROWED, EXPIRED, "bystander"):
            if who in users:
                invite = {"type": "invite", "room": room, "user": users[who].user}
                _expect(await owner.exchange(invite), "room", f"the owner invites the {who}")
        _expect(await owner.exchange({"type": "join", "room": room}), "joined", "owner joins")
        # The members' sockets. The removed member's is on the instance the removal does not
        # go through (1): that instance has read, and cached, the room as one it is in.
        other = 1 % self.instances
        sockets = {MEMBER: await self.member_socket(MEMBER, other),
                   REMOVED: await self.member_socket(REMOVED, other),
                   BANNED: await self.member_socket(BANNED, 0)}  # fmt: skip
        if self.mode == "jwt":
            sockets[NARROWED] = await self.member_socket(NARROWED, other)
            expired = users[EXPIRED]
            expired.token = self.token(expired.name, ttl=5)
            sockets[EXPIRED] = await self.member_socket(EXPIRED, 0)
            now = int(time.time())  # from now on it only has a token that has expired
            expired.token = self.token(expired.name, iat=now - 120, exp=now - 60)
        self.ids.first = self.ids.recoverable = await self.post(
            owner, f"{marker} the owner's first message"
        )
        self.ids.target = await self.post(owner, f"{marker} the owner's second message")
        self.ids.doomed = await self.post(owner, f"{marker} the owner's third message")
        await self.post(sockets[MEMBER], f"{marker} the member's message")
        self.ids.file = await self.attach(owner, f"{marker}-plan.pdf", f"%PDF-1.4 {marker}")
        for who in (REMOVED, BANNED, NARROWED):
            if who in sockets:
                written = await self.post(sockets[who], f"{marker} the {who} member writes")
                await sockets[who].exchange({"type": "read", "room": room, "id": written})
        _expect(
            await sockets[REMOVED].exchange({"type": "history", "room": room, "limit": 50}),
            "history", "the member-to-be-removed reads",
        )  # fmt: skip
        named = " ".join(f"@{users[who].user}" for who in IDENTITIES if who in users)
        await self.post(owner, f"{marker} the owner's message mentions {named}")
        edit = {"type": "edit", "room": room, "id": self.ids.first,
                "text": f"{marker} the owner's first message, edited", "cid": "edit"}  # fmt: skip
        _expect(await owner.exchange(edit), "ack", "the owner edits")
        react = {"type": "react", "room": room, "id": self.ids.target, "emoji": "👍", "cid": "r"}
        _expect(await sockets[MEMBER].exchange(react), "ack", "the member reacts")
        await self.post(owner, f"{self.dm_marker} from the owner", to=users[MEMBER].user)
        await self.post(sockets[MEMBER], f"{self.dm_marker} back", to=users["owner"].user)
        await self.post(owner, f"{marker} the owner's last message before the removal")
        # The removal, through the owner's instance (0); the moment its answer comes, the
        # removed member asks the other instance, which had cached the room, for it.
        quick, _ = await self.open(users[REMOVED], other)
        remove = {"type": "remove", "room": room, "user": users[REMOVED].user}
        _expect(await owner.exchange(remove), "room", "the owner removes the removed member")
        if not embedded:
            await self.at_once(quick, other)
        await quick.close()
        # Kept sockets, for the live cells: the socket, its instance, from which frame on
        # nothing of the room may reach it, and what happened to it there.
        kept: dict[str, tuple[Socket, int, int, str]] = {}
        if embedded:
            say("restart (SIGTERM, then started again on its port)")
            for sock in (owner, *sockets.values()):
                await sock.close()
            await self.d.restart()
            self.ids.recoverable = 0  # the memory broker's log starts empty
            owner = await self.member_socket("owner", 0)
            sockets = {MEMBER: await self.member_socket(MEMBER, 0),
                       BANNED: await self.member_socket(BANNED, 0)}  # fmt: skip
        else:
            # The removal itself reaches its socket: `left`, and the `member` notice naming it
            # (and who removed it), in either order. From there on, nothing more may.
            gone, removed = sockets[REMOVED], users[REMOVED].user
            left = await gone.until(lambda f: _type(f) == "left", within=3)
            notice = await gone.until(
                lambda f: _type(f) == "member" and _field(f, "user") == removed, within=3
            )
            seen = [i for i in (left, notice) if i is not None]
            kept[REMOVED] = (gone, other, max(seen) + 1 if seen else len(gone.frames), "removed")
            # Right after the removal, before anything else: its cells, through the instance
            # that had cached the room first.
            say("the removed member's cells, right after the removal")
            await self.probe_identity(REMOVED, first_instance=other)
        # The banned and the expired member's sockets must be closed: from their close on
        # (or, if they stay open, from the ban or the expiry on) nothing may reach them.
        banned = sockets[BANNED]
        start = len(banned.frames)
        await self.admin(
            "PUT", f"/admin/users/{users[BANNED].user}/ban",
            {"duration_s": 3600, "reason": "attack run"}, self.instance(),
        )  # fmt: skip
        closed = await banned.until(lambda f: f.startswith("close "), start, within=5)
        kept[BANNED] = (banned, 0, start if closed is None else closed, "banned")
        if self.mode == "jwt":
            narrowed = sockets[NARROWED]
            users[NARROWED].token = self.token(users[NARROWED].name, rooms=["lobby", "team-*"])
            _expect(
                await narrowed.exchange({"type": "auth", "token": users[NARROWED].token}),
                "authenticated", "the narrowed member's new token",
            )  # fmt: skip
            kept[NARROWED] = (narrowed, other, len(narrowed.frames), "narrowed")
            dying = sockets[EXPIRED]
            closed = await dying.until(lambda f: f.startswith("close "), within=10)
            kept[EXPIRED] = (dying, 0, len(dying.frames) if closed is None else closed, "expired")
        kept[MEMBER] = (sockets[MEMBER], other, len(sockets[MEMBER].frames), "joined")
        # Fresh sockets, one per instance, of everyone who may not read the room: each tries
        # to join, then listens while the owner and the member keep at it.
        fresh: dict[tuple[str, int], tuple[Socket, tuple[str, ...], int]] = {}
        for who in IDENTITIES:
            if who in (MEMBER, SERVICE) or not applicable(who, LIVE, self.mode):
                continue
            for instance in range(self.instances):
                sock, _ = await self.open(users[who], instance)
                joined = await sock.exchange({"type": "join", "room": room})
                fresh[who, instance] = (sock, joined, len(sock.frames))
        say("live: the owner and the member keep posting")
        await self.keep_posting(owner, sockets[MEMBER])
        say("every other cell")
        for who in IDENTITIES:
            if who != REMOVED or embedded:
                await self.probe_identity(who)
        await self.keep_posting(owner, sockets[MEMBER])
        await asyncio.sleep(0.5)
        for who in IDENTITIES:
            for instance in range(self.instances):
                exchanges = []
                if who in kept and kept[who][1] == instance:
                    sock, _, start, what = kept[who]
                    label = f"socket joined before it was {what}" if who != MEMBER else LIVE
                    exchanges.append(Exchange(label, tuple(sock.frames[start:])))
                if (who, instance) in fresh:
                    sock, joined, start = fresh[who, instance]
                    exchanges.append(Exchange("fresh socket: join", joined))
                    exchanges.append(Exchange("fresh socket: then", tuple(sock.frames[start:])))
                if exchanges:
                    self.record(who, LIVE, instance, tuple(exchanges), (room,))

    async def at_once(self, quick: Socket, instance: int) -> None:
        """The removed member's reads through ``instance`` the moment its removal is answered
        (through the other): a record cached there must not let it read on."""
        after = ", at once after the removal"

        async def frames() -> None:
            for path in ("history before", "history after", "join since"):
                exchanges = tuple(
                    [Exchange(label + after, await quick.exchange(frame))
                     for label, frame in self.frames(REMOVED, path, self.room)]
                )  # fmt: skip
                self.record(REMOVED, path, instance, exchanges, (self.room,))

        async def http() -> None:
            exchanges = await self.http_probe(REMOVED, HTTP_MESSAGES, instance, self.room)
            exchanges = tuple(Exchange(e.label + after, e.answers) for e in exchanges)
            self.record(REMOVED, HTTP_MESSAGES, instance, exchanges, (self.room,))

        await asyncio.gather(frames(), http())

    async def keep_posting(self, owner: Socket, member: Socket) -> None:
        """What members do in a room, which non-members must not hear of."""
        marker, room, users = self.secrets_texts["marker"], self.room, self.users
        written = await self.post(owner, f"{marker} live, from the owner")
        self.ids.recoverable = self.ids.recoverable or written
        await self.post(member, f"{marker} live, from the member")
        edit = {"type": "edit", "room": room, "id": written, "text": f"{marker} live, edited"}
        await owner.exchange(edit)
        await member.exchange({"type": "react", "room": room, "id": written, "emoji": "🎉"})
        await owner.exchange({"type": "typing", "room": room})
        await member.exchange({"type": "read", "room": room, "id": written})
        passer_by = users["passer-by"].user
        await owner.exchange({"type": "invite", "room": room, "user": passer_by})
        await owner.exchange({"type": "remove", "room": room, "user": passer_by})
        topic = f"{self.secrets_texts['topic']} (described live)"
        await owner.exchange({"type": "describe", "room": room, "topic": topic})
        await self.post(owner, f"{self.dm_marker} live", to=users[MEMBER].user)

    # -- the probes ---------------------------------------------------------------------------

    def record(
        self,
        identity: str,
        path: str,
        instance: int,
        exchanges: tuple[Exchange, ...],
        supplied: tuple[str, ...],
        control: tuple[Exchange, ...] | None = None,
        control_room: str = "",
        error: str | None = None,
    ) -> None:
        own = self.users[identity].user if identity in self.users else ""
        observation = Observation(
            identity, path, instance, own, exchanges, supplied, control, control_room, error
        )
        self.observations.append((observation, policy(identity, path, self.mode)))

    def frames(self, who: str, path: str, room: str) -> list[tuple[str, dict[str, Any]]]:
        """The requests of a frame path, about ``room``."""
        member = who == MEMBER
        ids, marker = self.ids, self.secrets_texts["marker"]
        text = f"{marker} probe from the member" if member else f"probe from the {who}"
        peer = self.users["owner" if member else MEMBER].user
        bystander = self.users["bystander"].user
        frames: dict[str, list[tuple[str, dict[str, Any]]]] = {
            "join": [("join", {"type": "join", "room": room})],
            "join since": [("join since", {"type": "join", "room": room,
                                           "since": ids.recoverable - 1})],
            "history before": [("history before", {"type": "history", "room": room,
                                                   "before": ids.last + 1, "limit": 50})],
            "history after": [("history after", {"type": "history", "room": room,
                                                 "after": ids.recoverable - 1, "limit": 50})],
            "read": [("read", {"type": "read", "room": room, "id": ids.target})],
            "send": [("send", {"type": "send", "room": room, "text": text, "cid": "p"})],
            "edit": [("edit", {"type": "edit", "room": room, "id": ids.target, "text": text,
                               "cid": "e"})],
            "delete": [("delete", {"type": "delete", "room": room, "id": ids.doomed,
                                   "cid": "d"})],
            "react": [("react", {"type": "react", "room": room, "id": ids.target,
                                 "emoji": "👀", "cid": "r"})],
            "typing": [("typing", {"type": "typing", "room": room})],
            "describe": [("describe", {"type": "describe", "room": room, "topic": text})],
            "invite": [("invite", {"type": "invite", "room": room, "user": self.invitee,
                                   "role": "member"})],
            "remove": [(REMOVE_MEMBER, {"type": "remove", "room": room, "user": bystander}),
                       (REMOVE_NON_MEMBER, {"type": "remove", "room": room,
                                            "user": self.nobody})],
            "rooms": [("rooms", {"type": "rooms"})],
            # The public directory, searched by the room's name: never lists a private room.
            "directory": [("directory", {"type": "rooms", "public": True, "q": room})],
            "inbox": [("inbox", {"type": "inbox"})],
            "dm history": [("dm history", {"type": "history", "with": peer, "limit": 50})],
            # Search: words of the room's messages (never the marker itself, which would be
            # echoed), everywhere and in the room named.
            "search": [("search", {"type": "search", "q": "owner message", "order": "best",
                                   "limit": 50})],
            "search room": [("search room", {"type": "search", "q": "owner message",
                                             "room": room, "limit": 50})],
            # Files: uploading into the room, and links to its file (for a never-used name,
            # the control: a file id nobody was given).
            "upload": [("upload", {"type": "upload", "room": room, "name": "probe.txt",
                                   "size": 5})],
            "file": [("file", {"type": "file", "id": ids.file if room == self.room
                                                    else secrets.token_urlsafe(16)})],
            # Mentions: every identity was mentioned in the room (members then); and the
            # notification level of the room.
            "mentions": [("mentions", {"type": "mentions", "limit": 50})],
            "notifications": [("notifications", {"type": "notifications", "room": room})],
            # Reports: the answer holds the reported message's text (app.moderation.reports).
            "report": [("report", {"type": "report", "room": room, "id": ids.target,
                                   "reason": "probe"})],
        }  # fmt: skip
        return frames[path]

    def supplied(self, who: str, path: str) -> tuple[str, ...]:
        peer = self.users["owner" if who == MEMBER else MEMBER].user
        return {
            "invite": (self.room, self.invitee),
            "remove": (self.room, self.users["bystander"].user, self.nobody),
            "dm history": (peer,),
            HTTP_DM: (peer,),
        }.get(path, (self.room,))

    async def frame_probe(
        self, who: str, path: str, instance: int, room: str
    ) -> tuple[Exchange, ...]:
        sock, _ = await self.open(self.users[who], instance)
        try:
            return tuple(
                [Exchange(label, await sock.exchange(frame))
                 for label, frame in self.frames(who, path, room)]
            )  # fmt: skip
        finally:
            await sock.close()

    async def http_probe(
        self, who: str, path: str, instance: int, room: str
    ) -> tuple[Exchange, ...]:
        token = self.d.service_token if who == SERVICE else self.users[who].token
        peer = self.users["owner" if who == MEMBER else MEMBER].user
        url = path.split(" ", 1)[1].format(room=room, peer=peer)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = await self.http.get(f"{self.d.http_url(instance)}{url}", headers=headers)
            answer = f"HTTP {response.status_code} {response.text}"
        except httpx.HTTPError as exc:
            answer = f"HTTP failed: {type(exc).__name__}: {exc}"
        return (Exchange(path, (answer,)),)

    async def probe(self, who: str, path: str, instance: int) -> None:
        async with self._probes:
            try:
                control: tuple[Exchange, ...] | None = None
                unused = ""
                if path == CONNECT:
                    sock, pre = await self.open(self.users[who], instance)
                    await sock.close()
                    exchanges: tuple[Exchange, ...] = (Exchange(CONNECT, pre),)
                else:
                    run: Callable[[str, str, int, str], Awaitable[tuple[Exchange, ...]]] = (
                        self.frame_probe if path in FRAME_PATHS else self.http_probe
                    )
                    exchanges = await run(who, path, instance, self.room)
                    if who in STRANGERS and path in ORACLE_PATHS:
                        unused = f"priv-{_hex(4)}"
                        control = await run(who, path, instance, unused)
                self.record(who, path, instance, exchanges, self.supplied(who, path),
                            control, unused)  # fmt: skip
            except Exception as exc:  # a probe that broke is a failed cell, not a crash
                self.record(who, path, instance, (), (), error=f"{type(exc).__name__}: {exc}")

    async def probe_identity(self, who: str, first_instance: int = 0) -> None:
        """Every cell of ``who`` but ``live``, on both instances (or one, alternating)."""
        if who not in self.users and who != SERVICE:
            return
        jobs = []
        for n, path in enumerate(PATHS):
            if path == LIVE or not applicable(who, path, self.mode):
                continue
            if self.both:
                order = [first_instance, 1 - first_instance]
            else:
                order = [(first_instance + n) % self.instances]
            jobs += [self.probe(who, path, instance) for instance in order]
        await asyncio.gather(*jobs)

    async def close(self) -> None:
        await asyncio.gather(*(sock.close() for sock in self.sockets), return_exceptions=True)
        await self.http.aclose()


# -- the report ---------------------------------------------------------------------------------


@dataclass
class DeploymentReport:
    spec: DeploymentSpec
    cells: list[Cell] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> list[Cell]:
        return [cell for cell in self.cells if not cell.passed]


def judge(
    observations: Iterable[tuple[Observation, Policy]], secrets: Secrets, mode: str
) -> list[Cell]:
    """Every cell of a deployment of ``mode``, from its observations."""
    cells = {(i, p): Cell(i, p, applicable=applicable(i, p, mode)) for i in IDENTITIES
             for p in PATHS}  # fmt: skip
    for observation, rule in observations:
        cell = cells[observation.identity, observation.path]
        cell.instances.append(observation.instance)
        cell.observed.append(observation)
        cell.findings += check(observation, rule, secrets)
    for cell in cells.values():
        if cell.applicable and not cell.instances:
            cell.findings.append(Finding(ERROR, -1, "the probe", "not probed"))
    return list(cells.values())


def table(report: DeploymentReport) -> str:
    """The deployment's cells: a row per path, a column per identity."""
    shown = [i for i in IDENTITIES if any(c.applicable for c in report.cells if c.identity == i)]
    widths = [max(len(identity), 8) + 2 for identity in shown]
    first = max(len(p) for p in PATHS) + 2
    header = "".ljust(first) + "".join(i.ljust(w) for i, w in zip(shown, widths, strict=True))
    lines = [header.rstrip()]
    cells = {(c.identity, c.path): c for c in report.cells}
    for path in PATHS:
        row = path.ljust(first)
        for identity, width in zip(shown, widths, strict=True):
            cell = cells[identity, path]
            status = "-" if not cell.applicable else SYMBOL.get(cell.status, cell.status)
            row += status.ljust(width)
        lines.append(row.rstrip())
    return "\n".join(lines)


def failure_lines(name: str, cell: Cell) -> list[str]:
    """A failed cell in a few lines: per kind of finding, what, on which instances, and the
    evidence of the first (the JSON report has every one)."""
    lines = []
    for kind in SEVERITY:
        found = [f for f in cell.findings if f.kind == kind]
        if not found:
            continue
        whats = list(dict.fromkeys(f.what for f in found))
        instances = ",".join(str(i) for i in sorted({f.instance for f in found}))
        lines.append(
            f"  {name} / {cell.identity} x {cell.path} [instance {instances}] {SYMBOL[kind]}: "
            f"{'; '.join(whats)}\n      {found[0].detail[:300]}"
        )
    return lines


def text_report(reports: list[DeploymentReport]) -> str:
    out = []
    for report in reports:
        spec = report.spec
        out.append(f"== {spec.name}: {spec.description} ({report.seconds:.0f} s) ==")
        if report.error is not None:
            out.append(f"NOT RUN: {report.error}\n")
            continue
        out.append(table(report))
        failed = report.failed
        out.append(f"{len(failed)} of {sum(c.applicable for c in report.cells)} cells fail\n")
    failures = [(r.spec.name, c) for r in reports for c in r.failed]
    if failures:
        out.append("Failures (deployment / identity x path [instances] KIND: what, then evidence):")
        for name, cell in failures:
            out += failure_lines(name, cell)
    out.append(
        "\nLegend: ok; LEAK (a marker, the title/topic or a member's id reached someone who may "
        "not read the room, or the DM's marker a third party); E-ORACLE (a stranger's answers "
        "about the private room differ from a never-used name's); M-ORACLE (remove of a member "
        "and of a non-member answer differently); BLIND (a control did not see the markers); "
        "ERROR (the probe broke); - (no such cell here)."
    )
    return "\n".join(out)


def _observed(observation: Observation) -> dict[str, Any]:
    """What an identity got (each answer cut to 400 characters), for the JSON report."""

    def answers(exchanges: tuple[Exchange, ...]) -> dict[str, list[str]]:
        return {e.label: [a[:400] for a in e.answers] for e in exchanges}

    shown: dict[str, Any] = {"instance": observation.instance}
    shown["answers"] = answers(observation.exchanges)
    if observation.control is not None:
        shown["never-used name"] = observation.control_room
        shown["its answers"] = answers(observation.control)
    if observation.error is not None:
        shown["error"] = observation.error
    return shown


def as_json(reports: list[DeploymentReport]) -> dict[str, Any]:
    return {
        "passed": all(r.error is None and not r.failed for r in reports),
        "deployments": [
            {
                "name": r.spec.name, "description": r.spec.description, "mode": r.spec.mode,
                "error": r.error, "seconds": round(r.seconds, 1),
                "cells": [
                    {"identity": c.identity, "path": c.path, "status": c.status,
                     "instances": sorted(set(c.instances)),
                     "findings": [{"kind": f.kind, "instance": f.instance, "what": f.what,
                                   "detail": f.detail}
                                  for f in c.findings],
                     "observed": [_observed(o) for o in c.observed]}
                    for c in r.cells
                ],
            }
            for r in reports
        ],
    }  # fmt: skip


# -- running ------------------------------------------------------------------------------------


def _say(text: str) -> None:
    sys.stderr.write(f"[attack {time.strftime('%H:%M:%S')}] {text}\n")


async def attack(
    spec: DeploymentSpec, root: Path, both: bool, keep: bool, server_root: Path = ROOT
) -> DeploymentReport:
    report = DeploymentReport(spec)
    began = time.monotonic()

    def say(text: str) -> None:
        _say(f"{spec.name}: {text}")

    deployment = Deployment(spec, root, server_root)
    run: Attack | None = None
    failed = True
    try:
        say("starting")
        await deployment.start()
        run = Attack(deployment, both, say)
        say(f"room {run.room}; the scenario")
        await run.run()
        report.cells = judge(run.observations, run.secrets, spec.mode)
        failed = bool(report.failed)
    except SetupError as exc:
        report.error = f"setup failed: {exc}"
    except (OSError, AssertionError, TimeoutError, RuntimeError) as exc:
        report.error = f"{type(exc).__name__}: {exc}"
    finally:
        if run is not None:
            await run.close()
        await deployment.stop(keep or failed)
        report.seconds = time.monotonic() - began
    say(f"done in {report.seconds:.0f} s")
    return report


async def main_async(
    names: list[str], both: bool, keep: bool, server_root: Path = ROOT
) -> list[DeploymentReport]:
    root = Path(tempfile.mkdtemp(prefix="hubbub-attack-"))
    specs = [spec for spec in DEPLOYMENTS if spec.name in names]
    reports = []
    try:
        for spec in specs:
            reports.append(await attack(spec, root, both, keep, server_root))
    finally:
        if keep or any(r.error or r.failed for r in reports):
            _say(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.attack", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--smoke", action="store_true",
        help=f"{' and '.join(SMOKE_DEPLOYMENTS)} only, each cell on one instance (~1 min)",
    )  # fmt: skip
    parser.add_argument(
        "--only", nargs="+", choices=[spec.name for spec in DEPLOYMENTS], help="these deployments"
    )
    parser.add_argument("--json", type=Path, help="write the report here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    parser.add_argument(
        "--server-root", type=Path, default=ROOT,
        help="serve the app of this checkout (e.g. `git archive REV | tar -x -C DIR`); "
        "default: this one",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = args.only or (list(SMOKE_DEPLOYMENTS) if args.smoke else [s.name for s in DEPLOYMENTS])

    async def guarded() -> list[DeploymentReport]:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await main_async(names, not args.smoke, args.keep, args.server_root.resolve())

    try:
        reports = uvloop.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        sys.stderr.write("attack: interrupted; every process it started is stopped\n")
        return 130
    sys.stdout.write(text_report(reports) + "\n")
    if args.json:
        args.json.write_text(json.dumps(as_json(reports), indent=1, ensure_ascii=False) + "\n")
    if any(r.error for r in reports):
        return 2
    return 1 if any(r.failed for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
