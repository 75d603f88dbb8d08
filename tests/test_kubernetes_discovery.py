"""Kubernetes discovery (scheduler/server/kubernetes.py) against the API server
double (scheduler/testing/kube_api.py, the real list/watch wire on a real HTTP
server) and a real Redis: no Kubernetes API server can run here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduler.client.aio import AsyncScheduler
from scheduler.domain.errors import InvalidArgument
from scheduler.domain.policy import Policy
from scheduler.domain.records import Request
from scheduler.server.kubernetes import (
    EndpointSlice,
    KubernetesWatcher,
    Timing,
    check_settings,
    discovered_view,
    nodes_from_slices,
    parse_selector,
    selector_matches,
)
from scheduler.store.connection import async_client
from scheduler.testing.kube_api import (
    PODS,
    SLICES,
    KubeApiServer,
    endpoint,
    endpoint_slice,
    go_bool,
    pod,
)
from tests.helpers import hb

NS = "agentenv-system"
SERVICE = "agentenv-nodes"
FAST = Timing(
    backoff_s=0.05, max_backoff_s=0.2, watch_timeout_s=30, request_timeout_s=2, resync_s=60
)


@dataclass
class Settings:
    """What config.py's KubernetesDiscovery holds (built here, as the brief says)."""

    namespace: str = NS
    service_name: str = SERVICE
    port: int = 8000
    scheme: str = "http"
    ignore_pod_selector: str = ""
    no_schedule_pod_selector: str = ""


# -- pure parts ------------------------------------------------------------------


def test_label_selectors_parse_and_match_as_kubernetes_does() -> None:
    sel = parse_selector("agentenv.io/scheduler-state in (draining, no-schedule),tier!=x,!gone")
    assert selector_matches(sel, {"agentenv.io/scheduler-state": "draining"})
    assert not selector_matches(sel, {"agentenv.io/scheduler-state": "draining", "gone": ""})
    assert not selector_matches(sel, {"agentenv.io/scheduler-state": "ready"})
    assert not selector_matches(sel, {"agentenv.io/scheduler-state": "draining", "tier": "x"})
    assert selector_matches(parse_selector("a==b"), {"a": "b"})
    assert selector_matches(parse_selector("a"), {"a": ""})
    assert not selector_matches(parse_selector("a notin (b)"), {"a": "b"})
    assert selector_matches(parse_selector("a notin (b)"), {})
    for bad in ("agentenv.io/scheduler-state in (", "a=b,", "=b", "a in b", "a=b c", "a=-x-"):
        with pytest.raises(InvalidArgument, match="no_schedule_pod_selector"):
            parse_selector(bad, "scheduler.discovery.kubernetes.no_schedule_pod_selector")


def test_settings_errors_name_the_key() -> None:
    check_settings(Settings(ignore_pod_selector="agentenv.io/discovery=ignore"))
    cases = {
        "namespace": Settings(namespace=" "),
        "service_name": Settings(service_name=""),
        "port": Settings(port=0),
        "scheme": Settings(scheme="http://"),
        "ignore_pod_selector": Settings(ignore_pod_selector="a in ("),
    }
    for key, settings in cases.items():
        with pytest.raises(InvalidArgument, match=f"scheduler.discovery.kubernetes.{key} "):
            check_settings(settings)
    with pytest.raises(InvalidArgument, match="port"):
        KubernetesWatcher(Settings(port=70000), _NoTarget())


def _slice(*endpoints: dict[str, Any], port: int = 8000) -> EndpointSlice:
    import msgspec

    raw = endpoint_slice("s", SERVICE, list(endpoints), port=port)
    return msgspec.json.decode(msgspec.json.encode(raw), type=EndpointSlice)


