"""The simulation engine (scheduler/ops/simulate.py) on real Redis and on the embedded store.

Small fleets, fast heartbeats: each run takes well under a second on real Redis.
Expected numbers follow from the scenario (nodes x ceiling, capacity / request),
never from a previous run.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest
import redis

from scheduler.domain.errors import FailedPrecondition, InvalidArgument
from scheduler.ops.simulate import NodeShape, Scenario, SimulationResult, parse_shapes, run
from scheduler.testing.redis_server import RedisServer

FAST = {"heartbeat_interval": 0.05, "heartbeat_lag": 0.03, "create_delay": 0.01, "rate": 0.0}


@pytest.fixture(params=["real", "embedded"])
def store(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """A Redis URL, or None for the embedded store (a fresh cell per test there)."""
    if request.param == "embedded":
        yield None
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    yield server.url
    redis.Redis.from_url(server.url).flushall()


def simulate(store: str | None, **kw: object) -> SimulationResult:
    scenario = msgspec.convert({**FAST, **kw}, Scenario)
    return run(scenario, store, cell="simtest", reset=True)


def assert_exact_accounting(r: SimulationResult) -> None:
    """Each placement accounted exactly once, and the cell counts what the nodes run."""
    assert r.errors == {}
    assert r.settled and r.pending_after_settle == 0
    assert r.placed + r.failed_creates + r.refused == r.scenario.creates
    assert r.stats.reserved_total == r.placed + r.failed_creates
    assert r.stats.cancelled_total == r.failed_creates
    assert r.stats.released_total == r.placed
    assert r.stats.refused_total == r.refused
    assert r.stats.pending == 0
    view = {v.node_id: v for v in r.final_view}
    for node in r.nodes:
        assert view[node.node_id].sandbox_count == node.sandboxes
        assert view[node.node_id].pending_reservations == 0


def test_ceiling_holds_with_many_replicas_and_gateways(store: str | None) -> None:
    r = simulate(store, nodes=4, replicas=4, gateways=12, creates=60, max_sandbox_count=5)
    assert r.placed == 4 * 5 and r.refused == 60 - 20
    assert r.ceiling_held and r.max_node_count == 5
    assert all(n.peak_sandboxes == n.sandboxes == 5 for n in r.nodes)
    assert r.refusals == {"no nodes available: 0/4 nodes available: 4 at max_sandbox_count (5)": 40}
    # 1 cpu / 1 GiB each on 16 cpu / 32 GiB (odd nodes) and 32 / 64 (even nodes)
    assert r.peak_pressure == 5 / 16 and r.peak_pressure_node == "node-01"
    assert r.heartbeats >= 4
    assert_exact_accounting(r)


def test_counter_mode_nodes_without_roster(store: str | None) -> None:
    r = simulate(store, nodes=3, creates=30, max_sandbox_count=4, roster=False)
    assert (r.placed, r.max_node_count, r.ceiling_held) == (12, 4, True)
    assert_exact_accounting(r)


def test_capacity_binds_before_the_ceiling(store: str | None) -> None:
    r = simulate(
        store,
        nodes=3,
        creates=20,
        node_shapes=[{"cpu": 2, "memory_mb": 4096}],
        cpu=1,
        memory_mb=1024,
        max_sandbox_count=5,
    )
    assert r.placed == 3 * 2 and r.max_node_count == 2
    assert list(r.refusals) == ["no nodes available: 0/3 nodes available: 3 insufficient cpu"]
    assert r.peak_pressure == 1.0
    assert_exact_accounting(r)


def test_failed_creates_give_their_reservation_back(redis_server: RedisServer) -> None:
    r = simulate(redis_server.url, nodes=3, creates=40, max_sandbox_count=4, create_fail_rate=0.5)
    assert r.failed_creates > 0
    # A create that is about to fail holds its reservation while in flight, so
    # a concurrent request may be refused then: fewer than 3 x 4 may be placed,
    # but only ever with every node full counting its pending reservations.
    assert r.placed <= 12 and r.ceiling_held and r.max_node_count <= 4
    assert set(r.refusals) <= {
        "no nodes available: 0/3 nodes available: 3 at max_sandbox_count (4)"
    }
    assert_exact_accounting(r)


def test_sandboxes_that_end_free_their_slot(redis_server: RedisServer) -> None:
    r = simulate(
        redis_server.url,
        nodes=3,
        creates=90,
        max_sandbox_count=3,
        rate=150.0,
        sandbox_lifetime=0.15,
        heartbeat_lag=0.02,
    )
    assert r.placed > 3 * 3  # slots were reused
    assert r.ceiling_held and r.max_node_count <= 3
    assert r.errors == {} and r.settled


def test_progress_is_reported_for_every_create() -> None:
    seen: list[tuple[int, int, int]] = []
    r = run(
        msgspec.convert({**FAST, "nodes": 2, "creates": 12, "max_sandbox_count": 3}, Scenario),
        None,
        cell="simprogress",
        reset=True,
        on_progress=lambda *a: seen.append(a),
    )
    assert len(seen) == 12
    assert max(done for done, _, _ in seen) == 12
    assert max(seen) == (12, r.placed, r.refused) == (12, 6, 6)


def test_an_occupied_cell_needs_reset_and_reset_touches_only_that_cell(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.set("sched:{other}:policy", "keep me")
    scenario = msgspec.convert({**FAST, "nodes": 1, "creates": 2}, Scenario)
    run(scenario, redis_server.url, cell="occupied")
    with pytest.raises(FailedPrecondition, match="already holds scheduler state"):
        run(scenario, redis_server.url, cell="occupied")
    again = run(scenario, redis_server.url, cell="occupied", reset=True)
    assert again.stats.reserved_total == 2  # counters start from zero again
    assert client.get("sched:{other}:policy") == b"keep me"
    client.flushall()


def test_scenario_validation_names_the_field() -> None:
    for field, value in [
        ("nodes", 0),
        ("replicas", 65),
        ("strategy", "best"),
        ("create_fail_rate", 1.5),
        ("heartbeat_interval", 0.0),
    ]:
        with pytest.raises(InvalidArgument) as bad:
            msgspec.structs.replace(Scenario(), **{field: value}).validate()
        assert bad.value.field == field
    with pytest.raises(InvalidArgument):
        Scenario(node_shapes=()).validate()
    with pytest.raises(InvalidArgument):
        run(Scenario(), None, cell="bad{cell}")


def test_parse_shapes() -> None:
    assert parse_shapes("16x32G, 8x512,4x2GiB") == (
        NodeShape(cpu=16, memory_mb=32768),
        NodeShape(cpu=8, memory_mb=512),
        NodeShape(cpu=4, memory_mb=2048),
    )
    assert [str(s) for s in parse_shapes("16x32G,8x512")] == ["16x32G", "8x512M"]
    for bad in ("16", "x32G", "16x32T", "16x32G,"):
        with pytest.raises(InvalidArgument) as e:
            parse_shapes(bad)
        assert e.value.field == "node_shapes"


def test_the_result_round_trips_as_json() -> None:
    r = run(
        msgspec.convert({**FAST, "nodes": 1, "creates": 3}, Scenario),
        None,
        cell="simjson",
        reset=True,
    )
    again = msgspec.json.decode(msgspec.json.encode(r), type=SimulationResult)
    assert again == r
