"""The fault suite, small: every scenario of ``python -m bench faults`` under
load, its invariants asserted (never its timings).  The truth is what the
simulated nodes themselves held."""

from __future__ import annotations

import grpc
import pytest

from bench import faults

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def params(redis_server: object) -> faults.Params:  # (skips where redis-server is missing)
    return faults.Params.quick()


@pytest.mark.parametrize("scenario", faults.SCENARIOS)
def test_fault_keeps_the_invariants(params: faults.Params, scenario: str) -> None:
    row = faults.run_scenario(params, scenario)
    where = f"{scenario}: {row}"
    if scenario == "eviction":
        # an evicting Redis is refused at start; allowed, what it evicts is
        # reported by every replica (the cell's state is then not kept: no
        # invariant holds, which is why it is refused)
        assert "maxmemory-policy allkeys-lru" in row["refused_at_start"], where
        assert row["evicted_keys"] > 0, where
        assert row["evictions_reported"] == len(row["replica_exits"]), where
        assert row["internal"] == 0, where
        return
    assert row["placed"] > 0, where
    # the ceiling held on every node, by the nodes' own count
    assert row["peak"] <= row["ceiling"], where
    # no reservation that no gateway was ever answered, but those of the
    # Schedules a killed replica had in flight (Redis may have written them
    # before the kill; their unassigned_reservation_ttl ends them)
    assert row["phantoms"] <= row["cut_short"], where
    if scenario != "replica-kill":
        assert row["cut_short"] == 0, where
    # never INTERNAL; health said NOT_SERVING while Redis could not take writes
    assert row["internal"] == 0, where
    assert row["health_honest"], where
    # service came back without restarting any replica (the killed one aside)
    assert [x for x in row["replica_exits"] if x is not None] == (
        [-9] if scenario == "replica-kill" else []
    ), where
    assert row["to_first_ok_s"] is not None, where
    if scenario in (
        "kill-aof",
        "pause",
        "replica-kill",
        "failover-1",
        "lagging-promotion",
        "rdb-rollback-sentinel",
    ):
        # Redis kept every write it acknowledged (also when the promoted replica
        # was behind, and when Sentinel promoted a replica before the primary
        # came back from its old snapshot)
        assert row["acked_missing"] == 0, where
    if scenario in ("kill-empty", "rdb-rollback-20s", "rdb-rollback-120s", "rdb-rollback-replica"):
        # Redis lost them (no persistence, an old snapshot, and the replica
        # resynced to it), and the replicas wrote back every placement they
        # had answered
        assert row["acked_missing"] == 0, where
    if scenario.startswith("failover") or scenario in (
        "lagging-promotion",
        "rdb-rollback-sentinel",
    ):
        # no answered placement's reservation still holds capacity after the
        # settle (assignments the new primary lacked were written again), the
        # settle counted from when the cell applied heartbeats again; but a
        # placement whose gateway never got its RecordAssignment through (a
        # write outage longer than its 10 s of retries) is written by the
        # replica that refused it once Redis answers, or, if it reached none,
        # held until unassigned_reservation_ttl (``unrecorded_live``, not stuck)
        assert row["writable"], where
        assert row["stuck"] == 0, where
    if scenario == "rdb-rollback-sentinel":
        # the promoted replica had every acknowledged write: nothing rewound
        assert row["rewinds"] == 0 and row["rewound"] == 0, where
    elif scenario.startswith("rdb-rollback"):
        # the old snapshot was noticed and settled once, and what came back from
        # the past holds no capacity after the settle
        assert row["rewinds"] == 1, where
        assert row["rewound"] > 0 and row["stuck"] == 0, where
    if scenario in faults.SKEW_MS:
        # the jump was put back: nothing acknowledged expired, the cell's clock is right
        assert row["rewinds"] == 1 and row["acked_missing"] == 0, where
        assert abs(row["cell_clock_off_s"]) < 10, where
    if scenario.startswith("failover"):
        assert row["after_switch_s"] is not None, where


def test_the_settle_waits_for_heartbeats_the_cell_applies() -> None:
    """A cell that refuses writes (a second failover, no replica attached
    yet at min_replicas_acked 1) applies no heartbeat, so nothing can end:
    the bench's settle counts from the last refused heartbeat, not from the
    end of the load (lagging-promotion's stuck reservations under load were
    those of a cell still refusing writes when they were counted)."""
    ok, refused = grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE
    outcomes = [
        faults.Outcome("Heartbeat", 10.0, 10.1, ok),
        faults.Outcome("Schedule", 11.0, 11.2, refused),  # (not a heartbeat)
        faults.Outcome("Heartbeat", 12.0, 12.5, refused),
        faults.Outcome("Heartbeat", 13.0, 13.1, ok),
    ]
    assert faults.heartbeats_refused_since(outcomes, 12.0)
    assert not faults.heartbeats_refused_since(outcomes, 12.5)
    assert not faults.heartbeats_refused_since(outcomes[:2], 0.0)
