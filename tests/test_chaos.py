"""The chaos harness (``make chaos``): its invariant checker on hand-built event logs, each a
story of clients, joins and messages with a known answer; then a short run of the real thing
(redis-server and two gunicorns, clients chatting through faults)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.invariants import (
    Ack,
    Connected,
    Disconnected,
    Fault,
    HistoryEntry,
    Joined,
    JoinRefused,
    Received,
    Reloaded,
    Report,
    Resync,
    RunLog,
    Send,
    check,
)
from tests.processes import ROOT


class Story:
    """A hand-built run in room ``r``: message ids published (and acked to their sender) at
    given times, and what each client saw, in order. Times are seconds; traffic ends at 50."""

    def __init__(self) -> None:
        self.log = RunLog(started_at=0.0, traffic_end=50.0)
        self.at: dict[int, float] = {}
        self.text: dict[int, str] = {}

    def publish(
        self, sender: str, message_id: int, at: float, acked: bool = True, text: str = ""
    ) -> None:
        text = text or f"{sender}#{message_id}"
        cid = f"{sender}-{message_id}"
        self.at[message_id], self.text[message_id] = at, text
        self.log.sends.append(Send(sender, "r", cid, text, at - 0.01))
        if acked:
            self.log.acks.append(Ack(sender, cid, message_id, False, at + 0.01))

    def connect(self, client: str, at: float, conn: int = 1) -> None:
        self.log.events.append(Connected(client, conn, 0, at))

    def close(self, client: str, at: float, conn: int = 1) -> None:
        self.log.events.append(Disconnected(client, conn, 1012, at))

    def join(
        self,
        client: str,
        at: float,
        last: int | None = None,
        since: int | None = None,
        recovered: bool | None = None,
    ) -> None:
        if since is None and last is None:
            last = 0
        self.log.events.append(Joined(client, "r", since, recovered, last, at - 0.005, at))

    def recv(self, client: str, message_id: int, at: float) -> None:
        ts = int(self.at[message_id] * 1000)
        text = self.text[message_id]
        self.log.events.append(Received(client, "r", message_id, text, ts, at))

    def reload(self, client: str, since: int, ids: list[int], at: float) -> None:
        entries = tuple(HistoryEntry(i, self.text[i], int(self.at[i] * 1000)) for i in ids)
        newest = max(ids, default=None)
        self.log.events.append(Reloaded(client, "r", since, newest, entries, at))

    def check(self) -> Report:
        return check(self.log)


def two_members() -> Story:
    """a and b joined r at t=1 (last 0); a published 10 at t=2 and 11 at t=3."""
    story = Story()
    for client in ("a", "b"):
        story.connect(client, 0.5)
        story.join(client, 1.0)
    story.publish("a", 10, 2.0)
    story.publish("a", 11, 3.0)
    return story


def test_a_clean_run_passes_and_adds_up() -> None:
    story = two_members()
    for client in ("a", "b"):
        story.recv(client, 10, 2.1)
        story.recv(client, 11, 3.1)
    report = story.check()
    assert (report.silent_losses, report.duplicates, report.out_of_order) == (0, 0, 0)
    assert (report.sent, report.acked, report.unacked_at_end) == (2, 2, 0)
    assert (report.messages, report.deliveries, report.owed) == (2, 4, 4)
    assert (report.delivered_live, report.memberships, report.clients) == (4, 2, 2)
    assert report.passed and "PASS" in report.text() and "FAIL" not in report.text()


def test_a_message_skipped_live_is_a_silent_loss() -> None:
    story = two_members()
    story.publish("a", 12, 4.0)
    for client, ids in (("a", [10, 11, 12]), ("b", [10, 12])):
        for message_id in ids:
            story.recv(client, message_id, story.at[message_id] + 0.1)
    report = story.check()
    assert report.silent_losses == 1 and not report.passed
    loss = report.loss_samples[0]
    assert (loss.client, loss.room, loss.id, loss.text, loss.why) == ("b", "r", 11, "a#11", "live")
    assert report.losses_by_room == {"r": 1}
    assert "no silent loss   FAIL" in report.text()


def test_a_loss_at_the_tail_is_found_by_the_settle_and_only_then() -> None:
    """b missed the last message; without a rejoin after traffic stopped nothing says b was
    owed it (counted unsettled); a settle answered recovered:true that does not replay it is
    a silent loss."""
    story = two_members()
    story.recv("a", 10, 2.1)
    story.recv("a", 11, 3.1)
    story.recv("b", 10, 2.1)
    unsettled = story.check()
    assert unsettled.silent_losses == 0 and unsettled.unsettled == 2

    story.join("b", 60.0, since=10, recovered=True)  # replays nothing: 11 is gone
    report = story.check()
    assert report.silent_losses == 1 and report.loss_samples[0].why == "replay"
    assert report.unsettled == 1  # a never settled


def test_a_reported_gap_is_not_a_loss() -> None:
    """b rejoined after missing 11 and 12 and heard recovered:false; it reloaded the room, which
    also gave it 13 (published after the join: it never came live, the reload has it)."""
    story = two_members()
    story.publish("a", 12, 4.0)
    story.publish("a", 13, 5.02)
    story.publish("a", 14, 6.0)
    story.recv("b", 10, 2.1)
    story.close("b", 2.5)
    story.connect("b", 5.0, conn=2)
    story.join("b", 5.01, since=10, recovered=False)
    story.reload("b", 10, [10, 11, 12, 13], 5.05)
    story.recv("b", 14, 6.1)
    for message_id in (10, 11, 12, 13, 14):
        story.recv("a", message_id, story.at[message_id] + 0.1)
    report = story.check()
    assert report.silent_losses == 0 and report.passed
    assert (report.reported_gaps, report.excused, report.reloaded) == (1, 3, 4)


def test_a_gap_with_nothing_to_reload_excuses_only_what_came_before_the_join() -> None:
    """Redis lost everything: the reload is empty. What was published before the ``joined``
    is excused; a message published after it is owed live, and missing it is a loss."""
    story = two_members()
    story.publish("a", 12, 6.0)
    story.recv("b", 10, 2.1)
    story.close("b", 2.5)
    story.connect("b", 5.0, conn=2)
    story.join("b", 5.01, since=10, recovered=False)
    story.reload("b", 10, [], 5.05)
    story.join("b", 60.0, since=10, recovered=True)  # the settle
    report = story.check()
    assert [loss.id for loss in report.loss_samples] == [12]
    assert report.excused == 1  # 11


def test_a_resync_then_recovered_false_is_a_reported_gap() -> None:
    story = two_members()
    story.recv("b", 10, 2.1)
    story.log.events.append(Resync("b", "r", 3.5))
    story.join("b", 3.6, since=10, recovered=False)
    story.reload("b", 10, [10, 11], 3.7)
    story.join("b", 60.0, since=11, recovered=True)
    report = story.check()
    assert (report.silent_losses, report.resyncs, report.reported_gaps) == (0, 1, 1)


def test_a_resync_reports_what_came_before_it_until_a_rejoin_says_recovered() -> None:
    """b missed 11, then got ``resync``: told. Its rejoin was refused and it got 12 live:
    11 stays excused. Had the rejoin been answered recovered:true, the replay owed it 11."""
    story = two_members()
    story.publish("a", 12, 4.0)
    story.recv("b", 10, 2.1)
    story.log.events.append(Resync("b", "r", 3.5))
    story.log.events.append(JoinRefused("b", "r", "broker_unavailable", 3.6))
    story.recv("b", 12, 4.1)
    report = story.check()
    assert (report.silent_losses, report.excused, report.resyncs) == (0, 1, 1)

    story = two_members()
    story.publish("a", 12, 4.0)
    story.recv("b", 10, 2.1)
    story.log.events.append(Resync("b", "r", 3.5))
    story.join("b", 3.6, since=10, recovered=True)  # replays nothing: 11 is gone
    story.recv("b", 12, 4.1)
    report = story.check()
    assert [(loss.id, loss.why) for loss in report.loss_samples] == [(11, "replay")]


def test_a_message_recovered_after_a_reconnect_counts_as_recovered() -> None:
    story = two_members()
    story.publish("a", 12, 6.0)
    story.recv("b", 10, 2.1)
    story.close("b", 2.5)
    story.connect("b", 5.0, conn=2)
    story.join("b", 5.01, since=10, recovered=True)
    story.recv("b", 11, 5.02)
    story.recv("b", 12, 6.1)
    story.join("b", 60.0, since=12, recovered=True)
    report = story.check()
    assert report.silent_losses == 0 and report.passed
    assert (report.delivered_recovered, report.delivered_live) == (1, 2)


def test_a_replay_missing_a_message_is_a_silent_loss() -> None:
    """As when Redis came back from its AOF without the last second of messages: the rejoin
    says recovered:true, the replay lacks one."""
    story = two_members()
    story.publish("a", 12, 4.0)
    story.recv("b", 10, 2.1)
    story.close("b", 2.5)
    story.join("b", 5.01, since=10, recovered=True)
    story.recv("b", 12, 5.02)
    report = story.check()
    assert [(loss.id, loss.why) for loss in report.loss_samples] == [(11, "replay")]


def test_a_duplicate_is_found() -> None:
    story = two_members()
    story.recv("b", 10, 2.1)
    story.recv("b", 10, 2.2)  # twice on one connection
    assert story.check().duplicates == 1

    story = two_members()
    story.recv("b", 10, 2.1)
    story.recv("b", 11, 3.1)
    story.close("b", 3.5)
    story.join("b", 4.0, since=11, recovered=True)
    story.recv("b", 11, 4.01)  # replayed although not after since
    report = story.check()
    assert report.duplicates == 1 and not report.passed
    assert "since=11" in report.duplicate_samples[0]


def test_out_of_order_is_found() -> None:
    story = two_members()
    story.recv("b", 11, 3.1)
    story.recv("b", 10, 3.2)
    report = story.check()
    assert (report.out_of_order, report.duplicates, report.silent_losses) == (1, 0, 0)
    assert not report.passed and "after id=11" in report.out_of_order_samples[0]

    story = two_members()
    story.recv("b", 11, 3.1)
    story.close("b", 3.5)
    story.join("b", 4.0, since=11, recovered=True)
    story.recv("b", 10, 4.01)  # a replay must start after since
    assert story.check().out_of_order == 1


def test_a_rejoin_crossing_live_messages_redelivers_them_without_a_duplicate() -> None:
    """A resync makes b rejoin with since on the same connection while 11 is in flight: 11
    arrives live, then again in the replay. Expected by the protocol (a client drops it)."""
    story = two_members()
    story.publish("a", 12, 3.2)
    story.recv("b", 10, 2.1)
    story.log.events.append(Resync("b", "r", 2.9))
    story.recv("b", 11, 3.05)
    story.join("b", 3.1, since=10, recovered=True)
    story.recv("b", 11, 3.11)
    story.recv("b", 12, 3.3)
    report = story.check()
    assert (report.redelivered, report.duplicates, report.out_of_order) == (1, 0, 0)
    assert report.silent_losses == 0 and report.resyncs == 1


def test_only_messages_published_while_a_member_are_owed() -> None:
    story = Story()
    story.publish("a", 5, 0.5)
    story.publish("a", 10, 2.0)
    story.join("a", 0.4)
    story.recv("a", 5, 0.6)
    story.recv("a", 10, 2.1)
    story.join("b", 1.0, last=5)  # 5 came before b
    story.join("c", 1.0, last=0)  # Redis lost its ids: last says 0, yet 5 came before c
    story.recv("b", 10, 2.1)
    story.recv("c", 10, 2.1)
    report = story.check()
    assert report.silent_losses == 0 and report.owed == 4

    story.publish("a", 11, 3.0)  # after every join: owed to all, received by a only
    story.recv("a", 11, 3.1)
    for client in ("b", "c"):
        story.join(client, 60.0, since=10, recovered=True)
    assert story.check().silent_losses == 2


def test_an_acked_message_that_nobody_received() -> None:
    story = two_members()
    story.publish("a", 12, 4.0)
    for client in ("a", "b"):
        story.recv(client, 10, 2.1)
        story.recv(client, 12, 4.1)
    report = story.check()
    assert report.acked_never_received == 1 and "id=11 'a#11'" in report.unheard_samples[0]
    assert sorted((loss.client, loss.id) for loss in report.loss_samples) == [
        ("a", 11),
        ("b", 11),
    ]


def test_a_refused_join_does_not_count_as_membership() -> None:
    story = Story()
    story.publish("a", 10, 2.0)
    story.join("a", 1.0)
    story.recv("a", 10, 2.1)
    story.log.events.append(JoinRefused("b", "r", "broker_unavailable", 1.0))
    report = story.check()
    assert (report.memberships, report.silent_losses) == (1, 0)
    assert report.join_refusals_by_code == {"broker_unavailable": 1}


def test_double_posts_and_duplicate_acks_are_counted_not_failed() -> None:
    """Redis lost its dedup keys: a retried cid was published again under a new id."""
    story = two_members()
    story.publish("a", 12, 4.0, text="a#11")
    story.log.acks.append(Ack("a", "a-11", 11, True, 3.5))
    for client in ("a", "b"):
        for message_id in (10, 11, 12):
            story.recv(client, message_id, story.at[message_id] + 0.1)
    report = story.check()
    assert (report.double_posts, report.duplicate_acks) == (1, 1)
    assert report.passed and "'a#11' ids=[11, 12]" in report.double_post_samples[0]


def test_time_to_recover_from_a_fault() -> None:
    story = two_members()
    story.join("c", 1.0)
    story.publish("a", 20, 9.0)
    story.publish("a", 21, 10.5)
    story.publish("a", 22, 12.0)
    for client in ("a", "b", "c"):
        story.recv(client, 20, 9.1)
    story.recv("a", 21, 10.6)
    story.recv("b", 22, 12.1)  # b missed 21, published within the fault's window
    story.close("b", 12.5)
    story.log.faults.append(Fault("worker_kill", 10.0, 10.4, True, "SIGKILL"))
    story.log.faults.append(Fault("drain", 30.0, 35.0, False, "did not exit"))
    report = story.check()
    kill, drain = report.faults
    assert (kill.name, kill.at_s, kill.happened, kill.window_s) == ("worker_kill", 10.0, True, 20)
    assert kill.unrecovered_clients == 1 and kill.deliveries_resumed_s is None  # c never did
    assert kill.deliveries_resumed_p50_s == pytest.approx(1.35)  # a 0.6, b 2.1
    assert (kill.disconnects, kill.silent_losses, drain.silent_losses) == (1, 1, 0)
    assert kill.sends_resumed_s == pytest.approx(0.51)  # a sent 21 at 10.49, acked at 10.51
    assert not drain.happened and "did not exit" in report.text()

    story.recv("c", 22, 12.2)
    kill = story.check().faults[0]
    assert kill.unrecovered_clients == 0 and kill.deliveries_resumed_s == pytest.approx(2.2)


def test_the_report_serializes() -> None:
    story = two_members()
    story.recv("b", 11, 3.1)
    report = story.check()
    data = json.loads(json.dumps(report.as_dict()))
    assert data["passed"] is False and data["invariants"]["no silent loss"] is False
    assert data["silent_losses"] == 1 and data["loss_samples"][0]["id"] == 10


def test_the_raw_log_round_trips(tmp_path: Path) -> None:
    """``--events`` writes what ``--recheck`` reads back: the same report."""
    from loadtest.chaos import load_log, save_log

    story = two_members()
    story.recv("b", 10, 2.1)
    story.log.events.append(Resync("b", "r", 2.5))
    story.join("b", 2.6, since=10, recovered=False)
    story.reload("b", 10, [10, 11], 2.7)
    story.log.faults.append(Fault("drain", 1.5, 2.0, True, "SIGTERM"))
    save_log(story.log, tmp_path / "events.jsonl")
    loaded = load_log(tmp_path / "events.jsonl")
    assert loaded == story.log
    assert check(loaded).as_dict() == story.check().as_dict()


# -- the real thing ------------------------------------------------------------------------------


async def _chaos(*args: str, limit_s: float) -> tuple[int, str, str]:
    """``python -m loadtest.chaos ARGS``: its status, stdout and stderr. At the deadline it is
    SIGTERMed (it stops what it started), then killed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.chaos", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(limit_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(20):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
        raise AssertionError(f"the chaos run took over {limit_s} s:\n{err.decode()}") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.timeout(180)
