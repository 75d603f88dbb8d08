"""Start and stop real redis-server processes for tests and benchmarks (free
ports, temp dirs): one server, or a Sentinel topology (a primary, replicas and
sentinels), with the faults an operator meets (kill -9, SIGSTOP, restart empty,
failover)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from scheduler.store.address import sentinel_url


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_LOW = _ephemeral_low()
_handed: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(below: int | None = None) -> int:
    """A free loopback port for a server to listen on.

    Chosen below the kernel's range for outgoing connections: a port bind(0)
    hands out is in that range, and any client socket opened before the
    server binds may take it as its own source port ("Address already in
    use").  Random, so that test processes side by side rarely meet, and never
    the same twice in one process."""
    top = min(below or _EPHEMERAL_LOW, _EPHEMERAL_LOW)
    if top - 10000 < 1000:  # (an unusual port range: take what the kernel gives)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.Random(os.urandom(8))
    if len(_handed) > (top - 10000) // 2:
        _handed.clear()  # (a process that took half the range: forget them; binds still checked)
    while True:
        port = rng.randrange(10000, top)
        if port not in _handed and _bindable(port):
            _handed.add(port)
            return port


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    while True:
        port = free_port(below=_EPHEMERAL_LOW - 10000)
        if port + 10000 <= 65535 and _bindable(port + 10000):
            return port


class RedisServer:
    """One redis-server process on 127.0.0.1.  ``stop()`` / ``start()`` may be
    called repeatedly (same port, same dir) to test outages."""

    def __init__(
        self, port: int | None = None, unix_socket: bool = False, extra_args: Sequence[str] = ()
    ) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.exe = exe
        self.cluster = "--cluster-enabled" in extra_args
        self.chosen = port is None  # ours to change if another process takes it first
        self.port = port or (free_cluster_port() if self.cluster else free_port())
        self.dir = Path(tempfile.mkdtemp(prefix="sched-redis-"))
        self.socket = self.dir / "redis.sock" if unix_socket else None
        self.extra_args = tuple(extra_args)
        #: the environment of the next start (None: this process's), e.g. a
        #: shifted wall clock (bench/clockshift.py)
        self.env: dict[str, str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, retries: int = 3) -> RedisServer:
        try:
            return self._start()
        except RuntimeError:
            log = self.dir / "redis.log"
            taken = log.exists() and "Address already in use" in log.read_text(errors="replace")
            if not (self.chosen and taken and retries > 0):
                raise
            self.port = free_cluster_port() if self.cluster else free_port()
            return self.start(retries - 1)

    def _start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--protected-mode",
                "no",
                "--loglevel",
                "warning",
                "--logfile",
                str(self.dir / "redis.log"),
                *(["--unixsocket", str(self.socket)] if self.socket else []),
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.exceptions.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"redis-server did not start on port {self.port}"
                        ) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def client(self, **kwargs: object) -> Any:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        """kill -9: no shutdown, no save."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def wipe(self) -> None:
        """Forget what persistence kept (for a restart that comes back empty)."""
        for f in self.dir.iterdir():
            if f.name != "redis.log":
                shutil.rmtree(f) if f.is_dir() else f.unlink()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(
    check: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> float:
    """Poll ``check`` until it is truthy; returns the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except (redis.exceptions.RedisError, OSError):
            pass
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout}s")
        time.sleep(interval)


#: how long a sentinel in TILT mode acts on nothing (Redis's SENTINEL_TILT_PERIOD)
TILT_S = 30.0


class SentinelTopology:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a
    majority) on 127.0.0.1, free ports, temp dirs.  ``url`` is the
    ``redis+sentinel://`` address clients use."""

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        service: str = "sched",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        # a replica attaches at once (the default waits 5 s for more replicas to share a sync)
        extra_args = ["--repl-diskless-sync-delay", "0", *extra_args]
        self.primary = RedisServer(extra_args=extra_args)
        self.replicas = [
            RedisServer(
                extra_args=[*extra_args, "--replicaof", "127.0.0.1", str(self.primary.port)]
            )
            for _ in range(replicas)
        ]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        # (a sentinel fsyncs its config on every change, in its main thread: on a
        # busy disk that stalls it past 2 s and it enters TILT; memory does not)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.sentinel_dir = Path(tempfile.mkdtemp(prefix="sched-sentinel-", dir=shm))
        self.sentinel_procs: list[subprocess.Popen[bytes]] = []

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    @property
    def url(self) -> str:
        return sentinel_url([("127.0.0.1", p) for p in self.sentinel_ports], self.service)

    def start(self) -> SentinelTopology:
        try:
            self.primary.start()
            for r in self.replicas:
                r.start()
            wait_until(
                lambda: all(
                    r.client().info("replication")["master_link_status"] == "up"
                    for r in self.replicas
                ),
                15,
                "replicas in sync",
            )
            for i, port in enumerate(self.sentinel_ports):
                self.sentinel_procs.append(self._start_sentinel(i, port))
            quorum = len(self.sentinel_ports) // 2 + 1

            def ready() -> bool:
                for port in self.sentinel_ports:
                    m: Any = self.sentinel(port).sentinel_master(self.service)
                    if m["num-other-sentinels"] < len(self.sentinel_ports) - 1 or m[
                        "num-slaves"
                    ] < len(self.replicas):
                        return False
                return quorum > 0

            wait_until(ready, 30, "sentinels see each other and the replicas", 0.1)
            return self
        except BaseException:
            self.close()
            raise

    def _start_sentinel(self, i: int, port: int) -> subprocess.Popen[bytes]:
        conf = self.sentinel_dir / f"sentinel-{i}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\nprotected-mode no\n"
            f"dir {self.sentinel_dir}\nlogfile {self.sentinel_dir}/sentinel-{i}.log\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} "
            f"{len(self.sentinel_ports) // 2 + 1}\n"
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
            f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {self.service} 1\n"
        )
        proc = subprocess.Popen(
            [self.primary.exe, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: self.sentinel(port).ping(), 10, f"sentinel on {port}")
        return proc

    def sentinel(self, port: int | None = None) -> redis.Redis:
        return redis.Redis(
            port=port or self.sentinel_ports[0],
            socket_connect_timeout=1,
            socket_timeout=5,
            decode_responses=True,
        )

    def primary_port(self) -> int:
        """The port the sentinels name as primary now."""
        for port in self.sentinel_ports:
            try:
                addr: Any = self.sentinel(port).sentinel_get_master_addr_by_name(self.service)
                return int(addr[1])
            except (redis.exceptions.RedisError, TypeError):
                continue
        raise RuntimeError("no sentinel answers")

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def tilted(self) -> bool:
        """Whether a sentinel is in TILT mode: its own timer ran more than 2 s
        late (a host too busy to schedule it, a slow fsync of its config),
        and for the next 30 s it acts on nothing, a failover included."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.exceptions.RedisError):
                info: Any = self.sentinel(port).info("sentinel")
                if int(info.get("sentinel_tilt", 0)):
                    return True
        return False

    def tilts(self) -> int:
        """TILT entries in the sentinels' logs so far (see :meth:`tilted`)."""
        total = 0
        for log in self.sentinel_dir.glob("sentinel-*.log"):
            with contextlib.suppress(OSError):
                total += log.read_text(errors="replace").count("+tilt")
        return total

    def wait_untilted(self, timeout: float = TILT_S + 15) -> None:
        """Until no sentinel is in TILT (a fault injected meanwhile would wait
        up to 30 s for Sentinel to act on it)."""
        wait_until(lambda: not self.tilted(), timeout, "the sentinels out of TILT", 0.2)

    def failover(self, timeout: float = 20) -> RedisServer:
        """SENTINEL FAILOVER: returns the new primary once it takes writes.

        Sent once no sentinel is in TILT (on a loaded host one enters it
        before a failover as often as not; SENTINEL FAILOVER then does
        nothing for up to 30 s), and the wait allows one more TILT period."""
        self.wait_untilted(TILT_S + timeout)
        old = self.primary_port()
        sentinel: Any = self.sentinel()
        sentinel.execute_command("SENTINEL", "FAILOVER", self.service)
        wait_until(lambda: self.primary_port() != old, TILT_S + timeout, "a new primary named")
        new = self.server(self.primary_port())
        wait_until(
            lambda: new.client().info("replication")["role"] == "master",
            timeout,
            "the new primary promoted",
        )
        return new

    def close(self) -> None:
        for proc in self.sentinel_procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.sentinel_procs.clear()
        for s in self.servers:
            s.close()
        shutil.rmtree(self.sentinel_dir, ignore_errors=True)

    def __enter__(self) -> SentinelTopology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClusterTopology:
    """A Redis Cluster of ``primaries`` primaries, each with ``replicas``
    replicas, on 127.0.0.1, free ports, temp dirs (``redis-cli --cluster
    create``).  ``url`` is the ``redis+cluster://`` address clients use."""

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 0,
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
    ) -> None:
        args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            "--repl-diskless-sync-delay",
            "0",
            *extra_args,
        ]
        self.servers = [RedisServer(extra_args=args) for _ in range(primaries * (1 + replicas))]
        self.replicas = replicas
        exe = shutil.which("redis-cli")
        if exe is None:
            raise RuntimeError("redis-cli is not installed (apt-get install redis-tools)")
        self.cli = exe

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3])

    def start(self) -> ClusterTopology:
        try:
            for s in self.servers:
                s.start()
            subprocess.run(
                [
                    self.cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{s.port}" for s in self.servers),
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            self.wait_ok()
            return self
        except BaseException:
            self.close()
            raise

    def wait_ok(self, timeout: float = 30) -> None:
        def ok() -> bool:
            for s in self.servers:
                if s.proc is None:
                    continue
                info: Any = s.client().execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or "cluster_slots_assigned:16384" not in text:
                    return False
            return True

        wait_until(ok, timeout, "cluster state ok on every node", 0.1)

    def slot_owner(self, slot: int) -> RedisServer:
        """The primary serving ``slot`` now (as the first live node sees it)."""
        for s in self.servers:
            if s.proc is None:
                continue
            shards: Any = s.client().execute_command("CLUSTER", "SLOTS")
            for row in shards:
                if int(row[0]) <= slot <= int(row[1]):
                    return self.by_port(int(row[2][1]))
        raise RuntimeError(f"no node serves slot {slot}")

    def primaries(self) -> list[RedisServer]:
        out = []
        for s in self.servers:
            if s.proc is not None and s.client().info("replication")["role"] == "master":
                out.append(s)
        return out

    def by_port(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def node_id(self, server: RedisServer) -> str:
        raw: Any = server.client().execute_command("CLUSTER", "MYID")
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def keyslot(self, key: str) -> int:
        return int(self.servers[0].client().execute_command("CLUSTER", "KEYSLOT", key))

    def migrate_slot(
        self,
        slot: int,
        target: RedisServer,
        batch: int = 10,
        between: Callable[[], None] | None = None,
    ) -> None:
        """Move ``slot`` to ``target`` the way ``redis-cli --cluster reshard``
        does: IMPORTING / MIGRATING, MIGRATE in batches, then SETSLOT NODE on
        every primary.  ``between`` runs after each batch (load goes on)."""
        source = self.slot_owner(slot)
        if source.port == target.port:
            return
        src_id, dst_id = self.node_id(source), self.node_id(target)
        target.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        source.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while True:
            keys: Any = source.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            source.client().execute_command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *keys
            )
            if between is not None:
                between()
        for s in self.primaries():
            s.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    def failover(self, slot: int, timeout: float = 30) -> RedisServer:
        """``CLUSTER FAILOVER`` on a replica of the primary serving ``slot``;
        returns that replica once it serves the slot."""
        primary = self.slot_owner(slot)
        rows: Any = primary.client().execute_command("CLUSTER", "REPLICAS", self.node_id(primary))
        line = rows[0].decode() if isinstance(rows[0], bytes) else str(rows[0])
        port = int(line.split()[1].split("@")[0].rsplit(":", 1)[1])
        replica = self.by_port(port)
        replica.client().execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: self.slot_owner(slot).port == port, timeout, "the replica promoted")
        self.wait_ok(timeout)
        return replica

    def close(self) -> None:
        for s in self.servers:
            s.close()

    def __enter__(self) -> ClusterTopology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def in_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")
