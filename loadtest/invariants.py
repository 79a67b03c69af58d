"""The chaos run's invariant checker: "no silent loss", "no duplicate", "in order".

Pure: no I/O, no clock. :func:`check` takes what the clients of a run recorded (a
:class:`RunLog`) and returns a :class:`Report`; ``loadtest/chaos.py`` records and prints.

The promise under test: a room message (or an event on one: the run edits messages, and
each ``edited`` frame has its own id in the room's log) is delivered to every member of its
room, live or by recovery after a reconnect (a ``join`` with ``since`` answered
``"recovered": true``), or the member is told — a ``joined`` with ``"recovered": false`` (a
*reported gap*), an ``error`` frame ``resync`` for the room, or, for its own ``send``, an
``error`` frame answering it. Never lost silently.

The model, per client and room (a *membership*):

- **Truth**: every message id of the room that was acked to someone, received by anyone (a
  ``message`` frame) or returned by an HTTP reload. Each gets bounds on its publish time, on
  the clients' clock: from its ``ts`` (Redis' clock, ms, floored: the same host clock), from
  the first send of its ``cid`` (a lower bound) and from its ack's arrival (an upper bound).
- **Owed**: the ids ``L < id <= F`` that may have been published after the first join was
  sent, where ``L`` is the ``last`` of the first ``joined`` (the server's word: every larger
  id reaches you) and ``F`` the client's *final position*: the newest id it knew of (messages,
  ``last``, reloads), raised, for every join with ``since`` ``S`` answered ``recovered:
  true``, to the newest truth id above ``S`` certainly published before that join was sent
  (the server claims to have replayed all of them). The runner ends with a *settle* (every
  client rejoins every room with ``since`` once traffic has stopped), which makes ``F`` the
  room's newest id, so a loss at the tail is found too.
- **Reported**: excused from the owed ids are, for each ``recovered: false`` with ``since``
  ``S``, the ids above ``S`` that may have been published before that ``joined`` arrived
  (as one range ``(S, X]``: ids grow with publish time), and for each reload the range from
  the old position to the newest id it returned. A ``resync`` error excuses the ids above the
  client's position then that may have been published before it arrived — unless a later
  join with ``since`` below them was answered ``recovered: true``: the client rejoins after a
  resync, and the server's answer to that rejoin is what counts.
- A **silent loss** is an owed, unexcused id the client never received as a ``message``.
- A **duplicate** is an id received again by the same client in the same room, except a
  replayed id above the ``since`` of a rejoin on the same connection that crossed live
  messages in flight (counted apart as ``redelivered``: the protocol makes that expected).
  **Out of order**: within one membership segment (from a ``joined`` to the next one or to
  the connection's end) an id below one received before it, or an id at or below the
  segment's ``since``.

Soundness: every loss reported is one (ambiguity about publish times only ever excuses,
never accuses); what it cannot see is a loss of a message published during the round trip of
a join answered ``recovered: false`` (excused), or after a membership's final position when
that membership had no settle (counted as ``unsettled``).
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

# Slack on the clock comparisons (ts is Redis' wall clock floored to the ms; the clients read
# the same host clock): ambiguity within it excuses, never accuses.
MARGIN_S = 0.005
# A client counts as active at a fault if it received a message this long before it.
ACTIVE_WINDOW_S = 5.0
# How many examples of each anomaly the report lists.
SAMPLES = 12


# -- the log: what the clients recorded ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """A logical send: one ``cid`` (every retry of it reuses cid and text), first sent at
    ``at``; with ``edit_of``, an ``edit`` of the client's message of that id, whose ``edited``
    event is numbered in the room's log like a message (and checked like one: its ``text``
    is the new text)."""

    client: str
    room: str
    cid: str
    text: str
    at: float
    edit_of: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """An ``ack`` frame for the client's ``cid``."""

    client: str
    cid: str
    id: int
    duplicate: bool
    at: float


@dataclass(frozen=True, slots=True)
class SendError:
    """An ``error`` frame answering the client's ``send`` with ``cid``."""

    client: str
    cid: str
    code: str
    at: float


