"""A rolling upgrade runs replicas of two versions on one cell: the older
revision's function library and this tree's are loaded side by side in one
real Redis (their names carry a hash of their code, so neither replaces the
other), and placements through either count against the same ceilings.

The older revision is the one before the newest change to ``lua/``: each
upgrade's last step. Its ``lua/`` files are read with ``git show`` and built
by this tree's builder, as ``bench versus`` does (bench/versus.py); this
tree's client builds every call, so the test also says that the newest
change kept the scripts' KEYS and ARGV as the older library reads them."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.versus import library_at
from scheduler import Policy, Request, Scheduler
from scheduler.domain.errors import NoNodesAvailable
from scheduler.domain.policy import Limits
from scheduler.domain.records import MIB
from scheduler.ops.simnode import SimNode
from scheduler.store.calls import Call
from scheduler.store.scripts import FUNCTION, Library, library
from scheduler.store.translate import translated
from scheduler.testing.redis_server import in_ci

ROOT = Path(__file__).resolve().parents[1]


def older_revision(introducing: str = "") -> str:
    """The revision before the newest commit that changed lua/; or, given
    ``introducing`` (a text of lua/), the revision before the commit that
    first wrote it there: the last version without it."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30
        )
        return out.stdout.strip() if out.returncode == 0 else ""

    newest = ""
    if shutil.which("git"):
        if introducing:
            found = git("log", "--format=%H", f"-S{introducing}", "--", "lua/").splitlines()
            newest = found[-1] if found else ""
        else:
            newest = git("log", "-n", "1", "--format=%H", "--", "lua/")
    older = git("rev-parse", "--verify", "--quiet", f"{newest}^") if newest else ""
    if not older:
        if in_ci():
            pytest.fail(
                "the test needs the repository's history (git, a clone that is not shallow)"
            )
        pytest.skip("no git history to take an older revision from")
    return older


def fcall(s: Scheduler, lib: Library, call: Call[Any]) -> Any:
    with translated(s.target):
        reply = s.client.execute_command(
            "FCALL", lib.functions[call.script], len(call.keys), *call.keys, *call.args
        )
        return call.parse(reply)


def loaded(client: Any) -> set[str]:
    return {
        dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode()
        for lib in client.function_list()
    }


@pytest.mark.real_only
def test_an_older_and_a_newer_library_share_one_cell(real_url: str) -> None:
    old, new = library_at(older_revision()), library()
    assert old.name != new.name  # the newest lua/ change changed the library
    s = Scheduler.connect(
        real_url,
        cell="upgrade",
        policy=Policy(limits=Limits(max_sandbox_count=3), report_ttl_ms=3_600_000),
    )
    client = redis.Redis.from_url(real_url)
    try:
        nodes = [SimNode(f"n{i}", 64, 256 * 1024 * MIB) for i in range(2)]
        for node in nodes:
            s.heartbeat(node.heartbeat())  # through this tree's library, which it loads
        if s.scripts.mode != FUNCTION:
            pytest.skip("this Redis has no functions (FUNCTION / FCALL)")
        client.execute_command("FUNCTION", "LOAD", old.text)
        assert {old.name, new.name} <= loaded(client)  # side by side, neither replaced

        placed: list[tuple[str, str]] = []
        libs = [old, new]
        for i in range(6):  # two nodes of three: the cell's whole capacity
            lib = libs[i % 2]
            call = s.ops.schedule(Request.cold(1, 1024), reservation_id=f"up{i}")
            placed.append((lib.name, fcall(s, lib, call).node_id))
        by_node = {n.node_id: sum(1 for _, nid in placed if nid == n.node_id) for n in nodes}
        assert by_node == {"n0": 3, "n1": 3}  # each version counted the other's placements
        for lib in libs:  # full, whichever version asks
            with pytest.raises(NoNodesAvailable):
                fcall(s, lib, s.ops.schedule(Request.cold(1, 1024), reservation_id="full"))
        # the older version cancels a placement the newer made; the newer places again
        assert fcall(s, old, s.ops.cancel("up1")) != ""
        again = fcall(s, new, s.ops.schedule(Request.cold(1, 1024), reservation_id="up6"))
        assert again.node_id == placed[1][1]
    finally:
        # (whatever happened: a library left loaded would refuse the next LOAD)
        with contextlib.suppress(redis.ResponseError):
            client.execute_command("FUNCTION", "DELETE", old.name)
        client.close()
        s.close()
