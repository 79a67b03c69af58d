"""CPU time the hypervisor took from the benchmark's cores while a measurement ran.

On a virtual machine the host may run other guests on the physical core behind one of ours;
Linux counts the time our core wanted to run and could not as ``steal`` in ``/proc/stat``.
A measurement during which the host took a few percent of a core is a measurement of the
host: on this project's shared 2-core VM, rounds of ``rtt-2000`` with 8 to 28 % of a core
stolen had p99s of 11 to 57 ms where the same server's clean rounds had under 1 ms, whichever
server it was (docs/benchmarks.md, 2026-12-07 20:45). :func:`measured_with_little_steal`
measures again when that happens, a bounded number of times.

Where ``/proc/stat`` has no steal (bare metal, or not Linux) every share reads 0: nothing is
ever measured again.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")
# The fields of a `cpuN` line, in order: user nice system idle iowait irq softirq steal
# (guest and guest_nice follow; they are already counted in user and nice).
_STEAL_FIELD = 7
_COUNTED_FIELDS = 8


@dataclass(frozen=True)
class CpuTimes:
    """One core's counters, in clock ticks since boot."""

    steal: int
    total: int


def cpu_times(cpus: Iterable[int], stat: Path = PROC_STAT) -> dict[int, CpuTimes]:
    """The counters of each core of ``cpus`` that ``stat`` lists (cores it does not list, or a
    ``stat`` that cannot be read, are left out)."""
    wanted = {f"cpu{cpu}": cpu for cpu in cpus}
    times: dict[int, CpuTimes] = {}
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return times
    for line in lines:
        name, _, rest = line.partition(" ")
        if name not in wanted:
            continue
        fields = [int(value) for value in rest.split()[:_COUNTED_FIELDS]]
        steal = fields[_STEAL_FIELD] if len(fields) > _STEAL_FIELD else 0
        times[wanted[name]] = CpuTimes(steal, sum(fields))
    return times


def steal_percent(before: dict[int, CpuTimes], after: dict[int, CpuTimes]) -> float:
    """The largest share, in percent, of any one core's time between the two readings that
    the hypervisor took; 0.0 for cores without two readings or without time between them."""
    worst = 0.0
    for cpu, first in before.items():
        last = after.get(cpu)
        if last is None or last.total <= first.total:
            continue
        worst = max(worst, 100.0 * (last.steal - first.steal) / (last.total - first.total))
    return worst


def measured_with_little_steal(
    measure: Callable[[], dict[str, Any]],
    cpus: Iterable[int],
    max_steal_percent: float,
    retries: int,
    label: str,
    stat: Path = PROC_STAT,
) -> dict[str, Any]:
    """``measure()``'s result, with ``steal_percent``: the worst share of ``cpus``' time stolen
    while it ran. Measured again, up to ``retries`` more times, while that share is over
    ``max_steal_percent``; the last measurement is kept (its plot is the one on disk),
    ``steal_retries`` says how many were thrown away and ``steal_max_percent`` the limit it
    was held to. Each one thrown away is said on stderr, with ``label``."""
    cores = list(cpus)
    attempt = 0
    while True:
        before = cpu_times(cores, stat)
        result = measure()
        stolen = steal_percent(before, cpu_times(cores, stat))
        result["steal_percent"] = round(stolen, 2)
        result["steal_retries"] = attempt
        result["steal_max_percent"] = max_steal_percent
        if stolen <= max_steal_percent or attempt >= retries:
            return result
        attempt += 1
        print(
            f"{label}: {stolen:.1f} % of a core stolen by the host "
            f"(over {max_steal_percent:g} %): measured again ({attempt}/{retries})",
            file=sys.stderr,
            flush=True,
        )