def test_nodes_are_derived_as_the_reference_derives_them() -> None:
    no_ref = endpoint("x", "10.0.0.9")
    del no_ref["targetRef"]
    active, lingering = nodes_from_slices(
        [
            _slice(
                endpoint("a", "10.0.0.1"),
                endpoint("b", "10.0.0.2", ready=False, serving=True),  # serving rules, not ready
                endpoint("c", "10.0.0.3", ready=False),  # not serving: out
                endpoint("d", "10.0.0.4", ready=False, serving=True, terminating=True),
                endpoint("e", "10.0.0.5", ready=False, serving=False, terminating=True),
                endpoint("v6", "2001:db8::10"),
                {**endpoint("f", "10.0.0.6"), "addresses": ["not-an-ip", "10.0.0.7"]},
                {**endpoint("g", "10.0.0.8"), "addresses": ["not-an-ip"]},
                no_ref,
            ),
            _slice(endpoint("other-port", "10.0.1.1"), port=9000),
        ],
        8000,
        "http",
    )
    assert active == {
        "a": "http://10.0.0.1:8000",
        "b": "http://10.0.0.2:8000",
        "v6": "http://[2001:db8::10]:8000",
        "f": "http://10.0.0.7:8000",
    }
    assert lingering == {"d": "http://10.0.0.4:8000"}
    both = discovered_view({"n": "http://10.0.0.1:8000"}, {"n": "http://10.0.0.2:8000"})
    assert both == {"n": ("http://10.0.0.2:8000", True)}  # terminating somewhere: lingering
    view = discovered_view(active, lingering, ignored={"a"}, no_schedule={"b"})
    assert view == {
        "b": ("http://10.0.0.2:8000", True),
        "d": ("http://10.0.0.4:8000", True),
        "v6": ("http://[2001:db8::10]:8000", False),
        "f": ("http://10.0.0.7:8000", False),
    }


def test_the_script_applies_a_view_only_if_no_stored_position_is_ahead(redis_client: Any) -> None:
    from scheduler.client.sync import Scheduler

    s = Scheduler(redis_client, cell="kube")
    s.sync_policy(Policy(static_nodes=True))
    assert s.sync_discovered([10, 10, 10], [("a", "http://a:1", False), ("b", "http://b:1", True)])
    assert {(v.node_id, v.lingering, v.static) for v in s.nodes()} == {
        ("a", False, True),
        ("b", True, True),
    }
    # behind in one stream (ahead in the others): nothing changes
    assert s.sync_discovered([20, 9, 20], [("c", "http://c:1", False)]) == (False, 0, 0)
    assert {v.node_id for v in s.nodes()} == {"a", "b"}
    # as fresh: applied; b leaves, a turns lingering
    assert s.sync_discovered([10, 10, 10], [("a", "http://a:1", True)]) == (True, 1, 1)
    assert [(v.node_id, v.lingering) for v in s.nodes()] == [("a", True)]
    # positions past 2^53 compare exactly
    assert s.sync_discovered([2**60 + 1] * 3, [])[0]
    assert not s.sync_discovered([2**60] * 3, [("a", "http://a:1", False)])[0]
    with pytest.raises(InvalidArgument, match="positions"):
        s.sync_discovered([1, 2], [])
    with pytest.raises(InvalidArgument, match=r"nodes\[0\].endpoint"):
        s.sync_discovered([2**61] * 3, [("a", " ", False)])


# -- against the double and a real Redis -------------------------------------------


class _NoTarget:
    async def sync_discovered(self, positions: Any, nodes: Any) -> tuple[bool, int, int]:
        raise AssertionError("not called")


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


async def _sched(url: str, cell: str = "kube") -> AsyncScheduler:
    s = AsyncScheduler(async_client(url), cell=cell, url=url)
    await s.sync_policy(Policy(static_nodes=True))
    return s


@contextlib.asynccontextmanager
async def running(w: KubernetesWatcher) -> AsyncIterator[KubernetesWatcher]:
    task = asyncio.create_task(w.run())
    try:
        yield w
    finally:
        await w.stop()
        await asyncio.wait_for(task, 10)
        assert task.exception() is None  # run() never raises


def watcher(
    api: KubeApiServer, sched: AsyncScheduler, timing: Timing = FAST, **settings: Any
) -> KubernetesWatcher:
    return KubernetesWatcher(
        Settings(**settings), sched, api_url=api.url, token="test-token", timing=timing
    )


async def until(check: Callable[[], Awaitable[bool] | bool], what: str, limit: float = 15) -> None:
    """Poll ``check`` until it holds (a bound, not a timing under test)."""
    end = asyncio.get_running_loop().time() + limit
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if asyncio.get_running_loop().time() > end:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


async def listed(s: AsyncScheduler) -> dict[str, tuple[str, bool]]:
    return {v.node_id: (v.endpoint, v.lingering) for v in await s.nodes()}