@dataclass(frozen=True, slots=True)
class Connected:
    """The client got ``hello`` on its connection number ``conn`` to instance ``instance``."""

    client: str
    conn: int
    instance: int
    at: float


@dataclass(frozen=True, slots=True)
class Disconnected:
    """Connection ``conn`` ended (``code``: the close code received, None without one)."""

    client: str
    conn: int
    code: int | None
    at: float


@dataclass(frozen=True, slots=True)
class Joined:
    """A ``joined`` frame answering the join sent at ``sent_at`` with ``since`` (None: a first
    join, answered with ``last``)."""

    client: str
    room: str
    since: int | None
    recovered: bool | None
    last: int | None
    sent_at: float
    at: float


@dataclass(frozen=True, slots=True)
class JoinRefused:
    """An ``error`` frame answering a ``join`` (matched to it by order)."""

    client: str
    room: str
    code: str
    at: float


@dataclass(frozen=True, slots=True)
class Received:
    """A room ``message`` frame, as it arrived."""

    client: str
    room: str
    id: int
    text: str
    ts: int
    at: float


@dataclass(frozen=True, slots=True)
class Resync:
    """An ``error`` frame with code ``resync`` for ``room``."""

    client: str
    room: str
    at: float


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One message returned by ``GET /rooms/{room}/messages``."""

    id: int
    text: str
    ts: int


@dataclass(frozen=True, slots=True)
class Reloaded:
    """The HTTP reload after a ``recovered: false``: the reported gap runs from ``since`` (the
    position the client had) to ``newest`` (the newest id returned; None if none or it
    failed)."""

    client: str
    room: str
    since: int | None
    newest: int | None
    entries: tuple[HistoryEntry, ...]
    at: float


Event = Connected | Disconnected | Joined | JoinRefused | Received | Resync | Reloaded


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault the runner injected: ``happened`` says it verifiably took effect."""

    name: str
    started_at: float
    ended_at: float
    happened: bool
    detail: str


@dataclass
class RunLog:
    """Everything a run recorded. ``events`` holds every client's events, each client's in the
    order they happened (clients may be interleaved); times are ``time.time()``."""

    events: list[Event] = field(default_factory=list)
    sends: list[Send] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    send_errors: list[SendError] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    started_at: float = 0.0  # every client had joined: faults and report times count from here
    traffic_end: float = 0.0  # the last new send was made
    meta: dict[str, Any] = field(default_factory=dict)


# -- the report --------------------------------------------------------------------------------


@dataclass
class Loss:
    client: str
    room: str
    id: int
    text: str
    published_at: float  # relative to the start of traffic (lower bound)
    why: str  # "live" or "replay" (a recovered:true join should have replayed it)


@dataclass
class FaultReport:
    """A fault and how the service came back from it. ``deliveries_resumed_s``: from the fault
    until every client active at it (one that had received a message in the 5 s before)
    received a message published after the fault began, within the window up to the next
    fault (None: some never did; ``unrecovered_clients`` counts them). ``sends_resumed_s``:
    until every client that sent in the window had an ack for a send first made after the
    fault began. Counts are of events within the window."""

    name: str
    at_s: float
    happened: bool
    detail: str
    window_s: float
    deliveries_resumed_s: float | None
    deliveries_resumed_p50_s: float | None
    unrecovered_clients: int
    sends_resumed_s: float | None
    disconnects: int
    resyncs: int
    reported_gaps: int
    send_errors: int
    join_refusals: int
    silent_losses: int
    unheard: int


