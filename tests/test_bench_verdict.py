"""``make bench``'s regression verdict (loadtest/verdict.py) on synthetic results, and the
record-or-reject step (loadtest/bench.py ``settle``) on scratch files: issue 42's 10x fall in
fan-out must fail the run and leave the good figures recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadtest.bench import BEGIN, END, Case, settle
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


# The record-or-reject step, on scratch files.


def _case(key: str, hubbub: list[float], baseline: list[float]) -> Case:
    args = ["fanout", "--subscribers", "1000", "--rate", "1000"]
    case = Case(key, f"title of {key}", args, ["hubbub", "baseline"], "deliveries_per_s")
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


def test_an_only_run_keeps_the_other_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "benchmarks.md"
    fanout = _case("fanout-1000", [500_000, 510_000, 520_000], [1e5, 1e5, 1e5])
    rtt = _case("rtt-closed", [47_000, 46_000, 48_000], [46_000, 45_000, 47_000])
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
    assert "`rtt-closed` (2026-11-24 09:44 UTC)" in text  # said to be from before
    assert "| `fanout-1000` | hubbub | deliveries_per_s | 510,000 → 510,000 (+0%)" in text
