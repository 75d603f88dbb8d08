"""`schedctl doctor` reads a large cell in pages (issue #31).

The doctor read whole keys in one command: a ZRANGE of the nodes zset (and
of idx-seen, the expiry set and every bucket), about 40 ms of Redis at
100,000 nodes, Redis serving nothing else.  Here, on a real Redis, a cell
whose nodes zset, idx-seen and one tied bucket each hold several pages: no
command the doctor sends outside its pipelines (which only read keys it
found small) answers more than a page, and it still finds the cell
consistent, and still finds a foreign member of the large bucket.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from scheduler import Policy, Scheduler
from scheduler.ops.doctor import CHUNK, SCAN_COUNT, doctor
from tests.helpers import hb

pytestmark = pytest.mark.real_only

NODES = 3 * CHUNK + 17  # three pages and some


class Recording(redis.Redis):
    """A client that notes how many items each direct command answered."""

    largest: int = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        out = super().execute_command(*args, **options)
        items = out[1] if str(args[0]).upper().endswith("SCAN") else out
        if isinstance(items, list | dict | set):
            self.largest = max(self.largest, len(items))
        return out


def test_the_doctor_reads_a_large_cell_in_pages(real_url: str) -> None:
    client = Recording.from_url(real_url)
    s = Scheduler(client, cell="paged")
    s.sync_policy(Policy(report_ttl_ms=3_600_000), overwrite=True)
    pipe = client.pipeline(transaction=False)
    for i in range(NODES):
        # one shape and no load: every node in one tied bucket
        call = s.ops.heartbeat(hb(f"p{i:05d}", cpu=16, mem_gib=64))
        s.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    bucket = client.hget(s.keys.node("p00000"), "idx")
    assert bucket
    bucket_key = s.keys.base + "idx-bucket:" + bucket.decode()
    assert client.zcard(bucket_key) == NODES
    client.largest = 0
    r = doctor(s)
    assert r.ok, r.findings
    assert r.nodes == NODES
    # (a SCAN page may run a little past COUNT; never the whole key)
    assert 0 < client.largest <= 2 * SCAN_COUNT, client.largest
    # the large bucket is still read whole: a member no record places there is found
    client.zadd(bucket_key, {"ghost": 0})
    r = doctor(s)
    assert any(f.key == bucket_key and "ghost" in f.problem for f in r.findings), r.findings