async def test_chaos_smoke_run_loses_nothing_silently(tmp_path: Path) -> None:
    """40 clients in 8 rooms over two gunicorns, one Redis and one PostgreSQL (the store),
    through a pub/sub kill, a Redis SIGKILL and restart from its AOF, a 3 s Redis SIGSTOP, a
    worker SIGKILL and a PostgreSQL SIGKILL: no silent loss, duplicate or reordering, real
    traffic (sends acked, messages delivered) with every fault verified and recovered from,
    and every acked message stored once. A quarter of the clients are on the HTTP fallback
    transport (a stream on one instance, each POST to either)."""
    out = tmp_path / "chaos.json"
    status, text, err = await _chaos("--smoke", "--store", "--json", str(out), limit_s=160)
    context = f"exit status {status}\n{text}\n{err[-3000:]}"
    assert out.exists(), f"the chaos run wrote no report:\n{context}"
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["facts"]["sse_clients"] == 10, context
    assert report["sent"] > 500 and report["acked"] >= 0.99 * report["sent"], context
    assert report["deliveries"] > 2000 and report["delivered_live"] > 2000, context
    assert report["owed"] > 2000 and report["memberships"] >= 40, context
    faults = {f["name"]: f for f in report["faults"]}
    assert set(faults) == {
        "pubsub_kill", "redis_kill_aof", "redis_stop", "worker_kill", "postgres_kill",
    }, context  # fmt: skip
    assert all(f["happened"] for f in faults.values()), context
    assert faults["worker_kill"]["disconnects"] > 0, context  # its clients were cut off
    # Service came back within each fault's window: everyone heard new messages again.
    assert all(f["deliveries_resumed_s"] is not None for f in faults.values()), context
    assert (report["silent_losses"], report["duplicates"], report["out_of_order"]) == (
        0,
        0,
        0,
    ), context
    assert report["unacked_at_end"] == 0 and report["unsettled"] == 0, context
    store = report["facts"]["store"]
    assert store["archive_drained"] and store["acked"] > 500, context
    assert store["stored"] >= store["acked"], context  # retries stored once, by their first id
    assert (store["missing"], store["stored_twice"], store["lost_with_emptied_redis"]) == (
        0, 0, 0,
    ), context  # fmt: skip
    assert status == 0, context


