"""How the locality defaults were chosen: a small replay through the real
scripts, ``python -m bench.locality_defaults [--minutes M] [--seed S]``.

Not the issue's full replay (``python -m bench locality``, issue #32 point
6, three replicas and the five alternatives): one synchronous client on one
redis-server, sweeping ``locality.weight`` and ``locality.max_pressure_gap``
against ``least_loaded`` without locality on the same arrivals.

- 24 nodes: 8 each of 16, 64 and 192 CPUs, 4 GiB of memory a CPU, a cache
  of 24 GiB each with LRU eviction that records and forgets its artifacts in
  the index (RecordP2pArtifact / ForgetP2pArtifact) as a node does.
- 20 templates, Zipf(1.1) popularity, two artifacts each of 0.25 to 2 GiB.
- Poisson arrivals to about 70 % of the fleet's CPUs (2 CPUs, 8 GiB a
  sandbox), lifetimes exponential with a mean of 5 minutes, heartbeats every
  5 s with rosters, simulated time (the cell's drill clock).

Per setting: warm starts (the node held every artifact), GiB pulled, the
peak pressure any node reached at a heartbeat, refusals.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from scheduler import Heartbeat, NodeSnapshot, NoNodesAvailable, Policy, Request, Scheduler
from scheduler.domain.policy import Locality
from scheduler.domain.records import LocalityRequirement
from scheduler.testing.redis_server import RedisServer

GIB = 1 << 30
SHAPES = [16] * 8 + [64] * 8 + [192] * 8
CACHE = 24 * GIB
CPU, MEM = 2, 8 * GIB
LIFETIME_S = 300.0
BEAT_S = 5.0


@dataclass
class Node:
    node_id: str
    cpu: int
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)  # key -> bytes, LRU first
    running: dict[str, float] = field(default_factory=dict)  # sandbox -> end time


def templates(rng: random.Random, n: int = 20) -> list[list[tuple[str, int]]]:
    return [[(f"t{i}/a{j}", rng.randint(1, 8) * GIB // 4) for j in range(2)] for i in range(n)]


def zipf(rng: random.Random, n: int, s: float = 1.1) -> int:
    weights = [1 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights)[0]


def replay(server: RedisServer, loc: Locality, minutes: float, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    tpls = templates(rng)
    s = Scheduler(server.client(), cell=f"tune{seed}")
    s.client.flushall()
    s.sync_policy(Policy(locality=loc), overwrite=True)
    s.advance_clock(0, "freeze")
    nodes = {f"n{i:02d}": Node(f"n{i:02d}", cpu) for i, cpu in enumerate(SHAPES)}

    def beat(n: Node) -> float:
        alloc = len(n.running) * CPU
        s.heartbeat(
            Heartbeat(
                node_id=n.node_id,
                service_instance_id="b",
                cluster_id="c1",
                endpoint=f"{n.node_id}:1",
                p2p_backend="bt",
                p2p_address=f"{n.node_id}:2",
                snapshot=NodeSnapshot(
                    cpu_count=n.cpu,
                    memory_total_bytes=n.cpu * 4 * GIB,
                    allocated_cpu=alloc,
                    allocated_memory_bytes=len(n.running) * MEM,
                    sandbox_count=len(n.running),
                ),
                sandbox_ids=sorted(n.running),
            )
        )
        return alloc / n.cpu

    for n in nodes.values():
        beat(n)
    total_cpu = sum(SHAPES)
    rate = 0.7 * total_cpu / CPU / LIFETIME_S
    end = minutes * 60
    events: list[tuple[float, int, str, str]] = []
    t, seq = 0.0, 0
    while t < end:
        t += rng.expovariate(rate)
        seq += 1
        heapq.heappush(events, (t, seq, "arrive", str(zipf(rng, len(tpls)))))
    for k in range(1, int(end / BEAT_S) + 1):
        seq += 1
        heapq.heappush(events, (k * BEAT_S, seq, "beat", ""))
    now = 0.0
    placed = warm = refused = 0
    pulled = 0
    peak = 0.0
    sid = 0
    while events:
        at, _, kind, what = heapq.heappop(events)
        s.advance_clock(int((at - now) * 1000), "freeze")
        now = at
        for n in nodes.values():
            for sb in [sb for sb, e in n.running.items() if e <= now]:
                del n.running[sb]
        if kind == "beat":
            for n in nodes.values():
                peak = max(peak, beat(n))
            continue
        arts = tpls[int(what)]
        req = Request(
            cpu=CPU,
            memory_bytes=MEM,
            template_id=f"t{what}",
            locality=tuple(LocalityRequirement(key=k, size_bytes=b) for k, b in arts),
        )
        try:
            p = s.schedule(req)
        except NoNodesAvailable:
            refused += 1
            continue
        placed += 1
        n = nodes[p.node_id]
        missing = [(k, b) for k, b in arts if k not in n.cache]
        warm += not missing
        for k, _ in arts:
            if k in n.cache:
                n.cache.move_to_end(k)
        for k, b in missing:
            pulled += b
            n.cache[k] = b
            s.record_artifact("c1", "bt", k, n.node_id)
        while sum(n.cache.values()) > CACHE:
            old, _ = n.cache.popitem(last=False)
            s.forget_artifact("c1", "bt", old, n.node_id)
        sid += 1
        sb = f"sb{sid}"
        s.assign(sb, p.node_id, p.endpoint, p.reservation_id)
        n.running[sb] = now + rng.expovariate(1 / LIFETIME_S)
    return {
        "weight": loc.weight,
        "gap": loc.max_pressure_gap,
        "placed": placed,
        "warm_rate": round(warm / max(placed, 1), 3),
        "gib_pulled": round(pulled / GIB, 1),
        "peak_pressure": round(peak, 3),
        "refused": refused,
    }


SETTINGS = [(0.0, 0.1), (0.05, 0.05), (0.1, 0.1), (0.2, 0.2), (0.3, 0.3), (0.1, 0.3)]


def _fcall_usec(s: Scheduler) -> tuple[int, int]:
    st = s.client.info("commandstats").get("cmdstat_fcall") or {}
    return int(st.get("calls", 0)), int(st.get("usec", 0))


def cost(server: RedisServer, nodes: int, rounds: int = 5, burst: int = 160) -> dict[str, float]:
    """Redis CPU per placement (INFO commandstats, FCALL usec / calls) of a
    template with two artifact keys against the same placement without
    locality, alternating bursts, one cell of ``nodes`` mixed nodes; each key
    held by 5 % of the nodes (so above 1,280 nodes a key's holders pass the
    64 a decision reads).  ``--cost N``."""
    from bench.fleet import mixed_fleet, run_pipelined, send_heartbeats

    rng = random.Random(7)
    s = Scheduler(server.client(), cell=f"cost{nodes}")
    s.client.flushall()
    s.sync_policy(Policy(locality=Locality(weight=0.1)), overwrite=True)
    fleet = mixed_fleet(nodes, rng)
    send_heartbeats(
        s,
        [
            msgspec.structs.replace(
                n.heartbeat(), cluster_id="c1", p2p_backend="bt", p2p_address=f"{n.node_id}:7"
            )
            for n in fleet
        ],
    )
    ids = [n.node_id for n in fleet]
    keys = [f"t{t}/a{j}" for t in range(20) for j in range(2)]
    records = [
        s.peer_ops.record("c1", "bt", k, node_id)
        for k in keys
        for node_id in rng.sample(ids, max(1, nodes // 20))
    ]
    run_pipelined(s, records)
    seq = 0
    usec = {"off": 0, "on": 0}
    calls = {"off": 0, "on": 0}
    for r in range(rounds):
        for kind in ("off", "on") if r % 2 == 0 else ("on", "off"):
            reqs = []
            for _ in range(burst):
                t = rng.randrange(20)
                loc = (
                    LocalityRequirement(key=f"t{t}/a0", size_bytes=GIB),
                    LocalityRequirement(key=f"t{t}/a1", size_bytes=2 * GIB),
                )
                reqs.append(
                    Request(cpu=2, memory_bytes=4 * GIB, template_id=f"t{t}", locality=loc)
                    if kind == "on"
                    else Request(cpu=2, memory_bytes=4 * GIB)
                )
            rids = []
            for _ in reqs:
                seq += 1
                rids.append(f"c{seq}")
            before = _fcall_usec(s)
            run_pipelined(
                s,
                [s.ops.schedule(q, reservation_id=rid) for q, rid in zip(reqs, rids, strict=True)],
            )
            after = _fcall_usec(s)
            calls[kind] += after[0] - before[0]
            usec[kind] += after[1] - before[1]
            run_pipelined(s, [s.ops.cancel(rid) for rid in rids], errors=True)
    off, on = usec["off"] / calls["off"], usec["on"] / calls["on"]
    return {
        "nodes": nodes,
        "us_off": round(off, 1),
        "us_on": round(on, 1),
        "ratio": round(on / off, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cost", type=int, nargs="*", metavar="NODES", help="measure cost instead")
    a = ap.parse_args()
    if a.cost:
        with RedisServer() as server:
            for n in a.cost:
                print(cost(server, n))
        return
    with RedisServer() as server:
        rows = [
            replay(server, Locality(weight=w, max_pressure_gap=g), a.minutes, a.seed)
            for w, g in SETTINGS
        ]
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    assert math.isfinite(rows[0]["peak_pressure"])


if __name__ == "__main__":
    main()