def nodes_are(
    s: AsyncScheduler, want: dict[str, tuple[str, bool]]
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await listed(s) == want

    return check


def ep(i: int) -> str:
    return f"http://10.0.0.{i}:8000"


def test_discovered_nodes_are_placed_on_once_they_heartbeat(
    api: KubeApiServer, real_url: str
) -> None:
    api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))
    api.put(SLICES, endpoint_slice("nodes-b", SERVICE, [endpoint("node-2", "10.0.0.2")]))
    api.put(SLICES, endpoint_slice("others", "other-service", [endpoint("x", "10.0.9.9")]))
    api.put(
        SLICES, endpoint_slice("elsewhere", SERVICE, [endpoint("y", "10.0.9.8")], namespace="b")
    )

    async def go() -> None:
        s = await _sched(real_url)
        try:
            async with running(watcher(api, s)):
                await until(
                    nodes_are(s, {"node-1": (ep(1), False), "node-2": (ep(2), False)}), "found"
                )
                # a heartbeat without an endpoint (as the reference's reporter sends it)
                await s.heartbeat(hb("node-2", endpoint=""))
                placed = await s.schedule(Request.cold(1, 512))
                assert (placed.node_id, placed.endpoint) == ("node-2", ep(2))
                # a node no slice lists is refused (the list is Kubernetes')
                with pytest.raises(Exception, match="not in scheduler node list"):
                    await s.heartbeat(hb("stranger"))
        finally:
            await s.close()

    asyncio.run(go())
    lists = [q for p, q in api.requests if p.endswith("/endpointslices") and "watch" not in q]
    watches = [q for p, q in api.requests if p.endswith("/endpointslices") and "watch" in q]
    assert lists[0]["labelSelector"] == f"kubernetes.io/service-name={SERVICE}"
    assert all(
        p == f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices" for p, _ in api.requests
    )
    assert watches[0]["resourceVersion"] == "1004"  # the list's
    assert go_bool(watches[0]["allowWatchBookmarks"]) and go_bool(watches[0]["watch"])


def test_modified_and_deleted_endpoints_change_the_list(api: KubeApiServer, real_url: str) -> None:
    api.put(
        SLICES,
        endpoint_slice(
            "nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1"), endpoint("node-2", "10.0.0.2")]
        ),
    )

    async def go() -> None:
        s = await _sched(real_url)
        try:
            async with running(watcher(api, s)):
                await until(nodes_are(s, {"node-1": (ep(1), False), "node-2": (ep(2), False)}), "a")
                api.put(
                    SLICES,
                    endpoint_slice(
                        "nodes-a",
                        SERVICE,
                        [
                            endpoint("node-1", "10.0.0.11"),  # moved
                            endpoint(
                                "node-2", "10.0.0.2", ready=False, serving=True, terminating=True
                            ),
                            endpoint("node-3", "10.0.0.3"),
                        ],
                    ),
                )
                await until(
                    nodes_are(
                        s,
                        {
                            "node-1": ("http://10.0.0.11:8000", False),
                            "node-2": (ep(2), True),  # serving and terminating: lingering
                            "node-3": (ep(3), False),
                        },
                    ),
                    "modified",
                )
                # the endpoint's serving ends: the node leaves
                api.put(
                    SLICES,
                    endpoint_slice(
                        "nodes-a",
                        SERVICE,
                        [
                            endpoint("node-1", "10.0.0.11"),
                            endpoint("node-2", "10.0.0.2", ready=False, serving=False),
                            endpoint("node-3", "10.0.0.3"),
                        ],
                    ),
                )
                await until(
                    nodes_are(
                        s, {"node-1": ("http://10.0.0.11:8000", False), "node-3": (ep(3), False)}
                    ),
                    "not serving",
                )
                api.delete(SLICES, NS, "nodes-a")
                await until(nodes_are(s, {}), "deleted")
        finally:
            await s.close()

    asyncio.run(go())


