"""``python -m loadtest.search``: how fast search answers over a big store, and what indexing
costs archiving, on this machine.

What runs (loopback only, started and ended here, by PID): PostgreSQL (``initdb`` +
``postgres``, as ``nobody`` when run as root, ``fsync`` on) on a free port, and SQLite files in
a temporary directory. For each database:

1. **Archiving with and without the index**: ``--compare`` messages stored through
   :class:`app.store.messages.MessageStore` in batches of ``--batch`` (what the archivers
   call), once with search indexing (the archiver queues, and
   :class:`app.store.search.SearchIndexer` runs beside it, in the same process and database,
   as a worker runs them) and once without (``CHAT_SEARCH_INDEX=false``), each into a fresh
   database, timed; ``--repeats`` rounds, each running both back to back, in turn first
   (this machine is shared and noisy), reported as the median messages a second of each,
   the ratio as ``make bench`` takes it (the median of the rounds' ratios, with their range: a slow
   spell hits both runs of a round), every run, and how long the indexer took after the
   last batch to catch up (``index_catch_up_s``, median).
2. **Search latency**: ``--messages`` messages (words drawn from a vocabulary of 5,000 with
   a Zipf-like skew, 4 to 16 words each; 1,000 rooms of which 5 % private, and direct
   conversations) stored with the index, then ``--queries`` searches timed one at a time
   through :class:`app.store.search.SearchStore` (the SQL that narrows to what the user may
   read included) by a user who is a member of some private rooms: one word (common, middling
   or rare) or two, newest first, a page of 20. Reported: p50, p95 and p99 in milliseconds.

Goals (issue 37): p95 ≤ 50 ms over 1,000,000 messages; archiving with the index at least
0.8 times as fast as without.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.conversations.names import direct
from app.settings import Settings
from app.store.database import engine_for, migrate
from app.store.messages import MessageStore, StoredMessage
from app.store.rooms import Role, Room, RoomStore
from app.store.search import SearchIndexer, SearchStore
from tests.processes import PostgresServer

VOCABULARY = 5_000
ROOMS = 1_000
USERS = 2_000
SEARCHER = "user7"


def _words() -> list[str]:
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    return sorted(words)


WORDS = _words()
# Zipf-like: the word of rank r drawn with weight 1/(r+1) (accumulated once: ``choices``
# would add the 5,000 weights up again on every call).
CUMULATIVE_WEIGHTS = list(itertools.accumulate(1 / (rank + 1) for rank in range(VOCABULARY)))


def _messages(count: int, start_id: int) -> list[StoredMessage]:
    rng = random.Random(start_id)
    base = 1_795_000_000_000
    out = []
    for n in range(count):
        if n % 20 == 0:  # one in twenty: a direct message
            conversation = direct(f"user{rng.randrange(USERS)}", f"user{rng.randrange(USERS)}")
        else:
            conversation = f"room-{rng.randrange(ROOMS)}"
        text = " ".join(rng.choices(WORDS, cum_weights=CUMULATIVE_WEIGHTS, k=rng.randint(4, 16)))
        out.append(StoredMessage(conversation, start_id + n, f"user{n % USERS}", text, base + n))
    return out


async def _store(engine: AsyncEngine, count: int, batch: int, index: bool) -> tuple[float, float]:
    """Store ``count`` messages in batches (made before the clock starts, 200,000 at most at
    a time), with the search indexer running beside the archiving as a worker runs it (same
    process and database, CHAT_SEARCH_INDEX_* defaults) when ``index``: the archiving rate in
    messages a second, and how long the indexer took to catch up after the last batch."""
    store = MessageStore(engine, search_index=index)
    defaults = Settings.model_fields
    indexer = SearchIndexer(engine)
    stop = asyncio.Event()

    async def indexing() -> None:  # as app.store.running.RunningStore._keep_indexing
        limit = defaults["search_index_batch_max"].default
        while not stop.is_set():
            if await indexer.index(limit) < limit:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(defaults["search_index_interval_s"].default):
                        await stop.wait()

    task = asyncio.create_task(indexing()) if index else None
    spent = 0.0
    try:
        for chunk in range(0, count, 200_000):
            made = _messages(min(200_000, count - chunk), 1_000_000 + chunk)
            started = time.perf_counter()
            for first in range(0, len(made), batch):
                await store.add(made[first : first + batch])
            spent += time.perf_counter() - started
        started = time.perf_counter()
        if task is not None:
            stop.set()
            await task
            while await indexer.index(10_000):
                pass
        catch_up = time.perf_counter() - started
    finally:
        if task is not None and not task.done():
            task.cancel()
    return count / spent, catch_up


async def _rooms(engine: AsyncEngine) -> None:
    """5 % of the rooms private; the searcher a member of a tenth of those."""
    rooms = RoomStore(engine)
    for n in range(0, ROOMS, 20):
        name = f"room-{n}"
        await rooms.create(Room(name, True, created_by="owner", created_ms=1))
        if n % 200 == 0:
            await rooms.set_role(name, SEARCHER, Role.MEMBER, 1)


def _queries(count: int) -> list[str]:
    rng = random.Random(11)
    queries = []
    for n in range(count):
        kind = n % 4
        if kind == 0:
            queries.append(rng.choice(WORDS[:50]))  # common
        elif kind == 1:
            queries.append(rng.choice(WORDS[500:1500]))  # middling
        elif kind == 2:
            queries.append(rng.choice(WORDS[3000:]))  # rare
        else:
            queries.append(f"{rng.choice(WORDS[:200])} {rng.choice(WORDS[200:2000])}")
    return queries


async def _latencies(engine: AsyncEngine, queries: list[str]) -> dict[str, float]:
    search = SearchStore(engine)
    await search.search(SEARCHER, queries[0], None, "newest", 20, 0)  # warm the cache
    timings = []
    for query in queries:
        started = time.perf_counter()
        await search.search(SEARCHER, query, None, "newest", 20, 0)
        timings.append((time.perf_counter() - started) * 1000)
    cuts = statistics.quantiles(timings, n=100)
    return {
        "p50_ms": round(cuts[49], 1),
        "p95_ms": round(cuts[94], 1),
        "p99_ms": round(cuts[98], 1),
    }


async def _database(
    kind: str, folder: Path, name: str, server: PostgresServer | None
) -> AsyncEngine:
    if server is None:
        url = f"sqlite:///{folder}/{name}.db"
    else:
        url = await server.create_database(name)
    engine = engine_for(url)
    await migrate(engine)
    return engine


async def run(
    kind: str, messages: int, compare: int, batch: int, queries: int, repeats: int
) -> dict[str, Any]:
    server = PostgresServer(fsync=True) if kind == "postgresql" else None
    with tempfile.TemporaryDirectory(prefix="hubbub-search-") as folder:
        if server is not None:
            await server.start()
        try:
            runs: dict[str, list[float]] = {"without_index": [], "with_index": []}
            catch_ups = []
            for attempt in range(repeats):
                # Both in every round, in turn first (a slow spell, or a drift over the run,
                # hits both).
                order = [("without_index", False), ("with_index", True)]
                for label, index in order if attempt % 2 == 0 else order[::-1]:
                    engine = await _database(kind, Path(folder), f"{label}_{attempt}", server)
                    try:
                        rate, catch_up = await _store(engine, compare, batch, index)
                        runs[label].append(rate)
                        if index:
                            catch_ups.append(catch_up)
                    finally:
                        await engine.dispose()
            rates = {label: round(statistics.median(values)) for label, values in runs.items()}
            pairs = zip(runs["with_index"], runs["without_index"], strict=True)
            ratios = [with_index / without for with_index, without in pairs]
            engine = await _database(kind, Path(folder), "big", server)
            try:
                await _rooms(engine)
                started = time.perf_counter()
                await _store(engine, messages, batch, True)  # and indexed, all of it
                filled_s = time.perf_counter() - started
                latency = await _latencies(engine, _queries(queries))
            finally:
                await engine.dispose()
        finally:
            if server is not None:
                await server.stop()
    return {
        "database": kind, "messages": messages, "queries": queries,
        "archive_per_s": rates,
        "archive_ratio": round(statistics.median(ratios), 2),
        "archive_ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
        "archive_runs_per_s": {label: [round(v) for v in values] for label, values in runs.items()},
        "index_catch_up_s": round(statistics.median(catch_ups), 2),
        "fill_s": round(filled_s, 1), **latency,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--compare", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument(
        "--repeats", type=int, default=9, help="archiving rounds (medians reported)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    results = []
    for kind in kinds:
        result = asyncio.run(
            run(kind, args.messages, args.compare, args.batch, args.queries, args.repeats)
        )
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
