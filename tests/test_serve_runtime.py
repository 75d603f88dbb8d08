"""How ``schedctl serve`` runs: its event loop (uvloop when it can be
imported, asyncio otherwise) and ``--workers N`` (N replica processes on one
port), as real processes where it matters."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.loops import Loop, LoopUnavailable, choose
from scheduler.testing.redis_server import free_port
from scheduler.testing.replicas import ServeProcess, sees_listeners
from tests.helpers import cold, endpoint_md, hb_request, places_on_a_fresh_node


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop cannot be imported (as where it is not installed)."""
    monkeypatch.setitem(sys.modules, "uvloop", None)


# -- the event loop -------------------------------------------------------------
async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(not _has_uvloop(), reason="uvloop is not installed here")
def test_auto_chooses_uvloop_when_it_imports() -> None:
    loop = choose("auto")
    assert loop.name == "uvloop" and loop.why.startswith("uvloop ")
    assert loop.run(_loop_module()).startswith("uvloop")
    assert choose("uvloop").name == "uvloop"


@pytest.mark.usefixtures("no_uvloop")
def test_auto_falls_back_to_asyncio_and_uvloop_alone_is_an_error() -> None:
    loop = choose("auto")
    assert loop.name == "asyncio"
    assert "uvloop cannot be imported" in loop.why and "[fast]" in loop.why
    assert loop.run(_loop_module()).startswith("asyncio")
    with pytest.raises(LoopUnavailable, match="--loop uvloop: uvloop cannot be imported"):
        choose("uvloop")


def test_asyncio_when_asked_and_unknown_names_refused() -> None:
    assert choose("asyncio") == Loop("asyncio", "asked for (--loop asyncio)")
    assert Loop("asyncio", "").run(_loop_module()).startswith("asyncio")
    with pytest.raises(LoopUnavailable, match="unknown event loop 'trio'"):
        choose("trio")