def test_ignore_and_no_schedule_pod_selectors(api: KubeApiServer, real_url: str) -> None:
    api.put(
        SLICES,
        endpoint_slice(
            "nodes-a",
            SERVICE,
            [endpoint(f"node-{i}", f"10.0.0.{i}") for i in (1, 2, 3)],
        ),
    )
    api.put(PODS, pod("node-1", {"app.kubernetes.io/name": "agentenv-node"}))
    api.put(PODS, pod("node-2", {"agentenv.io/discovery": "ignore"}))
    api.put(PODS, pod("node-3", {"agentenv.io/scheduler-state": "no-schedule"}))
    selectors = {
        "ignore_pod_selector": "agentenv.io/discovery=ignore",
        "no_schedule_pod_selector": "agentenv.io/scheduler-state in (draining,no-schedule)",
    }

    async def go() -> None:
        s = await _sched(real_url)
        try:
            async with running(watcher(api, s, **selectors)) as w:
                await until(nodes_are(s, {"node-1": (ep(1), False), "node-3": (ep(3), True)}), "a")
                # a pod labelled while watched enters the selector (ADDED to that watch)
                api.put(PODS, pod("node-1", {"agentenv.io/scheduler-state": "draining"}))
                await until(nodes_are(s, {"node-1": (ep(1), True), "node-3": (ep(3), True)}), "b")
                # one unlabelled leaves it (DELETED to that watch): active again
                api.put(PODS, pod("node-3", {}))
                api.put(PODS, pod("node-2", {}))
                await until(
                    nodes_are(
                        s,
                        {
                            "node-1": (ep(1), True),
                            "node-2": (ep(2), False),
                            "node-3": (ep(3), False),
                        },
                    ),
                    "c",
                )
                assert w.no_schedule is not None and set(w.no_schedule.objects) == {"node-1"}
        finally:
            await s.close()

    asyncio.run(go())
    pod_queries = {
        q["labelSelector"] for p, q in api.requests if p == f"/api/v1/namespaces/{NS}/pods"
    }
    assert pod_queries == set(selectors.values())


@pytest.mark.parametrize("how", ["error event", "http status"])
def test_410_lists_again(api: KubeApiServer, real_url: str, how: str) -> None:
    api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))

    async def go() -> None:
        s = await _sched(real_url)
        try:
            async with running(watcher(api, s)) as w:
                assert w is not None
                await until(nodes_are(s, {"node-1": (ep(1), False)}), "found")
                await until(lambda: api.open_watches(SLICES) == 1, "watching")
                assert w.slices is not None and w.slices.lists == 1
                if how == "error event":
                    # changes the watch never sees, then its history is gone
                    api.down()
                    api.put(
                        SLICES, endpoint_slice("nodes-b", SERVICE, [endpoint("node-2", "10.0.0.2")])
                    )
                    api.up()
                    await until(lambda: api.open_watches(SLICES) == 1, "watching again")
                    api.delete(SLICES, NS, "nodes-a")
                    api.compact()
                    assert api.expire_watches() == 1
                else:
                    api.too_old_as_status = True
                    api.down()
                    api.put(
                        SLICES, endpoint_slice("nodes-b", SERVICE, [endpoint("node-2", "10.0.0.2")])
                    )
                    api.delete(SLICES, NS, "nodes-a")
                    api.compact()
                    api.up()
                await until(lambda: w.slices is not None and w.slices.lists == 2, "relisted")
                await until(nodes_are(s, {"node-2": (ep(2), False)}), "the list's nodes")
        finally:
            await s.close()

    asyncio.run(go())
    if how == "http status":
        assert any(
            q.get("watch") and int(q["resourceVersion"]) < api.resource_version
            for p, q in api.requests
        )


def test_api_server_down_keeps_the_list_and_recovers(
    api: KubeApiServer, real_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))
    caplog.set_level(logging.WARNING, logger="scheduler.server.kubernetes")

    async def go() -> None:
        s = await _sched(real_url)
        try:
            async with running(
                watcher(
                    api,
                    s,
                    timing=Timing(
                        backoff_s=0.05,
                        max_backoff_s=0.2,
                        watch_timeout_s=30,
                        request_timeout_s=2,
                        resync_s=0.1,
                    ),
                )
            ) as w:
                await until(nodes_are(s, {"node-1": (ep(1), False)}), "found")
                api.down()
                assert w.slices is not None
                await until(lambda: w.slices is not None and w.slices.failures >= 3, "retried")
                written = w.applied
                await until(lambda: w.applied >= written + 3, "resynced while down")
                assert await listed(s) == {"node-1": (ep(1), False)}  # kept, not dropped
                api.put(
                    SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-2", "10.0.0.2")])
                )
                api.up()
                await until(nodes_are(s, {"node-2": (ep(2), False)}), "recovered")
        finally:
            await s.close()

    asyncio.run(go())
    assert any(
        "watch failed" in r.getMessage() or "list failed" in r.getMessage() for r in caplog.records
    )