async def replicated_chaos_smoke(mode: str, tmp_path: Path) -> None:
    """``--smoke --store`` on Redis with replicas (``mode``: ``--sentinel`` or ``--cluster``):
    a master SIGKILLed under 40 clients' traffic, a worker killed, PostgreSQL killed; no silent
    loss, duplicate or reordering, and every acked message stored (acks waited for a replica,
    so none may be lost with the master)."""
    out = tmp_path / "chaos.json"
    status, text, err = await _chaos("--smoke", mode, "--store", "--json", str(out), limit_s=160)
    context = f"exit status {status}\n{text}\n{err[-3000:]}"
    assert out.exists(), f"the chaos run wrote no report:\n{context}"
    report: dict[str, Any] = json.loads(out.read_text())
    faults = {f["name"]: f for f in report["faults"]}
    assert set(faults) == {"master_kill", "worker_kill", "postgres_kill"}, context
    assert all(f["happened"] for f in faults.values()), context
    assert report["acked"] > 300 and report["deliveries"] > 1000, context
    invariants = (report["silent_losses"], report["duplicates"], report["out_of_order"])
    assert invariants == (0, 0, 0), context
    store = report["facts"]["store"]
    assert store["archive_drained"], context
    assert (store["missing"], store["stored_twice"]) == (0, 0), context
    assert status == 0, context