@dataclass
class Report:
    clients: int = 0
    rooms: int = 0
    memberships: int = 0
    duration_s: float = 0.0
    connections: int = 0
    disconnects_by_code: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    acked: int = 0
    duplicate_acks: int = 0
    send_errors_by_code: dict[str, int] = field(default_factory=dict)
    unacked_at_end: int = 0
    join_refusals_by_code: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    deliveries: int = 0
    delivered_live: int = 0
    delivered_recovered: int = 0
    redelivered: int = 0
    reloaded: int = 0
    owed: int = 0
    reported_gaps: int = 0
    excused: int = 0
    resyncs: int = 0
    unsettled: int = 0
    stray: int = 0
    silent_losses: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    acked_never_received: int = 0
    double_posts: int = 0
    losses_by_room: dict[str, int] = field(default_factory=dict)
    loss_samples: list[Loss] = field(default_factory=list)
    duplicate_samples: list[str] = field(default_factory=list)
    out_of_order_samples: list[str] = field(default_factory=list)
    double_post_samples: list[str] = field(default_factory=list)
    unheard_samples: list[str] = field(default_factory=list)
    faults: list[FaultReport] = field(default_factory=list)

    @property
    def invariants(self) -> dict[str, bool]:
        """The three invariants, True when they hold."""
        return {
            "no silent loss": self.silent_losses == 0,
            "no duplicate": self.duplicates == 0,
            "in order": self.out_of_order == 0,
        }

    @property
    def passed(self) -> bool:
        return all(self.invariants.values())

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["invariants"] = self.invariants
        out["passed"] = self.passed
        return out

    def text(self) -> str:
        """The report as a plain-text table."""
        rows: list[tuple[str, str]] = [
            (
                "clients / rooms / memberships",
                f"{self.clients} / {self.rooms} / {self.memberships}",
            ),
            ("traffic duration", f"{self.duration_s:.1f} s"),
            ("connections opened", str(self.connections)),
            ("disconnects by close code", _counts(self.disconnects_by_code)),
            ("sent (distinct cids)", str(self.sent)),
            ("acked", str(self.acked)),
            ("duplicate acks (retry deduped)", str(self.duplicate_acks)),
            ("send errors by code", _counts(self.send_errors_by_code)),
            ("unacked at end", str(self.unacked_at_end)),
            ("join refusals by code", _counts(self.join_refusals_by_code)),
            ("messages (distinct ids)", str(self.messages)),
            ("deliveries (message frames)", str(self.deliveries)),
            ("  delivered live", str(self.delivered_live)),
            ("  delivered by recovery (replay)", str(self.delivered_recovered)),
            ("  redelivered by a rejoin (expected)", str(self.redelivered)),
            ("reloaded over HTTP", str(self.reloaded)),
            ("owed deliveries (checked)", str(self.owed)),
            ("reported gaps (recovered:false)", str(self.reported_gaps)),
            ("  deliveries excused by them", str(self.excused)),
            ("resyncs reported", str(self.resyncs)),
            ("memberships without a final settle", str(self.unsettled)),
            ("messages outside a membership", str(self.stray)),
            ("acked, received by no member", str(self.acked_never_received)),
            ("double posts (text under 2 ids)", str(self.double_posts)),
            ("SILENT LOSSES", str(self.silent_losses)),
            ("DUPLICATES", str(self.duplicates)),
            ("OUT OF ORDER", str(self.out_of_order)),
        ]
        width = max(len(name) for name, _ in rows)
        lines = ["Chaos run", "=" * (width + 20)]
        lines += [f"{name:<{width}}  {value}" for name, value in rows]
        if self.faults:
            lines += ["", "Faults (times from the start of traffic; resumed = time to recover)"]
            header = (
                f"{'fault':<18} {'at':>6} {'ok':>3} {'deliv.':>7} {'p50':>6} {'unrec':>5} "
                f"{'sends':>6} {'disc':>5} {'resync':>6} {'gaps':>5} {'s.err':>5} "
                f"{'j.ref':>5} {'lost':>5} {'unhrd':>5}"
            )
            lines += [header, "-" * len(header)]
            for f in self.faults:
                lines.append(
                    f"{f.name:<18} {f.at_s:>6.1f} {'yes' if f.happened else 'NO':>3} "
                    f"{_secs(f.deliveries_resumed_s):>7} {_secs(f.deliveries_resumed_p50_s):>6} "
                    f"{f.unrecovered_clients:>5} {_secs(f.sends_resumed_s):>6} "
                    f"{f.disconnects:>5} {f.resyncs:>6} {f.reported_gaps:>5} "
                    f"{f.send_errors:>5} {f.join_refusals:>5} {f.silent_losses:>5} {f.unheard:>5}"
                )
            lines += [f"  {f.name}: {f.detail}" for f in self.faults]
            lines.append(
                "  deliv.: until every client active at the fault received a message published "
                "after it (max; p50); unrec: active clients that never did before the next "
                "fault; sends: until every sender had an ack for a send made after the fault; "
                "lost: silent losses of messages published in the fault's window; unhrd: "
                "messages published in it, acked, that no member received."
            )
        if self.losses_by_room:
            lines += ["", f"Silent losses by room: {_counts(self.losses_by_room)}"]
        if self.loss_samples:
            lines += ["", "Silent losses (examples: client room id text published-at why)"]
            lines += [
                f"  {s.client} {s.room} {s.id} {s.text!r} {s.published_at:.3f}s {s.why}"
                for s in self.loss_samples
            ]
        for title, samples in (
            ("Duplicates", self.duplicate_samples),
            ("Out of order", self.out_of_order_samples),
            ("Double posts", self.double_post_samples),
            ("Acked, received by no member", self.unheard_samples),
        ):
            if samples:
                lines += ["", f"{title} (examples)"] + [f"  {s}" for s in samples]
        lines += ["", "Invariants"]
        lines += [
            f"  {name:<16} {'PASS' if ok else 'FAIL'}" for name, ok in self.invariants.items()
        ]
        return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "-"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