def test_a_wrong_token_writes_nothing_and_says_so(
    api: KubeApiServer, real_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))
    caplog.set_level(logging.WARNING, logger="scheduler.server.kubernetes")

    async def go() -> None:
        s = await _sched(real_url)
        try:
            w = KubernetesWatcher(Settings(), s, api_url=api.url, token="wrong", timing=FAST)
            async with running(w):
                await until(lambda: w.slices is not None and w.slices.failures >= 2, "refused")
                assert await listed(s) == {} and w.applied == 0
        finally:
            await s.close()

    asyncio.run(go())
    assert any("HTTP 401" in r.getMessage() for r in caplog.records)


def test_bookmarks_move_the_watch_on(api: KubeApiServer, real_url: str) -> None:
    """A bookmark's resourceVersion is where the next watch starts: after the
    history is compacted past every object's version, a watch that was cut
    comes back without a 410 (no relist) only because of the bookmark."""
    api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))

    async def go() -> None:
        s = await _sched(real_url)
        try:
            async with running(watcher(api, s)) as w:
                await until(nodes_are(s, {"node-1": (ep(1), False)}), "found")
                await until(lambda: api.open_watches(SLICES) == 1, "watching")
                for _ in range(5):
                    api.touch()  # (writes to other objects of the cluster)
                assert api.bookmark() == 1
                assert w.slices is not None
                await until(
                    lambda: w.slices is not None and w.slices.position == api.resource_version,
                    "bookmarked",
                )
                api.compact()
                api.down()
                api.up()
                await until(lambda: api.open_watches(SLICES) == 1, "watching again")
                assert w.slices.lists == 1  # no 410: watched on from the bookmark
                api.put(
                    SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.9")])
                )
                await until(nodes_are(s, {"node-1": (ep(9), False)}), "watched on")
        finally:
            await s.close()

    asyncio.run(go())
    rvs = [q["resourceVersion"] for p, q in api.requests if "watch" in q]
    assert rvs[-1] == str(api.resource_version - 1)  # the bookmark's, not the list's
    assert rvs[0] != rvs[-1]


def test_two_replicas_converge_and_the_lagging_one_never_removes_a_fresher_node(
    real_url: str,
) -> None:
    """Two replicas watch two API servers of one cluster; the second one's
    watch lags (its server learns each change late).  Its writes while behind
    are refused: the node the fresh one added stays, the node it removed
    never comes back; once the lagging one catches up both write the same."""
    fresh, lagging = KubeApiServer().start(), KubeApiServer().start()
    servers = (fresh, lagging)

    def both(f: Callable[[KubeApiServer], Any]) -> None:
        for server in servers:
            f(server)

    both(
        lambda a: a.put(
            SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")])
        )
    )
    timing = Timing(
        backoff_s=0.05, max_backoff_s=0.2, watch_timeout_s=30, request_timeout_s=2, resync_s=0.05
    )

    async def go() -> None:
        a, b = await _sched(real_url), await _sched(real_url)
        try:
            wa, wb = watcher(fresh, a, timing), watcher(lagging, b, timing)
            async with running(wa), running(wb):
                await until(lambda: wa.applied > 0 and wb.applied > 0, "both wrote")
                assert await listed(a) == {"node-1": (ep(1), False)}
                # node-2 joins; only the fresh server knows yet
                add = endpoint_slice("nodes-b", SERVICE, [endpoint("node-2", "10.0.0.2")])
                fresh.put(SLICES, add)
                want = {"node-1": (ep(1), False), "node-2": (ep(2), False)}
                await until(nodes_are(a, want), "fresh wrote node-2")
                refused = wb.stale
                await until(lambda: wb.stale >= refused + 5, "lagging writes refused")
                assert await listed(b) == want  # node-2 stayed
                # node-1 leaves, on the fresh server only: it never comes back
                fresh.delete(SLICES, NS, "nodes-a")
                await until(nodes_are(a, {"node-2": (ep(2), False)}), "fresh removed node-1")
                refused = wb.stale
                await until(lambda: wb.stale >= refused + 5, "lagging writes refused again")
                assert await listed(b) == {"node-2": (ep(2), False)}
                # the lagging server catches up: both views, and writes, agree
                lagging.put(SLICES, add)
                lagging.delete(SLICES, NS, "nodes-a")
                assert lagging.resource_version == fresh.resource_version
                applied = wb.applied
                await until(lambda: wb.applied >= applied + 3, "lagging writes applied again")
                assert wa.compute() == wb.compute() == {"node-2": (ep(2), False)}
                assert await listed(b) == {"node-2": (ep(2), False)}
        finally:
            await a.close()
            await b.close()

    try:
        asyncio.run(go())
    finally:
        both(lambda a: a.down())


