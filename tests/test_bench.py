"""The benchmark suite at tiny sizes: every scenario still runs end to end
against a real redis-server and real replica processes, its rows have the
documented keys, and the invariants the benchmarks exist to show hold.

No timing is asserted: these machines are noisy and the sizes are tiny.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest

from bench import (
    balance,
    ceiling,
    grpc_path,
    heartbeats,
    instructions,
    latency,
    phases,
    throughput,
    versus,
)
from bench.reference_model import ReferenceCluster, RefSnapshot
from bench.runner import Result, Target, percentile
from scheduler import Policy, Scheduler
from scheduler.domain.records import MIB
from scheduler.ops.simnode import SimNode
from scheduler.store.contracts import ROSTER_DELTA, ROSTER_FULL
from scheduler.store.scripts import _files, build_library, library
from scheduler.testing.redis_server import RedisServer
from tests.helpers import heartbeat_argv, roster_form

pytestmark = pytest.mark.real_only
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target(redis_server: RedisServer) -> Iterator[Target]:
    t = Target(redis_server.url, owned=True)
    t.client.flushall()
    yield t
    t.client.flushall()
    t.close()


@pytest.fixture(scope="module")
def ceiling_result(target: Target) -> Result:
    return ceiling.run(target, ceiling.Params.quick())


@pytest.fixture(scope="module")
def latency_result(target: Target) -> Result:
    return latency.run(target, latency.Params.quick())


def _keys(result: Result) -> None:
    for row in result.rows:
        assert set(result.columns) <= set(row), row
    assert json.loads(json.dumps(result.to_json()))["rows"] == result.rows


# -- ceiling -----------------------------------------------------------------
def test_ceiling_rows_and_our_ceiling_holds(ceiling_result: Result) -> None:
    p = ceiling.Params.quick()
    _keys(ceiling_result)
    combos = {(r["system"], r["replicas"], r["paced"]) for r in ceiling_result.rows}
    assert combos == set(itertools.product(("ours", "reference-model"), p.replicas, (False, True)))
    for row in ceiling_result.rows:
        assert row["placed"] + row["refused"] == p.creates
        assert row["limit"] == p.limit
        if row["system"] == "ours":
            # 10 means 10 with any number of replicas, and the ceiling is reached, not missed
            assert row["max_node_sandboxes"] == p.limit
            assert row["nodes_over_limit"] == 0
            assert row["placed"] == p.nodes * p.limit
    for d in ceiling_result.params["ours"]:
        # every reservation is accounted for; lagging rosters did release some when paced
        assert d["released_by_heartbeats"] + d["pending_at_end"] == d["reserved"]
        assert (d["released_by_heartbeats"] > 0) == d["paced"]
        assert d["refusal_messages"] == [
            f"no nodes available: 0/{p.nodes} nodes available: {p.nodes} at max_sandbox_count "
            f"({p.limit})"
        ]
    # The reference design's failure shows with several replicas.
    for row in ceiling_result.rows:
        if row["system"] == "reference-model" and row["replicas"] > 1:
            assert row["max_node_sandboxes"] > p.limit
            assert row["nodes_over_limit"] > 0


def test_reference_filter_is_greater_than_on_the_snapshot() -> None:
    cluster = ReferenceCluster(["n0"], replicas=1, max_sandbox_count=2)

    def snap(count: int) -> RefSnapshot:
        return RefSnapshot(
            cpu_count=64,
            memory_total_bytes=1 << 40,
            allocated_cpu=count,
            allocated_memory_bytes=0,
            sandbox_count=count,
            sandbox_starting_count=0,
            create_successes=count,
        )

    cluster.heartbeat("n0", snap(2))
    assert cluster.schedule(0, 1, 0) == "n0"  # at the limit: one more (2 > 2 is false)
    assert cluster.schedule(0, 1, 0) == "n0"  # placements since the snapshot are not counted
    cluster.heartbeat("n0", snap(3))
    assert cluster.schedule(0, 1, 0) is None  # 3 > 2


def test_reference_replica_keeps_nodes_it_has_no_snapshot_for() -> None:
    cluster = ReferenceCluster(["n0", "n1"], replicas=2, max_sandbox_count=1)
    full = RefSnapshot(
        cpu_count=8,
        memory_total_bytes=1 << 34,
        allocated_cpu=5,
        allocated_memory_bytes=0,
        sandbox_count=5,
        sandbox_starting_count=0,
        create_successes=5,
    )
    cluster.heartbeat("n0", full)  # pinned to replica 0
    cluster.heartbeat("n1", full)  # pinned to replica 1
    # Replica 0 filters n0 (5 > 1) but knows nothing of n1, so it keeps it.
    assert [cluster.schedule(0, 1, 0) for _ in range(3)] == ["n1", "n1", "n1"]


# -- balance -----------------------------------------------------------------
def test_optimal_peak_matches_brute_force() -> None:
    units = [Fraction(2, 4), Fraction(2, 6), Fraction(2, 10)]
    for requests in range(0, 9):
        best = min(
            (
                max(k * w for k, w in zip(split, units, strict=True))
                for split in itertools.product(range(requests + 1), repeat=3)
                if sum(split) == requests
            ),
            default=Fraction(0),
        )
        assert balance.optimal_peak(units, requests) == best


def test_balance_least_loaded_reaches_the_optimum(target: Target) -> None:
    p = balance.Params.quick()
    result = balance.run(target, p)
    _keys(result)
    assert [(r["strategy"], r["replicas"]) for r in result.rows] == [
        (s, n) for n in p.replicas for s in balance.STRATEGIES
    ]
    exact = result.params["exact"]
    for row, ex in zip(result.rows, exact, strict=True):
        assert row["placed"] == p.requests
        peak, optimum = Fraction(ex["peak"]), Fraction(ex["optimum"])
        assert peak >= optimum
        assert row["peak_pressure"] == float(peak)
        if row["strategy"] == "least_loaded":
            assert peak == optimum, row  # exactly, with 1 replica and with concurrent ones
    rr = [r for r in result.rows if r["strategy"] == "round_robin"]
    assert all(r["peak_pressure"] > r["optimal_peak_pressure"] for r in rr)


# -- latency -----------------------------------------------------------------
def test_latency_rows(latency_result: Result) -> None:
    p = latency.Params.quick()
    _keys(latency_result)
    assert [r["nodes"] for r in latency_result.rows] == list(p.nodes)
    for row, detail in zip(latency_result.rows, latency_result.params["detail"], strict=True):
        assert row["ping_p50_us"] > 0
        assert 0 < row["schedule_p50_us"] <= row["schedule_p99_us"]
        assert row["redis_us_per_schedule"] > 0
        assert row["redis_us_per_heartbeat"] > 0
        assert row["redis_us_per_steady_heartbeat"] > 0
        assert row["redis_us_per_schedule_busy"] > 0
        assert row["redis_us_per_steady_heartbeat_busy"] > 0
        assert row["redis_us_per_heartbeat_coalesced"] > 0
        assert row["redis_us_per_steady_heartbeat_coalesced"] > 0
        assert row["redis_us_floor_busy"] > 0  # the reference library loads and runs
        assert detail["steady_heartbeats"] > 0
        assert detail["schedules"] >= p.min_schedules
        assert detail["heartbeats"] > 0
        assert detail["refused"] == 0
        assert detail["pending_at_end"] >= 1  # pending reservations present throughout


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([7.0], 99) == 7.0


# -- throughput ----------------------------------------------------------------
@pytest.mark.parametrize(("path", "replicas"), [("library", (1, 2)), ("grpc", (1,))])
def test_throughput_rows(target: Target, path: str, replicas: tuple[int, ...]) -> None:
    p = throughput.Params(replicas=replicas, nodes=120, seconds=0.3, paths=(path,))
    result = throughput.run(target, p)
    _keys(result)
    assert [(r["path"], r["replicas"]) for r in result.rows] == [(path, n) for n in replicas]
    missing = grpc_path.unavailable() if path == "grpc" else None
    for row in result.rows:
        if missing:
            assert row["schedules_per_s"] is None and row["note"] == "not available"
            continue
        assert row["schedules_per_s"] > 0
        assert row["redis_cpu_share"] > 0
        assert row["note"] == ""  # nothing refused: the fleet has room


def test_cpu_rows_compare_servers_with_the_bare_one_in_the_same_run(target: Target) -> None:
    if grpc_path.unavailable() or grpc_path.cpu_unmeasurable():
        pytest.skip("gRPC or /proc not available here")
    loop = "uvloop" if throughput.auto_loop() == "uvloop" else "asyncio"
    servers = (
        throughput.BARE,
        throughput.Server(
            "replica", "asyncio", extra=throughput.NO_COALESCE, label_extra=", coalescing off"
        ),
        throughput.Server("replica", loop, workers=2),
        throughput.Server("bare", "asyncio", layer="library"),
    )
    p = throughput.Params(nodes=40, seconds=0.5, concurrency=4, channels=2, rounds=1, rate=200)
    rows = throughput.run_cpu(target, p, servers)
    assert [r["server"] for r in rows] == [
        "bare grpc.aio, asyncio",
        "replica, asyncio, coalescing off",
        f"replica, {loop}, 2 workers",
        "bare grpc.aio + library Schedule, asyncio",
    ]
    for row in rows:
        assert set(throughput.COLUMNS) <= set(row)
        assert row["path"] == "cpu" and row["concurrency"] == 4 and row["note"] == ""
        assert row["schedules_per_s"] > 0 and row["cpu_us_per_call"] > 0
        assert row["ratio_low"] <= row["ratio_to_bare"] <= row["ratio_high"]
    assert rows[0]["ratio_to_bare"] == 1.0 and rows[0]["redis_us_per_schedule"] is None
    assert all(r["schedules_per_s"] <= 200 * 1.2 for r in rows)  # paced (rate), not flat out
    assert rows[1]["redis_us_per_schedule"] > 0 and rows[2]["replicas"] == 2
    assert rows[3]["redis_us_per_schedule"] > 0  # it did place, through Redis


def test_cpu_rows_say_when_uvloop_is_missing(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    p = throughput.Params(rounds=0)
    rows = throughput.run_cpu(target, p, (throughput.Server("bare", "uvloop"),))
    assert rows[0]["server"] == "bare grpc.aio, uvloop"
    assert rows[0]["note"] == "uvloop not installed" and rows[0]["cpu_us_per_call"] is None


# -- versus --------------------------------------------------------------------
def test_versus_rows_and_the_base_library_is_removed(target: Target) -> None:
    result = versus.run(target, versus.Params.quick())
    _keys(result)
    assert [r["operation"] for r in result.rows] == list(versus.OPERATIONS)
    for row in result.rows:
        assert row["base_us"] > 0 and row["ours_us"] > 0 and row["rounds"] == 2
        assert row["ratio_low"] <= row["ratio"] <= row["ratio_high"]
    base = versus.library_at("HEAD")
    assert result.params["base_library"] == base.name
    assert result.params["our_library"] == library().name
    loaded = {
        dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode()
        for lib in target.client.function_list()
    }
    assert library().name in loaded
    assert base.name not in loaded or base.name == library().name


def test_versus_sends_a_base_before_roster_deltas_the_roster_whole(target: Target) -> None:
    """A changed roster goes to this tree's library as a delta and to a base
    that does not know deltas whole (which would otherwise answer RESYNC,
    and be measured doing nothing)."""
    assert versus.knows_roster_deltas(library())
    includes, scripts = _files()
    before_deltas = build_library(
        {**includes, "heartbeat": includes["heartbeat"].replace("A[6] == '2'", "false")}, scripts
    )
    assert not versus.knows_roster_deltas(before_deltas)
    cell = target.new_cell("whole")
    s = Scheduler.connect(target.url, cell=cell, policy=Policy())
    try:
        node = SimNode("w1", 16, 64 * 1024 * MIB)
        node.create("sb-a", 1, 1024 * MIB)
        s.heartbeat(node.heartbeat())
        node.create("sb-b", 2, 2048 * MIB)
        node.delete("sb-a")
        call = s.ops.heartbeat(node.heartbeat(), s.beats)
        assert roster_form(call) == ROSTER_DELTA
        whole = versus._whole_roster(call, node.heartbeat().sandbox_ids)
        assert roster_form(whole) == ROSTER_FULL and heartbeat_argv(whole).roster == ["sb-b"]
        assert heartbeat_argv(whole).fields == heartbeat_argv(call).fields
        s.run(whole)
        assert s.client.smembers(s.keys.node_roster("w1")) == {b"sb-b"}
        assert s.lookup("sb-b").node_id == "w1"
    finally:
        s.close()
        target.drop_cell(cell)


# -- instructions --------------------------------------------------------------
def test_instructions_counts_per_call_or_names_what_it_needs(target: Target) -> None:
    if shutil.which("valgrind") is None:
        with pytest.raises(SystemExit, match="needs valgrind"):
            instructions.run(target, instructions.Params.quick())
        return
    result = instructions.run(target, instructions.Params.quick())
    _keys(result)
    rows = {r["operation"]: r for r in result.rows}
    assert list(rows)[:-1] == list(instructions.OPERATIONS)
    floor = rows["floor (bare reservation writes, one call each)"]["ours_per_call"]
    assert floor > 10_000  # (a call of ten commands: tens of thousands of instructions)
    head = versus.lua_at("HEAD")
    batches = "heartbeat_batch" in versus.library_of(head).functions
    # (a clean tree: the base is ours, each call counted once)
    same = versus.same_lua(head)
    assert same == any("lua/ is this tree's" in n for n in result.notes)
    for op in instructions.OPERATIONS:
        r = rows[op]
        assert r["ours_per_call"] > 10_000
        assert r["ours_per_floor"] == round(r["ours_per_call"] / floor, 2)
        if op in instructions.HEARTBEAT_BATCHES and not batches:
            assert r["base_per_call"] is None and r["ratio"] is None  # (the base has none)
        else:
            assert r["base_per_call"] > 10_000
            if same:
                assert r["base_per_call"] == r["ours_per_call"] and r["ratio"] == 1.0
    # a batch call's fixed cost is shared: a steady heartbeat costs less in one
    assert (
        rows["coalesced steady heartbeat"]["ours_per_call"]
        < rows["steady heartbeat"]["ours_per_call"]
    )


# -- phases --------------------------------------------------------------------
def test_phases_rows_and_the_marked_library_is_removed(target: Target) -> None:
    result = phases.run(target, phases.Params.quick())
    _keys(result)
    phased, order = phases.phased_library()
    assert {"pick", "index_move", "reservation_writes", "record_read", "roster_plan"} <= set(order)
    assert result.params["mark_us"] > 0
    for op in phases.OPERATIONS:
        rows = {r["phase"]: r for r in result.rows if r["operation"] == op}
        named = [n for n in order if n in rows]
        assert "index_move" in named and len(named) >= 5, (op, rows)
        total = rows["total (plain library)"]["us"]
        assert total > 0 and rows["total / floor"]["us"] > 0
        # the phases and what lies outside them make the plain call's cost
        parts = sum(rows[n]["us"] for n in named) + rows["outside"]["us"]
        assert abs(parts - total) <= 0.1 * len(named) + 0.1
    loaded = {
        dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode()
        for lib in target.client.function_list()
    }
    assert phased.name not in loaded and "sched_bench_floor" not in loaded


def test_phase_marks_are_comments_in_the_shipped_library() -> None:
    text = library().text
    assert "-- @phase pick" in text and "phase('pick')" not in text
    assert "phase('pick')" in phases.phased_library()[0].text


def test_versus_names_a_revision_git_does_not_know() -> None:
    with pytest.raises(SystemExit, match="no-such-revision"):
        versus.library_at("no-such-revision")


def test_library_name_does_not_depend_on_the_order_files_are_listed() -> None:
    includes, scripts = _files()
    flipped = build_library(dict(reversed(includes.items())), dict(reversed(scripts.items())))
    assert flipped == build_library(includes, scripts) == library()


# -- CLI and charts --------------------------------------------------------------
def test_cli_writes_json(redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "balance.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "balance",
            "--quick",
            "--redis",
            redis_server.url,
            "--json",
            str(out),
            "--markdown",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "| strategy | replicas |" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "balance"
    assert len(doc["rows"]) == 3 * len(balance.Params.quick().replicas)
    assert set(balance.COLUMNS) <= set(doc["rows"][0])
    assert doc["machine"]["redis_version"]
    assert doc["params"]["command"].startswith("python -m bench balance --quick")


def test_cli_rejects_plot_for_other_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import parser

    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["balance", "--plot", "x.png"])
    assert exc.value.code == 2
    assert "--plot" in capsys.readouterr().err
    args = parser().parse_args(["latency", "--plot", "x.png", "--nodes", "100,10000"])
    assert args.plot == "x.png" and args.nodes == (100, 10000)


def test_plots(ceiling_result: Result, latency_result: Result, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the optional bench extra is not installed")
    from bench import plot

    for result in (ceiling_result, latency_result):
        path = tmp_path / f"{result.scenario}.png"
        plot.draw(result, path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_durability_rows(redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "durability.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench", "durability", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    rows = {(row["min_replicas_acked"], row["concurrency"]): row for row in doc["rows"]}
    assert set(rows) == {(a, c) for a in (0, 1) for c in (1, 16)}
    for row in rows.values():
        assert row["calls"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]


def test_faults_and_durability_start_their_own_redis(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import main

    for scenario in ("faults", "durability"):
        with pytest.raises(SystemExit) as exc:
            main([scenario, "--redis", "redis://localhost:1"])
        assert exc.value.code == 2
        assert "starts Redis servers of its own" in capsys.readouterr().err


# -- roster and memory (issue: bounded state) ---------------------------------
def test_roster_rows_apply_whole_and_leave_nothing(target: Target) -> None:
    from bench import roster

    p = roster.Params.quick()
    result = roster.run(target, p)
    _keys(result)
    assert [(r["roster_ids"], r["heartbeat"]) for r in result.rows] == [
        (n, h) for n in p.sizes for h in ("all new", "half replaced", "all dropped")
    ]
    for r in result.rows:
        # every binding of the roster is a key (and the node's roster set: a
        # listed sandbox is in no other); after "all dropped" none is left
        fixed = result.rows[2]["keys_after"]
        expected = fixed + (0 if r["heartbeat"] == "all dropped" else r["roster_ids"] + 1)
        assert r["keys_after"] == expected, r
        assert r["redis_ms"] > 0


def test_memory_rows(target: Target) -> None:
    from bench import memory

    result = memory.run(target, memory.Params.quick())
    _keys(result)
    assert [r["item"] for r in result.rows] == [
        "node",
        "roster entry",
        "live reservation",
        "tombstone",
        "artifact (512-byte key)",
        "artifact (64-byte key)",
    ]
    for r in result.rows:
        assert r["bytes_per_item"] > 0 and r["memory_usage_one"] > 0, r


def test_stall_rows() -> None:
    """The control for the longest call: a row per count of busy processes,
    each call's own time in Redis and the longest seen by Redis and the
    client; its own server only."""
    from bench import stall

    result = stall.run(stall.Params.quick())
    _keys(result)
    assert [r["hogs"] for r in result.rows] == [0, 1]
    for r in result.rows:
        assert r["calls"] > 0 and 0 < r["us_per_call"] < 1000, r
        assert r["slowlog_over_5ms"] <= r["slowlog_over_1ms"], r
        assert r["longest_round_trip_ms"] > 0 and 0 <= r["steal_share"] <= 1, r
        if r["slowlog_over_1ms"]:
            assert r["longest_in_redis_ms"] > 1, r
    refused = subprocess.run(
        [sys.executable, "-m", "bench", "stall", "--redis", "redis://127.0.0.1:1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2 and "no --redis" in refused.stderr


def test_cluster_rows(redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench", "cluster", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [(row["redis"], row["cells"]) for row in doc["rows"]] == [("single", 3), ("cluster", 3)]
    for row in doc["rows"]:
        assert row["schedules_per_s"] > 0
    assert len(doc["rows"][1]["redis_cpu_shares"].split(" / ")) == 3
    assert any(note.startswith("3 cells: cluster / single = ") for note in doc["notes"])


# -- heartbeats ----------------------------------------------------------------
def test_heartbeats_rows_show_coalescing_at_work(target: Target) -> None:
    result = heartbeats.run(target, heartbeats.Params.quick())
    _keys(result)
    rows = {(r["heartbeats"], r["coalescing"]): r for r in result.rows}
    assert set(rows) == {(k, c) for k in heartbeats.KINDS for c in ("off", "on")}
    for kind in heartbeats.KINDS:
        off, on = rows[(kind, "off")], rows[(kind, "on")]
        # off: the heartbeat and the CPU config step, a call each; on: batches of them
        assert off["calls"] == 2 and off["batch_mean"] == 1
        assert on["calls"] < off["calls"] and on["batch_mean"] > 1
        assert off["redis_us"] > 0 and on["redis_us"] > 0 and on["client_us"] > 0
        assert off["client_ratio"] == off["redis_ratio"] == 1


def test_scale_rows_at_tiny_sizes_and_its_cells_are_dropped(target: Target) -> None:
    from bench import scale

    p = scale.Params(
        nodes=(120,),
        rounds=1,
        burst=24,
        cpucfg_members=(20, 60),
        replica_rounds=1,
        replica_seconds=0.3,
    )
    result = scale.run(target, p)
    (row,) = result.rows
    assert set(result.columns) <= set(row)
    assert row["nodes"] == 120
    assert row["floor_us"] > 0 and row["placement_us"] > 0 and row["heartbeat_us"] > 0
    assert row["core_share_at_5s"] > 0
    # the replica tier: a replica process and the bare server, each RPC
    for rpc in ("heartbeat", "schedule"):
        assert row[f"replica_{rpc}_cpu_us"] > 0 and row[f"replica_{rpc}_per_bare"] > 0
    cores = (120 / 5 * row["replica_heartbeat_cpu_us"] + 200 * row["replica_schedule_cpu_us"]) / 1e6
    assert row["replica_cores_at_5s"] == round(cores, 2)
    assert set(row["oneoff"]) >= {
        "census step",
        "ListNodes page",
        "sync_nodes [] (start-up)",
        "least_loaded refusal (no node fits)",
    }
    # a fleet the full scan may read: dark nodes never refuse a placement BEHIND,
    # and the index steps leave none listed
    for share in ("10%", "99%"):
        dark = row["oneoff"][f"placements while {share} went dark (the longest)"]
        assert dark["behind"] == 0 and dark["stale_left"] == 0 and dark["stale_listed"] > 0
    cfg = result.params["cpucfg"]
    assert [c["members"] for c in cfg] == [20, 60]
    assert all(c["errors"] == 0 and c["heartbeats"] > 0 for c in cfg)
    assert cfg[0]["ratio_to_smallest"] == 1 and cfg[0]["ratio_range"] == [1, 1]
    assert not list(target.client.scan_iter(match="sched:{bench-scale*"))


# -- churn (issue #28) ----------------------------------------------------------
def test_churn_rows_attribute_every_refusal_with_room_and_hold_the_ceiling() -> None:
    from dataclasses import replace

    from bench import churn

    # (the setting the attribution is for: roster mode, every event lost)
    p = replace(churn.Params.quick(), losses=(1.0,))
    result = churn.run(p)
    assert [(r["mode"], r["lost"]) for r in result.rows] == [
        (m, lost) for m in p.modes for lost in p.losses
    ]
    for row in result.rows:
        assert set(result.columns) <= set(row)
        assert row["created"] > 0
        assert row["schedules"] == row["placed"] + row["refused"] + row["errors"]
        assert row["violations"] == 0 and row["peak"] <= row["ceiling"]
        # every refusal with room is charged to exactly one cause
        assert sum(row[f"by_{c}"] for c in churn.CAUSES) == row["refused_room"]
        assert set(row["room_held"]) == set(churn.CAUSES)
        assert 0 <= row["refused_reported_room"] <= row["refused_room"] <= row["refused"]
        assert row["replica_exits"] == [None] * p.replicas
