"""CPU config intersection: the pure rule on a table, and its per-cluster
delivery over gRPC, agreed by two replicas sharing one store."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import pytest

from scheduler.client.sync import async_client
from scheduler.store.cpuconfig import intersect
from scheduler.testing.replicas import LoopThread, ThreadedReplica, settings_for
from tests.helpers import endpoint_md, hb_request


def cfg(
    kvm: list[str] | None = None,
    cpuid: list[tuple[Any, Any, int, dict[str, str]]] | None = None,
    msr: list[tuple[Any, str]] | None = None,
) -> str:
    return json.dumps(
        {
            "kvm_capabilities": kvm or [],
            "cpuid_modifiers": [
                {
                    "leaf": leaf,
                    "subleaf": sub,
                    "flags": flags,
                    "modifiers": [{"register": r, "bitmap": b} for r, b in regs.items()],
                }
                for leaf, sub, flags, regs in cpuid or []
            ],
            "msr_modifiers": [{"addr": a, "bitmap": b} for a, b in msr or []],
        }
    )


ONES = "1" * 32
INTERSECT_TABLE = [
    pytest.param(
        [cfg(kvm=["171", "!56", "9"]), cfg(kvm=["9", "171"])],
        {"kvm_capabilities": ["171", "9"], "cpuid_modifiers": [], "msr_modifiers": []},
        id="kvm-set-intersection-sorted",
    ),
    pytest.param(
        [
            cfg(cpuid=[("0x1", "0x0", 0, {"ecx": "0b1100", "edx": "0b1"})]),
            cfg(cpuid=[("0x01", "0x00", 0, {"ecx": "1010"})]),
        ],
        {
            "kvm_capabilities": [],
            "cpuid_modifiers": [
                {
                    "leaf": "0x1",
                    "subleaf": "0x0",
                    "flags": 0,
                    "modifiers": [{"register": "ecx", "bitmap": "0b" + "0" * 28 + "1000"}],
                }
            ],
            "msr_modifiers": [],
        },
        id="cpuid-hex-numeric-and-and-registers-in-all",
    ),
    pytest.param(
        [
            cfg(
                cpuid=[
                    ("0x7", "0x0", 0, {"ebx": ONES}),
                    ("0xb", "0x0", 0, {"eax": ONES}),
                    ("0x1f", "0x1", 0, {"eax": ONES}),
                    ("0x4", "0x0", 1, {"eax": ONES}),
                ]
            ),
            cfg(
                cpuid=[
                    ("0xb", "0x0", 0, {"eax": ONES}),
                    ("0x1f", "0x1", 0, {"eax": ONES}),
                    ("0x7", "0x0", 0, {"ebx": "0b" + ONES}),
                    ("0x4", "0x0", 0, {"eax": ONES}),
                ]
            ),
        ],
        {
            "kvm_capabilities": [],
            "cpuid_modifiers": [
                {
                    "leaf": "0x7",
                    "subleaf": "0x0",
                    "flags": 0,
                    "modifiers": [{"register": "ebx", "bitmap": "0b" + ONES}],
                }
            ],
            "msr_modifiers": [],
        },
        id="leaves-0xb-0x1f-dropped-flags-part-of-key",
    ),
    pytest.param(
        [
            cfg(msr=[("0x10a", "0b" + "1" * 64), ("0x48", "0b1")]),
            cfg(msr=[("0x10A", "0b0101"), ("0x49", "0b1")]),
        ],
        {
            "kvm_capabilities": [],
            "cpuid_modifiers": [],
            "msr_modifiers": [{"addr": "0x10a", "bitmap": "0b" + "0" * 61 + "101"}],
        },
        id="msr-by-address-anded-64-digits",
    ),
    pytest.param(
        [cfg(kvm=["1"])],
        {"kvm_capabilities": ["1"], "cpuid_modifiers": [], "msr_modifiers": []},
        id="single-config",
    ),
]


@pytest.mark.parametrize(("configs", "expected"), INTERSECT_TABLE)
def test_intersect(configs: list[str], expected: dict[str, Any]) -> None:
    out = intersect(configs)
    assert out is not None
    assert json.loads(out) == expected
    assert list(json.loads(out)) == ["kvm_capabilities", "cpuid_modifiers", "msr_modifiers"]


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        "[]",
        '{"kvm_capabilities": "x"}',
        cfg(cpuid=[("0xzz", "0x0", 0, {"eax": "0b1"})]),
        cfg(cpuid=[("0x1", "0x0", 0, {"eax": "0b102"})]),
        cfg(msr=[("0x1", "0b" + "1" * 65)]),
    ],
)
def test_invalid_input_gives_nothing(bad: str) -> None:
    assert intersect([cfg(kvm=["1"]), bad]) is None


def test_empty_arrays_stay_arrays() -> None:
    assert (
        intersect(["{}", "{}"]) == '{"kvm_capabilities":[],"cpuid_modifiers":[],"msr_modifiers":[]}'
    )


# ---------------------------------------------------------------------------
# Delivery over gRPC, per cluster, exactly once, the same from any replica
# ---------------------------------------------------------------------------
@pytest.fixture
def two_replicas(
    backend: str,
    redis_client: Any,
    request: pytest.FixtureRequest,
) -> Iterator[tuple[ThreadedReplica, ThreadedReplica]]:
    if backend == "real":
        url: str | None = request.getfixturevalue("redis_server").url
        make: Callable[[], Any] = lambda: async_client(url)  # noqa: E731
    else:
        url = None
        server = redis_client.connection_pool.connection_kwargs["server"]
        make = lambda: fakeredis.FakeAsyncRedis(server=server)  # noqa: E731
    loop = LoopThread()
    try:
        with (
            ThreadedReplica(settings_for(), make, url, loop) as a,
            ThreadedReplica(settings_for(), make, url, loop) as b,
        ):
            yield a, b
    finally:
        loop.close()


def beat(
    r: ThreadedReplica, node_id: str, config: str = "", cluster: str = "c1", sid: str = "i1"
) -> str:
    req = hb_request(node_id, cluster=cluster, sid=sid)
    req.machine_info.cpu_config_json = config
    resp = r.stub.Heartbeat(req, metadata=endpoint_md(f"{node_id}:5000"))
    return str(resp.cpu_config_json)


A = cfg(kvm=["1", "2", "3"], msr=[("0x10a", "0b111")])
B = cfg(kvm=["2", "3"], msr=[("0x10a", "0b101")])
C = cfg(kvm=["3"], msr=[("0x10a", "0b100")])


def test_delivered_once_per_node_when_every_node_has_one(
    two_replicas: tuple[ThreadedReplica, ThreadedReplica],
) -> None:
    ra, rb = two_replicas
    ab = intersect([A, B])
    assert beat(rb, "n2") == ""  # n2 is observed but has no config: wait
    assert beat(ra, "n1", A) == ""
    assert beat(ra, "n1") == ""
    assert beat(rb, "n2", B) == ab  # now every node has one
    assert beat(ra, "n1") == ab  # n1 gets it on its next heartbeat, via the other replica
    assert beat(rb, "n1") == ""  # exactly once
    assert beat(ra, "n2") == ""
    assert beat(ra, "x1", C, cluster="c2") == intersect([C])  # clusters are separate

    # a node joining invalidates the intersection and every delivery mark
    abc = intersect([A, B, C])
    assert abc != ab
    assert beat(rb, "n3", C) == abc
    assert beat(ra, "n1") == abc
    assert beat(rb, "n2") == abc
    assert beat(ra, "n3") == ""
    # a changed config does the same
    assert beat(ra, "n2", A) == intersect([A, A, C])
    assert beat(rb, "n1") == intersect([A, A, C])
    # a restarted node (new service instance) gets it again, nobody else does
    assert beat(rb, "n1", A, sid="i2") == intersect([A, A, C])
    assert beat(ra, "n3") == intersect([A, A, C])
    assert beat(rb, "n3") == ""


def test_invalid_config_delivers_nothing(
    two_replicas: tuple[ThreadedReplica, ThreadedReplica],
) -> None:
    ra, rb = two_replicas
    assert beat(rb, "n2", "{broken") == ""
    assert beat(ra, "n1", A) == ""
    assert beat(ra, "n1") == ""
    assert beat(rb, "n2", B) == intersect([A, B])  # fixed: delivered


def test_node_leaving_unblocks_the_cluster(
    two_replicas: tuple[ThreadedReplica, ThreadedReplica],
) -> None:
    ra, rb = two_replicas
    from scheduler.grpc import scheduler_pb2 as pb

    assert beat(rb, "n2") == ""  # n2 never sends a config ...
    assert beat(ra, "n1", A) == ""
    ra.stub.UnregisterNode(pb.UnregisterNodeRequest(node_id="n2", service_instance_id="i1"))
    assert beat(ra, "n1") == intersect([A])  # ... and leaves: n1 alone decides