# -- the checker --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Message:
    """What the run knows of one message id: publish-time bounds and its texts."""

    lo: float = float("-inf")
    hi: float = float("inf")
    texts: set[str] = field(default_factory=set)
    received: bool = False

    def bound_ts(self, ts: int) -> None:
        self.lo = max(self.lo, ts / 1000 - MARGIN_S)
        self.hi = min(self.hi, (ts + 1) / 1000 + MARGIN_S)


class _Room:
    """A room's truth, with indexes for "newest id published (possibly / certainly) before t"."""

    def __init__(self, messages: dict[int, _Message]) -> None:
        self.messages = messages
        self.ids = sorted(messages)
        by_lo = sorted((m.lo, i) for i, m in messages.items())
        by_hi = sorted((m.hi, i) for i, m in messages.items())
        self._lo_keys = [lo for lo, _ in by_lo]
        self._hi_keys = [hi for hi, _ in by_hi]
        self._lo_max = _running_max([i for _, i in by_lo])
        self._hi_max = _running_max([i for _, i in by_hi])

    def newest_possibly_before(self, t: float) -> int | None:
        """The largest id whose publish may have come before ``t``."""
        n = bisect.bisect_left(self._lo_keys, t)
        return self._lo_max[n - 1] if n else None

    def newest_certainly_before(self, t: float) -> int | None:
        """The largest id certainly published before ``t``."""
        n = bisect.bisect_left(self._hi_keys, t)
        return self._hi_max[n - 1] if n else None

    def between(self, low: int, high: int) -> list[int]:
        """Ids ``low < id <= high``, ascending."""
        return self.ids[bisect.bisect_right(self.ids, low) : bisect.bisect_right(self.ids, high)]


def _running_max(values: list[int]) -> list[int]:
    out: list[int] = []
    best = -1
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


@dataclass(slots=True)
class _Segment:
    """One stretch of membership: from a ``joined`` to the next one or the connection's end."""

    since: int | None
    recovered: bool | None
    joined_at: float
    last: int | None = None
    ids: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Membership:
    first_last: int | None = None
    first_sent_at: float = 0.0
    position: int | None = None
    segment: _Segment | None = None
    received: set[int] = field(default_factory=set)
    claims: list[tuple[int, float]] = field(default_factory=list)  # recovered:true (since, sent)
    gaps: list[tuple[int, float]] = field(default_factory=list)  # recovered:false (since, at)
    resyncs: list[tuple[int, float]] = field(default_factory=list)  # (position then, at)
    reloads: list[tuple[int, int]] = field(default_factory=list)  # (old position, newest)

    def advance(self, value: int | None) -> None:
        if value is not None and (self.position is None or value > self.position):
            self.position = value