# -- flags, refused before anything starts ------------------------------------
def _serve(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(
        main, ["serve", *args], env={"SCHEDULER_REDIS_ADDR": None, "SCHEDULER_CONFIG": None}
    )
    return r.exit_code, r.output


def test_flags_are_validated() -> None:
    code, out = _serve("--workers", "0")
    assert code == 2 and "--workers" in out and "0 is not in the range" in out
    code, out = _serve("--workers", "65")
    assert code == 2 and "65 is not in the range" in out
    code, out = _serve("--loop", "trio")
    assert code == 2 and "'trio' is not one of 'auto', 'asyncio', 'uvloop'" in out


def test_workers_need_a_redis() -> None:
    code, out = _serve("--workers", "2")
    assert code == 1
    assert "--workers needs a Redis" in out and "embedded store" in out


def test_workers_metrics_ports_must_fit() -> None:
    code, out = _serve(
        "--workers", "3", "--redis", "127.0.0.1:6379", "--metrics-listen", "127.0.0.1:65534"
    )
    assert code == 1 and "worker 2 would serve /metrics on port 65536" in out


@pytest.mark.usefixtures("no_uvloop")
def test_loop_uvloop_without_uvloop_is_refused() -> None:
    code, out = _serve("--loop", "uvloop")
    assert code == 1 and "--loop uvloop: uvloop cannot be imported" in out


# -- real processes ---------------------------------------------------------------
@pytest.fixture
def broken_uvloop(tmp_path: Path) -> str:
    """A PYTHONPATH on which ``import uvloop`` fails, as where it is missing."""
    (tmp_path / "uvloop").mkdir()
    (tmp_path / "uvloop" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'uvloop' (hidden by the test)\")\n"
    )
    return str(tmp_path)


@pytest.mark.slow
def test_a_replica_without_uvloop_says_so_and_serves_on_asyncio(
    processes: list[ServeProcess], broken_uvloop: str
) -> None:
    p = ServeProcess(
        {"scheduler": {}},
        redis_url=None,
        env={"PYTHONPATH": os.pathsep.join([broken_uvloop, os.environ.get("PYTHONPATH", "")])},
    )
    processes.append(p)
    p.wait_serving()
    assert places_on_a_fresh_node(p.address) == "n1"
    assert "event loop: asyncio (uvloop cannot be imported" in p.log()


@pytest.mark.slow
def test_the_first_line_says_when_the_store_is_embedded(processes: list[ServeProcess]) -> None:
    p = ServeProcess({"scheduler": {}}, redis_url=None)
    processes.append(p)
    p.wait_serving()
    first = p.log().splitlines()[0]
    assert "schedctl serve " in first and "store: embedded (in-process, one replica only)" in first


@pytest.mark.slow
@pytest.mark.real_only
def test_schedctls_redis_option_before_serve_counts_as_serves_own(
    processes: list[ServeProcess], real_url: str
) -> None:
    """`schedctl --redis URL serve`: the group-level option is not dropped."""
    p = ServeProcess(
        {"scheduler": {}}, redis_url=None, cell="group-opt", before=("--redis", real_url)
    )
    processes.append(p)
    p.wait_serving()
    assert "store: embedded" not in p.log()
    assert redis.Redis.from_url(real_url).exists("sched:{group-opt}:policy") == 1


def _two_free_ports() -> int:
    """A port p such that p and p + 1 are free (the metrics of two workers)."""
    while True:
        p = free_port()
        if p >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p


def _wait_log(p: ServeProcess, pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        m = re.search(pattern, p.log())
        if m:
            return m
        if p.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{pattern!r} not in the log:\n{p.log()}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _schedule_counts(metrics_port: int) -> float:
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    m = re.search(
        r'agentenv_scheduler_rpc_duration_seconds_count\{rpc="Schedule",'
        r'status="ok"\} ([0-9.e+]+)',
        text,
    )
    return float(m.group(1)) if m else 0.0


def _stopped(log: str, worker: int) -> bool:
    """Worker ``worker`` logged that it stopped (its lines name it)."""
    return re.search(rf"worker={worker} pid=\d+ v[^\]]*\]: stopped$", log, re.M) is not None


@pytest.fixture
def workers(real_url: str) -> Iterator[tuple[ServeProcess, list[int]]]:
    """``schedctl serve --workers 2``, serving; the workers' pids."""
    metrics = _two_free_ports()
    p = ServeProcess(
        {"scheduler": {}, "log_level": "info"},
        real_url,
        cell="workers",
        extra_args=("--workers", "2", "--metrics-listen", f"127.0.0.1:{metrics}"),
    )
    p.metrics_port = metrics
    try:
        p.wait_serving()
        _wait_log(p, r"2 workers serving scheduler\.v1\.Scheduler on port")
        by_index = dict(re.findall(r"worker (\d) \(pid (\d+)\) serving on port", p.log()))
        yield p, [int(by_index[str(i)]) for i in range(2)]
    finally:
        p.close()


@pytest.mark.slow
@pytest.mark.real_only
def test_workers_share_one_port_and_each_answers(
    workers: tuple[ServeProcess, list[int]], processes: list[ServeProcess]
) -> None:
    p, pids = workers
    assert len(pids) == 2
    expected = "uvloop" if _has_uvloop() else "asyncio"
    assert f"event loop: {expected}" in p.log()
    with grpc.insecure_channel(p.address) as ch:
        pb_grpc.SchedulerStub(ch).Heartbeat(
            hb_request("n1", cpu=1000, mem_gib=1000), metadata=endpoint_md("n1:5000")
        )
    # each channel its own TCP connection: the kernel spreads them over the workers
    for _ in range(24):
        with grpc.insecure_channel(
            p.address, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as ch:
            assert pb_grpc.SchedulerStub(ch).Schedule(cold(1, 16)).node.node_id == "n1"
    counts = [_schedule_counts(p.metrics_port), _schedule_counts(p.metrics_port + 1)]
    assert sum(counts) == 24 and all(c > 0 for c in counts), counts

    # the port is taken: a second --workers server refuses to join it
    second = ServeProcess(
        {"scheduler": {}},
        p.redis_url,
        cell="workers",
        extra_args=("--workers", "2", "--grpc-listen", p.address),
    )
    processes.append(second)
    assert second.proc.wait(60) == 1
    assert f"gRPC cannot listen on {p.address}" in second.log()

    # a worker that dies is started again; the port serves meanwhile and after
    os.kill(pids[1], signal.SIGKILL)
    _wait_log(p, r"worker 1 \(pid \d+\) exited with -9 while serving; starting it again")
    again = int(_wait_log(p, r"worker 1 \(pid (\d+)\) serving again").group(1))
    assert again not in pids
    with grpc.insecure_channel(p.address) as ch:
        assert pb_grpc.SchedulerStub(ch).Schedule(cold(1, 16)).node.node_id == "n1"

    # SIGTERM to the parent stops every worker, each after its drain
    assert p.terminate() == 0
    assert not _alive(pids[0]) and not _alive(again)
    assert _stopped(p.log(), 0) and _stopped(p.log(), 1)


@pytest.mark.slow
@pytest.mark.real_only
def test_workers_stop_when_their_parent_is_killed(workers: tuple[ServeProcess, list[int]]) -> None:
    p, pids = workers
    p.proc.kill()
    p.proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "workers outlived their parent"
        time.sleep(0.05)
    assert _stopped(p.log(), 0) and _stopped(p.log(), 1)


def test_workers_check_the_port_and_hold_it() -> None:
    from scheduler.cli.workers import WorkersError, _reserve

    holder, port = _reserve("127.0.0.1:0")  # port 0: a free one, held for the workers
    with holder:
        assert port > 0
        # a worker binds beside the holder (both SO_REUSEPORT) and listens
        worker = socket.socket()
        worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        worker.bind(("127.0.0.1", port))
        worker.listen()
        with worker, pytest.raises(WorkersError, match=f"gRPC cannot listen on 127.0.0.1:{port}"):
            _reserve(f"127.0.0.1:{port}")  # something listens there: not joined silently


@pytest.mark.skipif(not sees_listeners(), reason="reads Linux's /proc")
def test_a_replica_whose_port_was_taken_starts_again_on_another(
    real_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test harness's own race: a port chosen free is taken by another
    process before the replica binds it.  wait_serving must not take that
    process's SERVING for the replica's: the replica exits on its bind, and
    is started again on another port (ServeProcess's retry)."""
    from scheduler.testing import replicas

    thief = ServeProcess({"scheduler": {}}, real_url, cell="thief").wait_serving(60)
    try:
        chosen = iter([thief.port])
        real = replicas.free_port
        monkeypatch.setattr(replicas, "free_port", lambda: next(chosen, None) or real())
        p = ServeProcess({"scheduler": {}}, real_url, cell="robbed")
        try:
            assert p.port == thief.port  # (its first choice: the taken port)
            p.wait_serving(60)
            assert p.port != thief.port and p.proc.poll() is None
            assert replicas.listens(p.proc.pid, p.port)
            assert not replicas.listens(p.proc.pid, thief.port)
            assert replicas.listens(thief.proc.pid, thief.port)
        finally:
            p.close()
    finally:
        thief.close()
