"""A replica's own memory is bounded: the heartbeat memo (what it last wrote
per node, the base of delta heartbeats) by size and age, and dropped when a
node is unregistered; 1,000 ghost nodes with 200-id rosters, once gone,
leave the replica's memory where it was."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

from scheduler import Policy
from scheduler.aio import AsyncScheduler
from scheduler.calls import Beat
from scheduler.plans import BeatMemo
from tests.helpers import hb

pytestmark = pytest.mark.real_only


def beat(n: int = 0) -> Beat:
    return Beat(f"1:{n}", "i1", "e:1", {}, "d", frozenset({f"s{n}"}))


def test_the_memo_is_bounded_by_size_and_age() -> None:
    now = [0.0]
    memo = BeatMemo(max_entries=3, max_age_s=10, clock=lambda: now[0])
    for i in range(5):
        memo[f"n{i}"] = beat(i)
        now[0] += 1
    assert sorted(memo) == ["n2", "n3", "n4"]  # the ones written longest ago went
    memo["n2"] = beat(9)  # rewritten: now the youngest
    memo["n5"] = beat(5)
    assert sorted(memo) == ["n2", "n4", "n5"]
    now[0] = 14.5  # n4 (written at 4) is older than 10 s; n2 and n5 (at 5) are not yet
    assert memo.get("n4") is None and "n4" not in memo
    assert memo.get("n5") is not None
    now[0] += 20
    memo["n6"] = beat(6)  # a write drops what aged meanwhile
    assert sorted(memo) == ["n6"] and list(memo.written) == ["n6"]
    assert memo.pop("n6") is not None and memo.pop("n6") is None and not memo.written


def test_ghost_nodes_leave_nothing_behind_once_unregistered(real_url: str) -> None:
    """Before: 1,000 ghosts with 200-id rosters took a replica from 59 to
    125 MB, never freed after they were unregistered."""

    async def run() -> tuple[int, int, int, int]:
        s = await AsyncScheduler.connect(
            real_url, cell="ghosts", policy=Policy(), overwrite_policy=True
        )
        try:
            await s.heartbeat(hb("warm", roster=[f"w{i}" for i in range(200)]))
            await s.unregister("warm", "boot-1")
            gc.collect()
            tracemalloc.start()
            baseline = tracemalloc.get_traced_memory()[0]
            for start in range(0, 1000, 50):
                await asyncio.gather(
                    *(
                        s.heartbeat(hb(f"g{n}", roster=[f"g{n}-{i}" for i in range(200)]))
                        for n in range(start, start + 50)
                    )
                )
            held = len(s.beats)
            gc.collect()
            full = tracemalloc.get_traced_memory()[0]
            for start in range(0, 1000, 50):
                await asyncio.gather(
                    *(s.unregister(f"g{n}", "boot-1") for n in range(start, start + 50))
                )
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            return baseline, full, after, held
        finally:
            await s.close()

    baseline, full, after, held = asyncio.run(run())
    print(f"memo: baseline {baseline}, 1,000 ghosts {full}, unregistered {after} bytes traced")
    assert held == 1000
    grown = full - baseline
    assert grown > 10 << 20, grown  # (the memo held the rosters: about 22 MB here)
    # back to the baseline, within 2% of what the ghosts took
    assert after - baseline < grown * 0.02, (baseline, full, after)
