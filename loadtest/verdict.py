"""The regression verdict of ``make bench``: each row's figures now against the ones recorded
before (issue 42: a 10x fall in fan-out went unseen because nothing compared them).

Pure: no I/O, no clock. ``loadtest/bench.py`` builds the :class:`Row` objects from its run and
from ``docs/benchmarks.json``, calls :func:`judge`, prints :func:`render`, and records the run
only when :attr:`Verdict.regressed` is false (or the regression is accepted).

The contract, for each row (case key) and each of its servers:

- **Comparable** only when the row was recorded before with the same arguments (recorded
  arguments that are missing, as in results written before they were stored, never match),
  the same metric and direction, and the server has a figure in both runs. Anything else is
  ``new`` and not compared.
- **The figure**: the median over the rounds of the row's metric, now against recorded. Its
  change is *worse* by ``(then - now) / then`` when higher is better, ``(now - then) / then``
  when lower is better.
- **The ratio**: the median of the per-round ratios of the server's figure to the row's
  reference server (the last of ``Row.servers``; the two run back to back in each round, so
  the ratio cancels most of what a noisy machine does to both). Same direction as the figure.
  It counts as worse only when it is worse than recorded in every round: a round whose ratio
  is as good as the recorded median shows the rounds' spread covers the change (on a noisy
  machine, runs of unchanged code had rounds from 0.52 to 1.48 times the recorded ratio).
- A judged server is ``REGRESSED`` when its figure is worse than recorded by more than the
  tolerance **and**, where it has a ratio (it is not the reference and both runs have one),
  its ratio is worse by more than the tolerance too. A figure worse but a ratio that held is
  ``noise`` (the reference moved with it). Whatever the figures, a server whose ``missing``
  deliveries were 0 in every recorded round and are above 0 in a round now is ``REGRESSED``
  (lost deliveries).
- ``better``: the figure is better by more than the tolerance and the ratio (if any) is not
  worse by more than it; otherwise ``ok``.
- Servers in ``yardsticks`` (the tutorial baseline: not the code under test) are shown, never
  judged: ``ok`` within the tolerance, ``moved`` outside it.
- **Another machine.** A figure says how fast the machine was as much as how fast the code
  is: where the row was recorded on another machine (``Row.machine`` differs; a row recorded
  before machines were, ``None``, is of another machine than any named now), figures are shown
  but not compared. A judged server with a ratio is then judged by its ratio alone (worse by
  more than the tolerance: ``REGRESSED``); one without (the row's reference) is
  ``unjudged``. Lost deliveries are a regression on any machine. Recorded, the run is the
  new machine's reference, and the next run there is judged in full.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

Status = Literal["ok", "better", "noise", "REGRESSED", "new", "moved", "unjudged"]
DEFAULT_TOLERANCE = 0.25


@dataclass(frozen=True)
class Row:
    """One row of a run: its arguments and the per-round results of each of its servers."""

    key: str
    args: tuple[str, ...] | None  # None: not recorded (older results): never comparable
    metric: str
    higher_is_better: bool
    servers: tuple[str, ...]  # the last is the reference the others are set against
    results: Mapping[str, Sequence[Mapping[str, Any]]]  # server kind -> one dict per round
    machine: str | None = None  # where it ran (bench.machine_fingerprint); None: not known


@dataclass(frozen=True)
class Comparison:
    """One server of one row, now against recorded, and what that makes it."""

    key: str
    server: str
    metric: str
    higher_is_better: bool
    status: Status
    note: str = ""
    then: float | None = None
    now: float | None = None
    ratio_then: float | None = None
    ratio_now: float | None = None
    missing_then: float | None = None
    missing_now: float | None = None

    @property
    def change(self) -> float | None:
        """The figure's relative change (now / then - 1), whatever its direction."""
        return _relative(self.then, self.now)

    @property
    def ratio_change(self) -> float | None:
        return _relative(self.ratio_then, self.ratio_now)