def check(log: RunLog) -> Report:
    """Check ``log`` against the invariants and tally the run. See the module docstring for the
    model; the result is deterministic for a given log."""
    report = Report()
    send_of = {(s.client, s.cid): s for s in log.sends}
    truth = _truth(log, send_of)
    rooms = {room: _Room(messages) for room, messages in truth.items()}

    memberships: dict[tuple[str, str], _Membership] = defaultdict(_Membership)
    received_by_client: dict[str, list[Received]] = defaultdict(list)
    open_rooms: dict[str, set[str]] = defaultdict(set)
    clients: set[str] = set()
    disconnects: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    for event in log.events:
        clients.add(event.client)
        if isinstance(event, Connected):
            report.connections += 1
        elif isinstance(event, Disconnected):
            disconnects[str(event.code)] += 1
            for name in open_rooms.pop(event.client, set()):
                memberships[event.client, name].segment = None
        elif isinstance(event, Joined):
            m = memberships[event.client, event.room]
            open_rooms[event.client].add(event.room)
            if event.since is None:
                if m.first_last is None:
                    m.first_last = event.last if event.last is not None else 0
                    m.first_sent_at = event.sent_at
                m.advance(event.last)
            elif event.recovered:
                m.claims.append((event.since, event.sent_at))
            else:
                m.gaps.append((event.since, event.at))
                report.reported_gaps += 1
            m.segment = _Segment(event.since, event.recovered, event.at)
        elif isinstance(event, JoinRefused):
            refusals[event.code] += 1
        elif isinstance(event, Received):
            _receive(report, memberships[event.client, event.room], event)
            received_by_client[event.client].append(event)
        elif isinstance(event, Resync):
            report.resyncs += 1
            m = memberships[event.client, event.room]
            if m.position is not None:
                m.resyncs.append((m.position, event.at))
        elif isinstance(event, Reloaded):
            m = memberships[event.client, event.room]
            report.reloaded += len(event.entries)
            if event.since is not None and event.newest is not None:
                m.reloads.append((event.since, event.newest))
            m.advance(event.newest)

    losses: list[tuple[float, Loss]] = []  # (published at, absolute; the loss)
    by_room: Counter[str] = Counter()
    for (client, room_name), m in sorted(memberships.items()):
        if m.first_last is None or m.position is None:
            continue  # never a member
        report.memberships += 1
        room = rooms.get(room_name)
        if room is None:
            continue  # a room without any message
        final = m.position
        for since, sent_at in m.claims:
            newest = room.newest_certainly_before(sent_at)
            if newest is not None and newest > since:
                final = max(final, newest)
        if not any(sent_at >= log.traffic_end for _, sent_at in m.claims):
            report.unsettled += 1
        excused: list[tuple[int, int]] = list(m.reloads)
        for since, joined_at in m.gaps:
            newest = room.newest_possibly_before(joined_at)
            excused.append((since, max(since, newest if newest is not None else since)))
        told: list[tuple[int, int, float]] = []  # resyncs: (position, newest before, at)
        for position, at in m.resyncs:
            newest = room.newest_possibly_before(at)
            if newest is not None and newest > position:
                told.append((position, newest, at))
        for message_id in room.between(m.first_last, final):
            message = room.messages[message_id]
            if message.hi < m.first_sent_at:
                continue  # published before the client first joined
            if message_id in m.received:
                report.owed += 1
            elif any(lo < message_id <= hi for lo, hi in excused) or any(
                lo < message_id <= hi
                and not any(since < message_id and sent > at for since, sent in m.claims)
                for lo, hi, at in told
            ):
                report.excused += 1
            else:
                report.owed += 1
                replayed = any(
                    since < message_id and message.hi < sent_at for since, sent_at in m.claims
                )
                text = min(message.texts) if message.texts else ""
                why = "replay" if replayed else "live"
                published = round(message.lo - log.started_at, 3)
                loss = Loss(client, room_name, message_id, text, published, why)
                losses.append((message.lo, loss))
                by_room[room_name] += 1

    report.clients = len(clients)
    report.rooms = len({room for _, room in memberships})
    report.duration_s = round(log.traffic_end - log.started_at, 3)
    report.disconnects_by_code = dict(disconnects)
    report.join_refusals_by_code = dict(refusals)
    report.silent_losses = len(losses)
    report.losses_by_room = dict(by_room)
    spread = losses[:: max(1, len(losses) // SAMPLES)][:SAMPLES]
    report.loss_samples = [loss for _, loss in spread]
    unheard = _tally_sends(report, log, send_of, truth)
    loss_times = [loss_at for loss_at, _ in losses]
    report.faults = _faults(log, truth, received_by_client, loss_times, unheard)
    return report


def _truth(log: RunLog, send_of: dict[tuple[str, str], Send]) -> dict[str, dict[int, _Message]]:
    """Every message id per room, with publish-time bounds and texts."""
    truth: dict[str, dict[int, _Message]] = defaultdict(dict)
    for event in log.events:
        if isinstance(event, Received):
            message = truth[event.room].setdefault(event.id, _Message())
            message.bound_ts(event.ts)
            message.texts.add(event.text)
            message.received = True
        elif isinstance(event, Reloaded):
            for entry in event.entries:
                message = truth[event.room].setdefault(entry.id, _Message())
                message.bound_ts(entry.ts)
                message.texts.add(entry.text)
    for ack in log.acks:
        send = send_of.get((ack.client, ack.cid))
        if send is None:
            continue  # an ack for nothing this client sent: not evidence of a room message
        message = truth[send.room].setdefault(ack.id, _Message())
        message.lo = max(message.lo, send.at - MARGIN_S)
        message.hi = min(message.hi, ack.at + MARGIN_S)
        message.texts.add(send.text)
    return truth


def _receive(report: Report, m: _Membership, event: Received) -> None:
    """One ``message`` frame: duplicate, order and live/recovered bookkeeping."""
    report.deliveries += 1
    segment = m.segment
    if segment is None:
        report.stray += 1
        segment = m.segment = _Segment(None, None, event.at)
    if event.id in segment.ids:
        report.duplicates += 1
        _sample(report.duplicate_samples, event, "twice in one segment")
        return
    again = event.id in m.received
    if again and not (segment.recovered and segment.since is not None and event.id > segment.since):
        report.duplicates += 1
        _sample(report.duplicate_samples, event, f"again, rejoined with since={segment.since}")
        return
    if segment.last is not None and event.id < segment.last:
        report.out_of_order += 1
        _sample(report.out_of_order_samples, event, f"after id={segment.last}")
    elif segment.since is not None and event.id <= segment.since:
        report.out_of_order += 1
        _sample(report.out_of_order_samples, event, f"at or below since={segment.since}")
    segment.last = event.id if segment.last is None else max(segment.last, event.id)
    segment.ids.add(event.id)
    if again:
        report.redelivered += 1  # replayed by a rejoin that crossed it in flight: expected
    else:
        m.received.add(event.id)
        if segment.recovered and event.ts / 1000 < segment.joined_at:
            report.delivered_recovered += 1
        else:
            report.delivered_live += 1
    m.advance(event.id)


def _sample(samples: list[str], event: Received, what: str) -> None:
    if len(samples) < SAMPLES:
        samples.append(f"{event.client} {event.room} id={event.id} at={event.at:.3f}: {what}")


def _tally_sends(
    report: Report,
    log: RunLog,
    send_of: dict[tuple[str, str], Send],
    truth: dict[str, dict[int, _Message]],
) -> list[float]:
    """Send figures and double posts; returns when the acked messages nobody received were
    published."""
    acked: dict[tuple[str, str], set[int]] = defaultdict(set)
    for ack in log.acks:
        acked[ack.client, ack.cid].add(ack.id)
        report.duplicate_acks += ack.duplicate
    report.sent = len(send_of)
    report.acked = sum(1 for key in send_of if key in acked)
    report.unacked_at_end = report.sent - report.acked
    report.send_errors_by_code = dict(Counter(e.code for e in log.send_errors))
    report.messages = sum(len(messages) for messages in truth.values())
    never: dict[tuple[str, int], str] = {}
    for key, ids in acked.items():
        send = send_of.get(key)
        if send is not None:
            never.update(
                ((send.room, i), send.text) for i in ids if not truth[send.room][i].received
            )
    report.acked_never_received = len(never)
    unheard = sorted((truth[room][i].lo, room, i, text) for (room, i), text in never.items())
    for lo, room, message_id, text in unheard[:: max(1, len(unheard) // SAMPLES)][:SAMPLES]:
        report.unheard_samples.append(
            f"{room} id={message_id} {text!r} published at {lo - log.started_at:.3f}s"
        )
    ids_of_text: dict[tuple[str, str], set[int]] = defaultdict(set)
    for room, messages in truth.items():
        for message_id, message in messages.items():
            for text in message.texts:
                ids_of_text[room, text].add(message_id)
    for (room, text), ids in sorted(ids_of_text.items()):
        if len(ids) > 1:
            report.double_posts += len(ids) - 1
            if len(report.double_post_samples) < SAMPLES:
                report.double_post_samples.append(f"{room} {text!r} ids={sorted(ids)}")
    return [lo for lo, _, _, _ in unheard]


def _faults(
    log: RunLog,
    truth: dict[str, dict[int, _Message]],
    received_by_client: dict[str, list[Received]],
    loss_times: list[float],
    unheard_times: list[float],
) -> list[FaultReport]:
    """Per fault: time to recover and what happened in its window."""
    faults = sorted(log.faults, key=lambda f: f.started_at)
    out: list[FaultReport] = []
    first_send: dict[tuple[str, str], float] = {(s.client, s.cid): s.at for s in log.sends}
    arrivals = {client: [e.at for e in got] for client, got in received_by_client.items()}
    for n, fault in enumerate(faults):
        start = fault.started_at
        end = faults[n + 1].started_at if n + 1 < len(faults) else log.traffic_end
        resumed: list[float] = []
        unrecovered = 0
        for client, got in received_by_client.items():
            times = arrivals[client]
            first = bisect.bisect_left(times, start - ACTIVE_WINDOW_S)
            active = first < len(got) and got[first].at < start
            if not active:
                continue
            after = None
            for event in got[bisect.bisect_left(times, start) :]:
                if event.at >= end:
                    break
                if truth[event.room][event.id].lo >= start:
                    after = event.at - start
                    break
            if after is None:
                unrecovered += 1
            else:
                resumed.append(after)
        senders: dict[str, float | None] = {}
        for send in log.sends:
            if start <= send.at < end:
                senders.setdefault(send.client, None)
        for ack in log.acks:
            sent = first_send.get((ack.client, ack.cid))
            if sent is not None and start <= sent < end and ack.client in senders:
                previous = senders[ack.client]
                if previous is None or ack.at < previous:
                    senders[ack.client] = ack.at
        acks = list(senders.values())
        sends_resumed = (
            max(a for a in acks if a is not None) - start
            if acks and all(a is not None for a in acks)
            else None
        )
        events = [e for e in log.events if start <= e.at < end]
        out.append(
            FaultReport(
                name=fault.name,
                at_s=round(start - log.started_at, 3),
                happened=fault.happened,
                detail=fault.detail,
                window_s=round(end - start, 3),
                deliveries_resumed_s=(
                    round(max(resumed), 3) if resumed and not unrecovered else None
                ),
                deliveries_resumed_p50_s=round(statistics.median(resumed), 3) if resumed else None,
                unrecovered_clients=unrecovered,
                sends_resumed_s=None if sends_resumed is None else round(sends_resumed, 3),
                disconnects=sum(isinstance(e, Disconnected) for e in events),
                resyncs=sum(isinstance(e, Resync) for e in events),
                reported_gaps=sum(isinstance(e, Joined) and e.recovered is False for e in events),
                send_errors=sum(start <= e.at < end for e in log.send_errors),
                join_refusals=sum(isinstance(e, JoinRefused) for e in events),
                silent_losses=sum(start <= at < end for at in loss_times),
                unheard=sum(start <= at < end for at in unheard_times),
            )
        )
    return out
