"""``make attack`` (loadtest/attack.py): its checker on hand-built observations, each with a
known answer; then the smoke run of the real thing (gunicorn + Redis + PostgreSQL in jwt mode,
and the embedded server in guest mode, restarted), which must find no cell that leaks."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.attack import (
    API_MESSAGES,
    BLIND,
    CONNECT,
    ERROR,
    EXISTENCE,
    HTTP_INBOX,
    IDENTITIES,
    LEAK,
    LIVE,
    MEMBERSHIP,
    NO_ANSWER,
    PATHS,
    REMOVE_MEMBER,
    REMOVE_NON_MEMBER,
    DeploymentReport,
    DeploymentSpec,
    Exchange,
    Observation,
    Policy,
    Secrets,
    applicable,
    as_json,
    check,
    judge,
    policy,
    text_report,
)
from tests.processes import ROOT

ROOM, UNUSED = "priv-0badc0de", "priv-5ca1ab1e"
SECRETS = Secrets(
    ROOM,
    {"marker": "MARKER-1", "title": "TITLE-1", "topic": "TOPIC-1"},
    {"dm marker": "DMMARK-1"},
    {"owner-x": "owner", "member-x": "member", "removed-x": "removed"},
)
STRANGER = Policy(reads_room=False, reads_dm=False, stranger=True)
FORMER = Policy(reads_room=False, reads_dm=False)  # removed, banned...: never compared
MEMBER = Policy(reads_room=True, reads_dm=True, must_see=("marker",))


def seen(*answers: str, label: str = "history before", **fields: Any) -> Observation:
    """What ``outsider-x`` got: ``answers`` to one request about the private room."""
    defaults: dict[str, Any] = {"supplied": (ROOM,)}
    return Observation(
        "outsider", "history before", 0, "outsider-x", (Exchange(label, answers),),
        **(defaults | fields),
    )  # fmt: skip


def kinds(observation: Observation, rule: Policy) -> list[str]:
    return [finding.kind for finding in check(observation, rule, SECRETS)]


def refused(room: str) -> str:
    return json.dumps({"type": "error", "code": "not_found", "message": f"room '{room}' not found"})


def test_any_byte_of_a_marker_title_or_topic_is_a_leak() -> None:
    message = '{"type":"inbox","conversations":[{"room":"%s","last":{"text":"x MARKER-1 y"}}]}'
    assert kinds(seen(message % ROOM), FORMER) == [LEAK]
    assert kinds(seen('{"type":"rooms","rooms":[{"title":"TITLE-1"}]}'), FORMER) == [LEAK]
    assert kinds(seen("HTTP 200 the topic: TOPIC-1"), FORMER) == [LEAK]
    assert kinds(seen("close 4003 banned"), FORMER) == []
    [finding] = check(seen(message % ROOM), FORMER, SECRETS)
    assert finding.what == "the room's marker" and "MARKER-1" in finding.detail


def test_a_members_id_leaks_unless_it_is_the_identitys_own_or_supplied_by_it() -> None:
    frame = '{"type":"presence","user":"member-x"}'
    assert kinds(seen(frame), FORMER) == [LEAK]
    [finding] = check(seen(frame), FORMER, SECRETS)
    assert finding.what == "the user id of the member"
    assert kinds(seen(frame, supplied=(ROOM, "member-x")), FORMER) == []
    own = Observation("removed", "inbox", 1, "removed-x",
                      (Exchange("inbox", ('{"user":"removed-x"}',)),))  # fmt: skip
    assert kinds(own, FORMER) == []
    # A member may see every member and every marker.
    assert kinds(seen(frame, '{"text":"MARKER-1"}'), MEMBER) == []


def test_the_dms_marker_leaks_to_anyone_but_its_two_users() -> None:
    dm = '{"type":"history","with":"member-x","messages":[{"text":"DMMARK-1"}]}'
    assert kinds(seen(dm, supplied=("member-x",)), FORMER) == [LEAK]
    service = Policy(reads_room=True, reads_dm=False)
    assert kinds(seen(dm), service) == [LEAK]
    assert kinds(seen(dm, '"MARKER-1"'), Policy(reads_room=True, reads_dm=True)) == []


def test_a_stranger_must_get_what_a_never_used_name_gets() -> None:
    forbidden = '{"type":"error","code":"forbidden","message":"room \'%s\' is private"}'
    empty = '{"type":"history","room":"%s","more":false,"messages":[]}'
    oracle = seen(forbidden % ROOM, control=(Exchange("history before", (empty % UNUSED,)),),
                  control_room=UNUSED)  # fmt: skip
    assert kinds(oracle, STRANGER) == [EXISTENCE]
    [finding] = check(oracle, STRANGER, SECRETS)
    assert finding.what == "history before" and "<ROOM>" in finding.detail
    assert ROOM not in finding.detail and UNUSED not in finding.detail
    # The same answer once the names are replaced: no oracle.
    alike = seen(refused(ROOM), control=(Exchange("history before", (refused(UNUSED),)),),
                 control_room=UNUSED)  # fmt: skip
    assert kinds(alike, STRANGER) == []
    # Silence against an answer is a difference too (a read stored for an unused name).
    silent = seen(forbidden % ROOM, label="read", control=(Exchange("read", ()),),
                  control_room=UNUSED)  # fmt: skip
    assert kinds(silent, STRANGER) == [EXISTENCE]
    # A former member knows the room exists: its answers are not compared.
    assert kinds(oracle, FORMER) == []


def test_remove_of_a_member_and_of_a_non_member_must_answer_alike() -> None:
    def remove(member: str, non_member: str, rule: Policy) -> list[str]:
        observation = Observation(
            "outsider", "remove", 0, "outsider-x",
            (Exchange(REMOVE_MEMBER, (member,)), Exchange(REMOVE_NON_MEMBER, (non_member,))),
            supplied=(ROOM, "bystander-x", "nobody-x"),
        )  # fmt: skip
        return kinds(observation, rule)

    forbidden = '{"type":"error","code":"forbidden","message":"not allowed"}'
    not_member = '{"type":"error","code":"not_found","message":"\'%s\' is not a member of \'%s\'"}'
    assert remove(forbidden, not_member % ("nobody-x", ROOM), FORMER) == [MEMBERSHIP]
    # The names the identity gave are replaced before comparing: these two are alike.
    assert remove(not_member % ("bystander-x", ROOM), not_member % ("nobody-x", ROOM), FORMER) == []
    assert remove(refused(ROOM), refused(ROOM), STRANGER) == []
    # A member may learn who the members are.
    assert remove(forbidden, not_member % ("nobody-x", ROOM), Policy(True, True)) == []


def test_a_control_that_sees_no_marker_proves_nothing() -> None:
    assert kinds(seen('{"type":"history","messages":[]}'), MEMBER) == [BLIND]
    assert kinds(seen('{"type":"history","messages":[{"text":"MARKER-1 hi"}]}'), MEMBER) == []
    assert kinds(seen("x"), Policy(True, True, must_see=("dm marker",))) == [BLIND]


def test_a_probe_that_broke_or_got_no_answer_fails_the_cell() -> None:
    broken = Observation("outsider", "read", 1, "outsider-x", (), error="OSError: refused")
    assert kinds(broken, STRANGER) == [ERROR]
    assert kinds(seen(f"{NO_ANSWER} 5 s"), FORMER) == [ERROR]


def test_which_cells_exist_and_what_each_identity_may_see() -> None:
    assert applicable("namesake", CONNECT, "guest") and not applicable("namesake", CONNECT, "jwt")
    for identity in ("narrowed", "expired"):
        assert applicable(identity, LIVE, "jwt") and not applicable(identity, LIVE, "guest")
    assert applicable("service", API_MESSAGES, "jwt")
    assert not applicable("service", "history before", "jwt")
    assert not applicable("outsider", API_MESSAGES, "jwt")
    # Every path has its cells: some identity on some mode.
    assert all(any(applicable(i, p, m) for i in IDENTITIES for m in ("jwt", "guest"))
               for p in PATHS)  # fmt: skip
    assert policy("member", HTTP_INBOX, "jwt").must_see == ("marker", "dm marker")
    assert policy("member", HTTP_INBOX, "guest").must_see == ()  # per-user HTTP needs jwt
    assert policy("service", API_MESSAGES, "jwt").must_see == ("marker",)
    assert policy("outsider", "read", "jwt").stranger
    assert not policy("removed", "read", "jwt").stranger


def test_cells_take_the_worst_finding_of_their_instances_and_the_report_names_them() -> None:
    leak = seen('{"text":"MARKER-1"}')
    fine = Observation("outsider", "history before", 1, "outsider-x",
                       (Exchange("history before", ('{"type":"history"}',)),))  # fmt: skip
    cells = judge([(leak, FORMER), (fine, FORMER)], SECRETS, "guest")
    by = {(c.identity, c.path): c for c in cells}
    cell = by["outsider", "history before"]
    assert cell.status == LEAK and sorted(cell.instances) == [0, 1] and not cell.passed
    assert by["narrowed", "read"].status == "n/a"  # jwt only
    assert by["outsider", "read"].status == ERROR  # applicable, never probed
    spec = DeploymentSpec("d", "a deployment", "guest", "sqlite", 0)
    report = DeploymentReport(spec, cells)
    text = text_report([report])
    assert "outsider x history before [instance 0] LEAK: the room's marker" in text
    assert "MARKER-1" in text
    shown = as_json([report])
    assert shown["passed"] is False
    [cell_json] = [c for c in shown["deployments"][0]["cells"]
                   if (c["identity"], c["path"]) == ("outsider", "history before")]  # fmt: skip
    assert cell_json["status"] == LEAK and cell_json["observed"][0]["instance"] == 0
    json.dumps(shown)  # serializable


# -- the real thing ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_attack_smoke_run_finds_no_leak(tmp_path: Path) -> None:
    """``python -m loadtest.attack --smoke``: every identity on every path at least once, on
    gunicorn + Redis + PostgreSQL (jwt) and the embedded server (guest, restarted): no cell
    leaks, and the controls (the member, the service) see the markers. Each failing cell is
    named, with what leaked."""
    out = tmp_path / "attack.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.attack", "--smoke", "--json", str(out), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(150):
            stdout, stderr = await proc.communicate()
    except TimeoutError:
        proc.send_signal(signal.SIGTERM)  # it stops what it started
        async with asyncio.timeout(20):
            stdout, stderr = await proc.communicate()
        raise AssertionError(f"the attack run took over 150 s:\n{stderr.decode()}") from None
    context = f"{stdout.decode()}\n{stderr.decode()[-3000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    deployments = report["deployments"]
    assert [d["error"] for d in deployments] == [None, None], context
    covered = {(c["identity"], c["path"]) for d in deployments for c in d["cells"]
               if c["instances"]}  # fmt: skip
    for identity in IDENTITIES:
        for path in PATHS:
            if any(applicable(identity, path, mode) for mode in ("jwt", "guest")):
                assert (identity, path) in covered, f"{identity} x {path} not probed\n{context}"
    failing = [
        f"{d['name']} / {c['identity']} x {c['path']}: {c['status']}: "
        + "; ".join(dict.fromkeys(f["what"] for f in c["findings"]))
        for d in deployments
        for c in d["cells"]
        if c["status"] not in ("ok", "n/a")
    ]
    assert not failing, "cells that fail:\n" + "\n".join(failing) + f"\n\n{context}"
    assert proc.returncode == 0, context