@dataclass(frozen=True)
class Verdict:
    comparisons: tuple[Comparison, ...]
    tolerance: float

    @property
    def regressed_rows(self) -> list[str]:
        """The keys of the rows with a regressed server, in the order of the run."""
        keys: list[str] = []
        for c in self.comparisons:
            if c.status == "REGRESSED" and c.key not in keys:
                keys.append(c.key)
        return keys

    @property
    def regressed(self) -> bool:
        return bool(self.regressed_rows)

    def line(self) -> str:
        """``VERDICT: no regression`` or ``VERDICT: REGRESSION in N rows: key (server); …``."""
        if not self.regressed:
            return "VERDICT: no regression"
        which = []
        for key in self.regressed_rows:
            servers = [
                c.server for c in self.comparisons if c.key == key and c.status == "REGRESSED"
            ]
            which.append(f"{key} ({', '.join(servers)})")
        rows = "row" if len(which) == 1 else "rows"
        return f"VERDICT: REGRESSION in {len(which)} {rows}: {'; '.join(which)}"


def numbers(runs: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """The rounds' values of ``key`` that are numbers (not None, not a bool)."""
    return [float(r[key]) for r in runs if _is_number(r.get(key))]


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def paired_ratios(
    runs: Sequence[Mapping[str, Any]], ref_runs: Sequence[Mapping[str, Any]], metric: str
) -> list[float]:
    """Round n's figure over the reference's figure of round n, for each round both have."""
    return [
        float(run[metric]) / float(ref[metric])
        for run, ref in zip(runs, ref_runs, strict=False)
        if _is_number(run.get(metric)) and _is_number(ref.get(metric)) and ref[metric]
    ]


def worse_by(then: float, now: float, higher_is_better: bool) -> float:
    """How much worse ``now`` is than ``then``, as a fraction of ``then``: above 0 worse,
    below 0 better (-0.9: a tenth of what it was, when higher is better). From 0, any move
    is infinitely worse or better."""
    loss = (then - now) if higher_is_better else (now - then)
    if then == 0:
        return 0.0 if loss == 0 else math.copysign(math.inf, loss)
    return loss / abs(then)


def judge(
    now: Sequence[Row],
    recorded: Mapping[str, Row],
    tolerance: float = DEFAULT_TOLERANCE,
    yardsticks: Collection[str] = (),
) -> Verdict:
    """Each server of each row of ``now`` against ``recorded`` (by key), as the module's
    docstring says; ``tolerance`` is a fraction (0.25: 25 %)."""
    if tolerance < 0:
        raise ValueError("the tolerance is a fraction at least 0")
    comparisons = [
        _compare(row, recorded.get(row.key), server, tolerance, server not in yardsticks)
        for row in now
        for server in row.servers
        if server in row.results
    ]
    return Verdict(tuple(comparisons), tolerance)


def _compare(
    row: Row, before: Row | None, server: str, tolerance: float, judged: bool
) -> Comparison:
    runs = row.results.get(server, ())
    now = median(numbers(runs, row.metric))
    shown = Comparison(row.key, server, row.metric, row.higher_is_better, "new", now=now)
    reason = _not_comparable(row, before, server)
    if before is None or reason:
        return replace(shown, note=reason)
    then_runs = before.results[server]
    then = median(numbers(then_runs, row.metric))
    if now is None or then is None:
        return replace(shown, note="no figure now" if now is None else "no figure recorded")
    reference = row.servers[-1]
    ratio_now = ratio_then = None
    rounds: list[float] = []  # this run's ratio in each round
    if server != reference:
        rounds = paired_ratios(runs, row.results.get(reference, ()), row.metric)
        ratio_now = median(rounds)
        ratio_then = median(paired_ratios(then_runs, before.results.get(reference, ()), row.metric))
    missing_now = max(numbers(runs, "missing"), default=None)
    missing_then = max(numbers(then_runs, "missing"), default=None)
    shown = replace(
        shown, then=then, ratio_then=ratio_then, ratio_now=ratio_now,
        missing_then=missing_then, missing_now=missing_now,
    )  # fmt: skip
    figure = worse_by(then, now, row.higher_is_better)
    if not judged:
        note = "the yardstick: not judged"
        return replace(shown, status="moved" if abs(figure) > tolerance else "ok", note=note)
    if missing_then == 0 and missing_now is not None and missing_now > 0:
        note = f"lost deliveries: missing 0 -> {missing_now:,.0f}"
        return replace(shown, status="REGRESSED", note=note)
    ratio: float | None = None  # how much worse the ratio is; None: the figure alone decides
    if ratio_now is not None and ratio_then is not None:
        ratio = worse_by(ratio_then, ratio_now, row.higher_is_better)
        if ratio > tolerance and any(
            worse_by(ratio_then, r, row.higher_is_better) <= 0 for r in rounds
        ):
            # A round as good as recorded: the rounds' spread covers the change, which
            # counts as none (a ratio worse in every round still counts).
            ratio = 0.0
            shown = replace(shown, note=f"a round's ratio held ({_fmt(ratio_then)} or better)")
    elif server != reference:
        shown = replace(shown, note="no ratio: the figure alone")
    if before.machine != row.machine:
        return _on_another_machine(shown, before.machine, reference, ratio, tolerance)
    if figure > tolerance and ratio is None:
        return replace(shown, status="REGRESSED")
    by_ratio = ratio or 0.0
    if figure > tolerance and by_ratio > tolerance:
        return replace(shown, status="REGRESSED", note=f"its ratio to {reference} is worse too")
    if figure > tolerance:
        note = f"the ratio to {reference} held: the machine moved, not the code"
        return replace(shown, status="noise", note=note)
    if figure < -tolerance and by_ratio <= tolerance:
        return replace(shown, status="better")
    if by_ratio > tolerance:
        return replace(
            shown, status="ok", note=f"the figure held, the ratio fell ({reference} faster)"
        )
    return replace(shown, status="ok")


def _on_another_machine(
    shown: Comparison,
    machine_then: str | None,
    reference: str,
    ratio: float | None,
    tolerance: float,
) -> Comparison:
    """A judged server of a row recorded on another machine: by how much worse its ratio is
    (``ratio``), if it has one."""
    where = f"recorded on another machine ({machine_then or 'not named'})"
    if ratio is None:
        return replace(shown, status="unjudged", note=f"{where}: its figure alone says nothing")
    note = f"{where}: judged by its ratio to {reference} alone"
    if shown.note:
        note = f"{note}; {shown.note}"
    if ratio > tolerance:
        return replace(shown, status="REGRESSED", note=note)
    return replace(shown, status="better" if ratio < -tolerance else "ok", note=note)


def _not_comparable(row: Row, before: Row | None, server: str) -> str:
    if before is None:
        return "new row"
    if before.args is None:
        return "no arguments recorded"
    if before.args != row.args:
        return "arguments changed"
    if (before.metric, before.higher_is_better) != (row.metric, row.higher_is_better):
        return "metric changed"
    if server not in before.results:
        return "new server"
    return ""


def render(verdict: Verdict) -> str:
    """The verdict as a Markdown table (readable as text too) and its final ``VERDICT`` line."""
    lines = [
        f"Against the figures recorded before (tolerance {verdict.tolerance:.0%}; a row "
        "regresses when its figure and its ratio to the row's reference are both worse by "
        "more than that, or it lost deliveries; against a row recorded on another machine, "
        "when its ratio is):",
        "",
        "| row | server | figure | then → now (change) | ratio then → now (change) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in verdict.comparisons:
        direction = "" if c.higher_is_better else " (lower is better)"
        figure = f"{_fmt(c.then)} → {_fmt(c.now)} ({_pct(c.change)})"
        if c.status == "new":
            figure = f"n/a → {_fmt(c.now)}"
        ratio = "n/a"
        if c.ratio_then is not None or c.ratio_now is not None:
            ratio = f"{_fmt(c.ratio_then)} → {_fmt(c.ratio_now)} ({_pct(c.ratio_change)})"
        status = f"**{c.status}**" if c.status == "REGRESSED" else c.status
        note = f": {c.note}" if c.note else ""
        lines.append(
            f"| `{c.key}` | {c.server} | {c.metric}{direction} | {figure} | {ratio} | "
            f"{status}{note} |"
        )
    lines += ["", verdict.line()]
    return "\n".join(lines)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _relative(then: float | None, now: float | None) -> float | None:
    if then is None or now is None or then == 0:
        return None
    return now / then - 1


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _pct(change: float | None) -> str:
    return "n/a" if change is None else f"{change:+.0%}"
