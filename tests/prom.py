"""Reading Prometheus expositions in tests: scrape, parse, and look values up."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable

import httpx2 as httpx
from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One parsed exposition: every sample, by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    @property
    def names(self) -> set[str]:
        """Every sample name (histograms' ``_bucket``, ``_sum``, ``_count`` included)."""
        return {name for name, _, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
        return sum(
            value
            for sample, sample_labels, value in self.samples
            if sample == name and labels.items() <= sample_labels.items()
        )

    def series(self, name: str) -> list[dict[str, str]]:
        return [labels for sample, labels, _ in self.samples if sample == name]


async def scrape(url: str) -> Scrape:
    async with httpx.AsyncClient() as http:
        response = await http.get(url, timeout=5)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return Scrape(response.text)


async def scrape_until(
    url: str, condition: Callable[[Scrape], bool], timeout: float = 10
) -> Scrape:
    """Scrape until ``condition`` holds (the workers publish their counts once a second)."""
    last: Scrape | None = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                last = await scrape(url)
                if condition(last):
                    return last
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(
            f"metrics never matched; last scrape:\n{last.text if last else None}"
        ) from None


def promtool() -> str:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: `make test` installs Debian's prometheus package"
    return binary


async def run_promtool(*args: str, stdin: str | None = None, cwd: str | None = None) -> str:
    """Run ``promtool ARGS``; fail the test with its output unless it exits 0."""
    proc = await asyncio.create_subprocess_exec(
        promtool(), *args, cwd=cwd,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, _ = await proc.communicate(stdin.encode() if stdin is not None else None)
    output = out.decode(errors="replace")
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output
