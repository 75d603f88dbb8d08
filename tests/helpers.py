"""Small builders shared by the tests."""

from __future__ import annotations

from typing import Any

from scheduler import Heartbeat, NodeSnapshot, Scheduler
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.store.calls import Call
from scheduler.store.contracts import HeartbeatArgv, ScheduleArgv
from scheduler.testing.model import NodeState

GIB = 1024**3


def hb(
    node_id: str,
    *,
    cpu: int = 16,
    mem_gib: int = 64,
    sid: str = "boot-1",
    roster: list[str] | None = None,
    endpoint: str | None = None,
    **snap: Any,
) -> Heartbeat:
    return Heartbeat(
        node_id=node_id,
        service_instance_id=sid,
        endpoint=endpoint if endpoint is not None else f"{node_id}.local:5000",
        snapshot=NodeSnapshot(cpu_count=cpu, memory_total_bytes=mem_gib * GIB, **snap),
        sandbox_ids=roster or [],
    )


def heartbeat_argv(call: Call[Any]) -> HeartbeatArgv:
    """A heartbeat-5.lua call's ARGV by name (a steady heartbeat has none)."""
    assert isinstance(call.argv, HeartbeatArgv), call.script
    return call.argv


def schedule_argv(call: Call[Any]) -> ScheduleArgv:
    """A schedule-5.lua call's ARGV by name."""
    assert isinstance(call.argv, ScheduleArgv), call.script
    return call.argv


def roster_form(call: Call[Any]) -> str:
    """What follows a heartbeat-5.lua call's fields: ROSTER_SAME, _FULL or _DELTA."""
    return heartbeat_argv(call).roster_form


def fleet(s: Scheduler, n: int, **kw: Any) -> list[str]:
    ids = [f"n{i}" for i in range(n)]
    for node_id in ids:
        s.heartbeat(hb(node_id, **kw))
    return ids


def node_states(s: Scheduler) -> list[NodeState]:
    """Every node record as the model reads it, straight from Redis."""
    ids = [x.decode() for x in s.client.zrange(s.keys.nodes, 0, -1)]
    out = []
    for node_id in ids:
        raw = s.client.hgetall(s.keys.node(node_id))
        out.append(NodeState.from_record({k.decode(): v.decode() for k, v in raw.items()}))
    return out


def rr_value(s: Scheduler) -> int:
    return int(s.client.get(s.keys.rr) or 0)


def rr_cursor(s: Scheduler) -> str:
    """The node round_robin chose last ("" before any)."""
    v = s.client.get(s.keys.rr_cursor)
    return v.decode() if isinstance(v, bytes) else v or ""


# ---------------------------------------------------------------------------
# gRPC requests and the state they leave
# ---------------------------------------------------------------------------
def hb_request(
    node_id: str,
    sid: str = "i1",
    cpu: int = 32,
    mem_gib: int = 64,
    cluster: str = "c1",
    roster: list[str] | None = None,
    count: int | None = None,
    **snap: Any,
) -> pb.HeartbeatRequest:
    roster = roster or []
    return pb.HeartbeatRequest(
        node_id=node_id,
        service_instance_id=sid,
        cluster_id=cluster,
        snapshot=pb.NodeSnapshot(
            status=pb.NODE_STATUS_READY,
            cpu_count=cpu,
            memory_total_bytes=mem_gib << 30,
            sandbox_count=len(roster) if count is None else count,
            **snap,
        ),
        sandbox_ids=roster,
    )


def endpoint_md(endpoint: str) -> tuple[tuple[str, str], ...]:
    return (("x-node-endpoint", endpoint),)


def cold(cpu: int = 2, memory_mb: int = 4096) -> pb.ScheduleRequest:
    return pb.ScheduleRequest(
        hint=pb.ScheduleRequestHint(
            new_cold_sandbox=pb.NewColdSandboxHint(cpu_count=cpu, memory_mb=memory_mb)
        )
    )


def places_on_a_fresh_node(address: str) -> str:
    """Through a replica at ``address``: register node n1 by heartbeat, then
    Schedule; the node chosen (a replica that serves answers "n1")."""
    import grpc

    from scheduler.grpc import scheduler_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.SchedulerStub(ch)
        stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1:5000"))
        return str(stub.Schedule(cold()).node.node_id)


#: what a replica's own monitor writes every second, whatever the calls do:
#: its presence (lua/replica_seen-5.lua), the probe's counters
#: (lua/probe-5.lua) and the census pass (lua/census-5.lua)
MONITOR_KEYS = (b":replica:", b":census")
MONITOR_STATS = (b"probes", b"probed_ms")


def snapshot_keys(client: Any, monitor: bool = False) -> dict[bytes, Any]:
    """Every key and its content: to show that a refused request wrote nothing.
    ``monitor``: leave out what a running replica's monitor writes meanwhile."""
    out: dict[bytes, Any] = {}
    for key in sorted(client.keys("*")):
        if monitor and any(part in key for part in MONITOR_KEYS):
            continue
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"set":
            out[key] = sorted(client.smembers(key))
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"string":
            out[key] = client.get(key)
        else:
            out[key] = kind
        if monitor and key.endswith(b":stats"):
            out[key] = {k: v for k, v in out[key].items() if k not in MONITOR_STATS}
    return out


def records_name_only_registered_nodes(s: Scheduler) -> None:
    """A node record names its node (`node_id`) only while the node is in the
    cell's nodes zset: a heartbeat takes the one for the other."""
    registered = {x.decode() for x in s.client.zrange(s.keys.nodes, 0, -1)}
    prefix = s.keys.node("")
    named = {
        key.decode()[len(prefix) :]
        for key in s.client.scan_iter(match=prefix + "*")
        if s.client.hexists(key, "node_id")
    }
    assert named <= registered, named - registered


def bound_sandboxes_are_in_their_nodes_sets(s: Scheduler) -> None:
    """Every live binding (not a deletion's tombstone) is a member of its
    node's roster set when listed and of its node-sbx set when not, and a
    listed one is not in node-sbx: whatever removes a node's bindings reads
    both sets, and a sandbox leaving the roster leaves one set."""
    prefix = s.keys.bind("")
    for key in s.client.scan_iter(match=prefix + "*"):
        node, deleted, listed = s.client.hmget(key, "node_id", "deleted", "listed")
        if node is not None and deleted != b"1":
            sb = key.decode()[len(prefix) :]
            node_id = node.decode()
            in_sbx = s.client.sismember(s.keys.node_sbx(node_id), sb)
            in_roster = s.client.sismember(s.keys.node_roster(node_id), sb)
            assert (in_roster, in_sbx) == ((True, False) if listed == b"1" else (False, True)), (
                sb,
                node,
                listed,
            )
