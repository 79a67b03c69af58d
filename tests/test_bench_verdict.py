"""``make bench``'s regression verdict (loadtest/verdict.py) on synthetic results, and the
record-or-reject step (loadtest/bench.py ``settle``) on scratch files: issue 42's 10x fall in
fan-out must fail the run and leave the good figures recorded."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loadtest.bench import BEGIN, END, Case, machine_fingerprint, settle
from loadtest.verdict import Row, judge, render, worse_by

FANOUT = ("fanout", "--subscribers", "1000", "--rate", "1000")


def _runs(metric: str, values: list[float], **extra: float) -> list[dict[str, Any]]:
    return [{metric: value, "missing": 0, **extra} for value in values]


def _row(
    hubbub: list[float],
    baseline: list[float],
    *,
    metric: str = "deliveries_per_s",
    higher_is_better: bool = True,
    args: tuple[str, ...] | None = FANOUT,
    hubbub_missing: float = 0,
) -> Row:
    return Row(
        "fanout-1000", args, metric, higher_is_better, ("hubbub", "baseline"),
        {"hubbub": _runs(metric, hubbub, missing=hubbub_missing),
         "baseline": _runs(metric, baseline)},
    )  # fmt: skip


def _status(now: Row, before: Row, tolerance: float = 0.25) -> dict[str, str]:
    verdict = judge([now], {before.key: before}, tolerance, yardsticks={"baseline"})
    return {c.server: c.status for c in verdict.comparisons}


BEFORE = _row([500_000, 520_000, 510_000], [100_000, 105_000, 98_000])


def test_a_tenfold_fall_with_its_ratio_is_a_regression() -> None:
    now = _row([50_000, 52_000, 51_000], [100_000, 104_000, 99_000])
    verdict = judge([now], {BEFORE.key: BEFORE}, yardsticks={"baseline"})
    (hubbub,) = [c for c in verdict.comparisons if c.server == "hubbub"]
    assert hubbub.status == "REGRESSED"
    assert hubbub.change == pytest.approx(51_000 / 510_000 - 1)
    assert hubbub.ratio_then == pytest.approx(5.1, rel=0.02)
    assert hubbub.ratio_now == pytest.approx(0.51, rel=0.02)
    assert verdict.regressed and verdict.regressed_rows == ["fanout-1000"]
    assert verdict.line() == "VERDICT: REGRESSION in 1 row: fanout-1000 (hubbub)"
    text = render(verdict)
    assert "**REGRESSED**" in text and text.endswith(verdict.line())
    assert "510,000 → 51,000 (-90%)" in text


def test_a_fall_the_baseline_shares_is_noise() -> None:
    """The machine slowed both servers: the figure fell 40 %, the ratio held."""
    now = _row([300_000, 310_000, 306_000], [60_000, 63_000, 58_800])
    assert _status(now, BEFORE) == {"hubbub": "noise", "baseline": "moved"}
    verdict = judge([now], {BEFORE.key: BEFORE}, yardsticks={"baseline"})
    assert not verdict.regressed and verdict.line() == "VERDICT: no regression"


def test_the_baseline_alone_falling_is_never_a_regression() -> None:
    now = _row([500_000, 520_000, 510_000], [10_000, 10_500, 9_800])
    assert _status(now, BEFORE) == {"hubbub": "ok", "baseline": "moved"}


def test_a_tripled_p99_is_a_regression() -> None:
    before = _row([8.0, 9.0, 8.5], [1_400, 1_500, 1_450], metric="p99_ms", higher_is_better=False)
    now = _row([25.0, 27.0, 26.0], [1_420, 1_480, 1_460], metric="p99_ms", higher_is_better=False)
    assert _status(now, before) == {"hubbub": "REGRESSED", "baseline": "ok"}
    # A p99 that fell by two thirds is better, not worse.
    assert _status(before, now) == {"hubbub": "better", "baseline": "ok"}


def test_lost_deliveries_are_a_regression_whatever_the_rate() -> None:
    now = _row([510_000, 515_000, 505_000], [100_000, 104_000, 99_000], hubbub_missing=1000)
    verdict = judge([now], {BEFORE.key: BEFORE}, yardsticks={"baseline"})
    (hubbub,) = [c for c in verdict.comparisons if c.server == "hubbub"]
    assert hubbub.status == "REGRESSED" and "missing 0 -> 1,000" in hubbub.note
    assert verdict.regressed


def test_changed_or_unknown_arguments_are_not_compared() -> None:
    fell = _row([50_000, 52_000, 51_000], [100_000, 104_000, 99_000])
    changed = _row([50_000], [100_000], args=(*FANOUT, "--sample-every", "50"))
    assert _status(changed, BEFORE) == {"hubbub": "new", "baseline": "new"}
    legacy = _row([500_000], [100_000], args=None)  # recorded before arguments were stored
    assert _status(fell, legacy) == {"hubbub": "new", "baseline": "new"}
    verdict = judge([changed, fell], {})
    assert not verdict.regressed and {c.note for c in verdict.comparisons} == {"new row"}
    assert "arguments changed" in render(judge([changed], {BEFORE.key: BEFORE}))


def test_better_is_better() -> None:
    now = _row([900_000, 950_000, 920_000], [100_000, 101_000, 99_000])
    assert _status(now, BEFORE) == {"hubbub": "better", "baseline": "ok"}


def test_the_tolerance_is_the_threshold() -> None:
    now = _row([400_000, 410_000, 405_000], [100_000, 105_000, 98_000])  # about -20 %
    assert _status(now, BEFORE)["hubbub"] == "ok"
    assert _status(now, BEFORE, tolerance=0.1)["hubbub"] == "REGRESSED"
    assert worse_by(100, 50, higher_is_better=True) == pytest.approx(0.5)
    assert worse_by(10, 30, higher_is_better=False) == pytest.approx(2.0)
    assert worse_by(0, 5, higher_is_better=True) < 0 < worse_by(0, 5, higher_is_better=False)


EPYC, XEON = "AMD EPYC 7B13, 2 cores", "Intel(R) Xeon(R) Processor, 2 cores"


def _own(
    servers: tuple[str, str], first: list[float], second: list[float], machine: str | None
) -> Row:
    """A row whose reference is one of ours (Hubbub on Redis against Hubbub alone): the
    reference has no ratio, its figure alone is judged."""
    return Row(
        "redis-rtt", ("rtt", "--clients", "100"), "messages_per_s", True, servers,
        {servers[0]: _runs("messages_per_s", first), servers[1]: _runs("messages_per_s", second)},
        machine,
    )  # fmt: skip


def test_figures_of_another_machine_are_not_compared() -> None:
    """Both halved on a slower machine: the reference, judged on its figure alone, is not
    judged there; the other server is judged by its ratio, which held."""
    servers = ("hubbub-redis", "hubbub")
    before = _own(servers, [40_000, 41_000, 42_000], [44_000, 45_000, 46_000], EPYC)
    slower = _own(servers, [15_000, 16_000, 15_500], [17_000, 17_500, 18_000], XEON)
    verdict = judge([slower], {before.key: before})
    assert {c.server: c.status for c in verdict.comparisons} == {
        "hubbub-redis": "ok",
        "hubbub": "unjudged",
    }
    assert not verdict.regressed
    assert "recorded on another machine (AMD EPYC 7B13, 2 cores)" in render(verdict)
    # The same figures on the machine that recorded them are a regression of the reference.
    same = _own(servers, [15_000, 16_000, 15_500], [17_000, 17_500, 18_000], EPYC)
    assert {c.server: c.status for c in judge([same], {before.key: before}).comparisons} == {
        "hubbub-redis": "noise",
        "hubbub": "REGRESSED",
    }
    # A row recorded before machines were is of another machine than any named now.
    unnamed = _own(servers, [40_000, 41_000, 42_000], [44_000, 45_000, 46_000], None)
    assert _status(slower, unnamed) == {"hubbub-redis": "ok", "hubbub": "unjudged"}


def test_on_another_machine_the_ratio_alone_decides() -> None:
    before = replace(BEFORE, machine=EPYC)
    # A faster machine: the figure rose 40 %, but Hubbub fell to the baseline's level.
    fell = replace(_row([700_000, 710_000, 705_000], [700_000, 690_000, 710_000]), machine=XEON)
    assert _status(fell, before) == {"hubbub": "REGRESSED", "baseline": "moved"}
    held = replace(_row([250_000, 260_000, 255_000], [50_000, 52_000, 49_000]), machine=XEON)
    assert _status(held, before) == {"hubbub": "ok", "baseline": "moved"}
    lost = replace(
        _row([500_000, 520_000, 510_000], [100_000, 105_000, 98_000], hubbub_missing=3),
        machine=XEON,
    )  # fmt: skip
    assert _status(lost, before)["hubbub"] == "REGRESSED"


def test_a_ratio_is_worse_only_when_every_round_says_so() -> None:
    """Rounds spread 0.6 to 1.2 times the recorded ratio (a noisy machine, unchanged code):
    the median is 40 % worse, one round is not: no regression, on this machine or another."""
    before = _own(("hubbub-nginx", "hubbub"), [42_900, 42_000, 42_750], [47_000] * 3, XEON)
    spread = _own(("hubbub-nginx", "hubbub"), [10_300, 9_650, 15_560], [16_500] * 3, XEON)
    assert _status(spread, before) == {"hubbub-nginx": "noise", "hubbub": "REGRESSED"}
    elsewhere = replace(spread, machine=EPYC)
    verdict = judge([elsewhere], {before.key: before})
    (nginx,) = [c for c in verdict.comparisons if c.server == "hubbub-nginx"]
    assert nginx.status == "ok" and "a round's ratio held" in nginx.note
    # Worse in every round, it is worse.
    fell = _own(("hubbub-nginx", "hubbub"), [9_000, 9_500, 9_200], [16_500] * 3, EPYC)
    assert _status(fell, before)["hubbub-nginx"] == "REGRESSED"


# The record-or-reject step, on scratch files.


def _case(key: str, hubbub: list[float], baseline: list[float], machine: str | None = None) -> Case:
    """A row as recorded (on this machine unless ``machine`` says another)."""
    args = ["fanout", "--subscribers", "1000", "--rate", "1000"]
    case = Case(key, f"title of {key}", args, ["hubbub", "baseline"], "deliveries_per_s")
    case.machine = machine or machine_fingerprint()
    case.results = {
        "hubbub": _runs("deliveries_per_s", hubbub),
        "baseline": _runs("deliveries_per_s", baseline),
    }
    return case


def _recorded(out: Path, *cases: Case) -> dict[str, Any]:
    raw = {case.key: case.entry() for case in cases}
    out.with_suffix(".json").write_text(json.dumps(raw))
    out.write_text(f"# Benchmarks\n\n{BEGIN}\nthe good figures\n{END}\n\nhand-written\n")
    return raw


def _settle(out: Path, run: list[Case], before: dict[str, Any], **kw: Any) -> int:
    known = [_case("fanout-1000", [], []), _case("rtt-closed", [], [])]
    return settle(run, before, out, rounds=3, started=0.0, known=known, **kw)


def test_a_regressed_run_is_rejected_and_the_good_figures_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "benchmarks.md"
    before = _recorded(out, _case("fanout-1000", [500_000, 510_000, 520_000], [1e5, 1e5, 1e5]))
    doc, raw = out.read_text(), out.with_suffix(".json").read_text()
    fell = _case("fanout-1000", [50_000, 51_000, 52_000], [1e5, 1e5, 1e5])

    assert _settle(out, [fell], before) == 1
    assert "VERDICT: REGRESSION in 1 row: fanout-1000 (hubbub)" in capsys.readouterr().out
    assert out.read_text() == doc and out.with_suffix(".json").read_text() == raw
    rejected = tmp_path / "bench" / "rejected-run.md"
    assert "**REGRESSED**" in rejected.read_text()
    rejected_raw = json.loads((tmp_path / "bench" / "rejected-run.json").read_text())
    assert rejected_raw["fanout-1000"]["results"]["hubbub"][0]["deliveries_per_s"] == 50_000

    # --accept records it anyway, and the doc shows the verdict it was accepted with.
    assert _settle(out, [fell], before, accept=True) == 0
    text = out.read_text()
    assert "**REGRESSED**" in text and "Recorded with `--accept`" in text
    assert text.endswith("hand-written\n") and "the good figures" not in text
    recorded = json.loads(out.with_suffix(".json").read_text())
    assert recorded["fanout-1000"]["results"]["hubbub"][1]["deliveries_per_s"] == 51_000
    assert "an intended cost, which the change that made it explains" in text

    # With a reason, the reason is what the doc says.
    why = "the yardstick runs 30 % faster on this machine; Hubbub's figures held."
    assert _settle(out, [fell], before, accept=True, why=why) == 0
    text = out.read_text()
    assert f"Recorded with `--accept` despite the regression: {why}" in text
    assert "an intended cost" not in text


def test_an_only_run_keeps_the_other_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "benchmarks.md"
    fanout = _case("fanout-1000", [500_000, 510_000, 520_000], [1e5, 1e5, 1e5])
    rtt = _case("rtt-closed", [47_000, 46_000, 48_000], [46_000, 45_000, 47_000], EPYC)
    rtt.recorded_at = "2026-11-24 09:44 UTC"
    before = _recorded(out, fanout, rtt)
    before["legacy-row"] = {"hubbub": [{"deliveries_per_s": 1.0}]}  # kept, though unknown
    again = _case("fanout-1000", [505_000, 515_000, 510_000], [1e5, 1e5, 1e5])

    assert _settle(out, [again], before) == 0
    assert capsys.readouterr().out.rstrip().endswith("VERDICT: no regression")
    recorded = json.loads(out.with_suffix(".json").read_text())
    assert set(recorded) == {"fanout-1000", "rtt-closed", "legacy-row"}
    assert recorded["rtt-closed"] == json.loads(json.dumps(rtt.entry()))
    assert recorded["fanout-1000"]["args"] == again.args
    text = out.read_text()
    assert "| title of rtt-closed | hubbub |" in text  # still in the doc
    # said to be from before, and from another machine
    assert "`rtt-closed` (2026-11-24 09:44 UTC, on AMD EPYC 7B13, 2 cores)" in text
    assert "| `fanout-1000` | hubbub | deliveries_per_s | 510,000 → 510,000 (+0%)" in text


def test_a_run_on_another_machine_becomes_its_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded on another machine, a row whose figures all fell together is recorded with
    this machine's name; from then on its figures are judged here."""
    out = tmp_path / "benchmarks.md"
    before = _recorded(out, _case("fanout-1000", [500_000, 510_000, 520_000], [1e5] * 3, EPYC))
    slower = _case("fanout-1000", [250_000, 255_000, 260_000], [5e4] * 3)
    assert _settle(out, [slower], before) == 0
    assert "judged by its ratio to baseline alone" in capsys.readouterr().out
    recorded = json.loads(out.with_suffix(".json").read_text())
    assert recorded["fanout-1000"]["machine"] == machine_fingerprint()
    fell = _case("fanout-1000", [25_000, 25_500, 26_000], [5e4] * 3)
    assert _settle(out, [fell], recorded) == 1
    assert "VERDICT: REGRESSION in 1 row: fanout-1000 (hubbub)" in capsys.readouterr().out