def test_in_cluster_configuration(tmp_path: Path, real_url: str) -> None:
    """In a pod: the service account's token and CA, KUBERNETES_SERVICE_HOST /
    _PORT, over TLS (the double serves a certificate of a CA written here)."""
    from tests.certs import Authority

    ca = Authority()
    cert, key = ca.issue("127.0.0.1", server=True).write(tmp_path, "server")
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    ca.write(sa, "ca")
    (sa / "token").write_text("pod-token")
    (sa / "namespace").write_text(NS)
    with KubeApiServer(token="pod-token", certfile=str(cert), keyfile=str(key)) as api:
        api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))

        async def go() -> None:
            s = await _sched(real_url)
            try:
                env = {
                    "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                    "KUBERNETES_SERVICE_PORT": str(api.port),
                }
                w = KubernetesWatcher(
                    Settings(), s, service_account_dir=str(sa), environ=env, timing=FAST
                )
                async with running(w):
                    await until(nodes_are(s, {"node-1": (ep(1), False)}), "found in cluster")
            finally:
                await s.close()

        asyncio.run(go())


def test_redis_down_then_back_empty_gets_the_list_again(
    api: KubeApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis goes away and comes back without its data: the watcher keeps
    watching, says Redis failed, and its next write (after the replica puts
    the kept policy back) fills the cell with the current list."""
    from scheduler.testing.redis_server import RedisServer

    api.put(SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-1", "10.0.0.1")]))
    caplog.set_level(logging.WARNING, logger="scheduler.server.kubernetes")
    timing = Timing(
        backoff_s=0.05, max_backoff_s=0.2, watch_timeout_s=30, request_timeout_s=2, resync_s=0.2
    )
    with RedisServer() as redis_server:
        where = f"Redis at {redis_server.url} is unreachable"

        async def go() -> None:
            s = AsyncScheduler(
                async_client(redis_server.url, 1.0), cell="kube", url=redis_server.url
            )
            s.keep_cell(Policy(static_nodes=True))
            await s.prepare_cell()
            try:
                async with running(watcher(api, s, timing)) as w:
                    await until(nodes_are(s, {"node-1": (ep(1), False)}), "found")
                    redis_server.kill()
                    api.put(
                        SLICES, endpoint_slice("nodes-a", SERVICE, [endpoint("node-2", "10.0.0.2")])
                    )
                    await until(lambda: w.write_failures >= 2, "writes failed")
                    redis_server.wipe()
                    redis_server.start()
                    await until(nodes_are(s, {"node-2": (ep(2), False)}), "written again")
            finally:
                await s.close()

        asyncio.run(go())
    assert any(
        "writing 1 nodes to Redis failed" in r.getMessage() and where in r.getMessage()
        for r in caplog.records
    )


def test_outside_a_pod_the_watcher_says_why_and_stops_when_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="scheduler.server.kubernetes")

    async def go() -> None:
        w = KubernetesWatcher(
            Settings(), _NoTarget(), service_account_dir=str(tmp_path), environ={}, timing=FAST
        )
        async with running(w):
            await until(lambda: len(caplog.records) >= 2, "retried")

    asyncio.run(go())
    assert "cannot configure its API client" in caplog.records[0].getMessage()


def test_resource_versions_are_read_as_etcd_revisions() -> None:
    from scheduler.server.kubernetes import NotComparable, resource_version

    assert resource_version("12746") == 12746
    for bad in ("", "01", "abc", "-1", "1.5"):
        with pytest.raises(NotComparable, match="not a decimal etcd revision"):
            resource_version(bad)


def test_a_replica_keeping_a_discovered_cell_leaves_its_nodes_alone(real_url: str) -> None:
    """A replica starting (or restoring the policy) in kubernetes mode must
    not sync its empty static list: that would remove every discovered node
    with its bindings and reservations until the watcher wrote them again."""

    async def go() -> None:
        a = await _sched(real_url)
        b = AsyncScheduler(async_client(real_url), cell="kube", url=real_url)
        try:
            await a.sync_discovered([5, 5, 5], [("node-1", ep(1), False)])
            await a.heartbeat(hb("node-1", endpoint=""))
            placed = await a.schedule(Request.cold(1, 512))
            b.keep_cell(Policy(static_nodes=True), discovered=True)
            await b.prepare_cell()
            assert await listed(b) == {"node-1": (ep(1), False)}
            assert (await b.reservation(placed.reservation_id or "")).state == "pending"
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


#: the reference's deploy/k8s/base/config/scheduler.json, key for key
UPSTREAM_K8S_CONFIG = {
    "log_level": "info",
    "log_format": "json",
    "scheduler": {
        "grpc_listen_addr": ":9090",
        "strategy": "round_robin",
        "discovery": {
            "mode": "kubernetes",
            "kubernetes": {
                "namespace": "agentenv-system",
                "service_name": "agentenv-nodes",
                "port": 8000,
                "scheme": "http",
            },
        },
    },
}


def test_a_replica_over_grpc_places_on_nodes_kubernetes_found(
    api: KubeApiServer, real_url: str
) -> None:
    """The Kubernetes half of the drop-in: upstream's discovery section, the
    watcher beside a replica on one AsyncScheduler (the cell kept with
    discovered=True), a heartbeat as the reference's reporter sends it (no
    endpoint metadata), then Schedule, RecordAssignment and LookupNode."""
    import grpc

    from scheduler.grpc import scheduler_pb2 as pb
    from scheduler.server.replica import Replica
    from scheduler.testing.replicas import ThreadedReplica, settings_for
    from tests.helpers import cold, hb_request

    section = UPSTREAM_K8S_CONFIG["scheduler"]["discovery"]["kubernetes"]
    kube = Settings(**section)
    api.put(
        SLICES,
        endpoint_slice(
            "agentenv-nodes-x1",
            kube.service_name,
            [endpoint("agentenv-node-a", "10.1.0.5"), endpoint("agentenv-node-b", "10.1.0.6")],
        ),
    )
    policy = Policy(static_nodes=True, strategy="round_robin")

    class KubeReplica(ThreadedReplica):
        watcher: KubernetesWatcher | None = None
        task: asyncio.Task[None] | None = None

        async def _start(self) -> None:
            sched = AsyncScheduler(self.make_client(), self.settings.cell, url=self.url)
            self.replica = Replica(
                self.settings, sched, overwrite_policy=True, cell_stats_interval_s=None
            )
            sched.keep_cell(self.settings.policy, discovered=True)
            await self.replica.prepare_cell()
            await self.replica.start()
            self.watcher = watcher(api, sched, **section)
            self.task = asyncio.create_task(self.watcher.run())

        def __exit__(self, *exc: object) -> None:
            if self.watcher is not None:
                self.call(self.watcher.stop())
            super().__exit__(*exc)

    r = KubeReplica(settings_for(policy, cell="kube"), lambda: async_client(real_url), real_url)
    with r:
        stub = r.stub

        def listed_ids() -> list[str]:
            return sorted(n.node_id for n in stub.ListNodes(pb.ListNodesRequest()).nodes)

        async def found() -> None:
            await until(lambda: listed_ids() == ["agentenv-node-a", "agentenv-node-b"], "listed")

        asyncio.run(found())
        stub.Heartbeat(hb_request("agentenv-node-b"))  # (no x-node-endpoint)
        placed = stub.Schedule(cold(cpu=1, memory_mb=512))
        assert (placed.node.node_id, placed.node.endpoint) == (
            "agentenv-node-b",
            "http://10.1.0.6:8000",
        )
        stub.RecordAssignment(pb.RecordAssignmentRequest(sandbox_id="sb-1", node=placed.node))
        looked = stub.LookupNode(pb.LookupNodeRequest(sandbox_id="sb-1"))
        assert (looked.node.node_id, looked.node.endpoint) == (
            "agentenv-node-b",
            "http://10.1.0.6:8000",
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.Heartbeat(hb_request("not-a-pod-of-the-service"))
        assert "not in scheduler node list" in str(refused.value.details())
