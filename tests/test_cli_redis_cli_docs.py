"""docs/operations.md, "Debugging with redis-cli", says what the code really stores.

Every command of its table is run with the real ``redis-cli`` against a real
Redis holding a node, an assigned reservation and a binding; every field the
table names must come back.  The key layout table must match scheduler/store/keys.py.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import scheduler.store.keys
from scheduler import Limits, Policy, Request, Scheduler
from scheduler.testing.redis_server import in_ci
from tests.helpers import hb

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
IDS = {"<node>": "n1", "<reservation>": "r1", "<sandbox>": "s1"}


def section() -> str:
    text = OPERATIONS.read_text()
    start = text.index("## Debugging with redis-cli")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def table_rows(after: str) -> list[list[str]]:
    """Rows of the first markdown table after the line containing ``after``."""
    lines = section().split("\n")
    i = next(n for n, line in enumerate(lines) if after in line)
    rows = []
    for line in lines[i + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return [r for r in rows[2:]]  # header and rule


def fill(text: str) -> str:
    for placeholder, value in IDS.items():
        text = text.replace(placeholder, value)
    return text


@pytest.fixture
def redis_cli() -> str:
    exe = shutil.which("redis-cli")
    if exe is None:
        if in_ci():
            raise RuntimeError("redis-cli is not installed")
        pytest.skip("redis-cli is not installed")
    return exe


@pytest.fixture
def populated(real_url: str) -> str:
    s = Scheduler.connect(real_url, cell="default")
    s.sync_policy(Policy(limits=Limits(max_sandbox_count=10)))
    s.heartbeat(hb("n1"))
    placed = s.schedule(Request.cold(1, 512), reservation_id="r1")
    s.assign("s1", placed.node_id, placed.endpoint, "r1")
    s.close()
    return real_url


def test_every_documented_command_returns_the_documented_fields(
    populated: str, redis_cli: str
) -> None:
    rows = table_rows("What to type")
    commands = " ".join(row[1] for row in rows)
    # The issue asks for these five at least: a node, a reservation, a node's
    # pending reservations, a binding, the policy.
    for key in (
        "node:<node>'",
        "res:<reservation>'",
        "node-res:<node>'",
        "bind:<sandbox>'",
        "policy'",
    ):
        assert f"'sched:{{default}}:{key}" in commands, key
    for what, command, expected in rows:
        argv = shlex.split(fill(command.strip("`")))
        assert argv[0] == "redis-cli", command
        out = subprocess.run(
            [redis_cli, "-u", populated, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        lines = set(out.splitlines())
        wanted = [fill(x) for x in re.findall(r"`([^`]+)`", expected)]
        assert wanted, what
        missing = [w for w in wanted if w not in lines]
        assert not missing, f"{what}: {command} did not return {missing}; got {sorted(lines)}"


def test_key_layout_table_matches_keys_module() -> None:
    documented = {row[0].strip("`") for row in table_rows("The layout")}
    doc = scheduler.store.keys.__doc__ or ""
    names = re.findall(r"^\s+<base>(\S+)\s+(\w+)", doc, re.M)
    assert len(names) >= 10
    for name, kind in names:
        key = "sched:{default}:" + name
        assert key in documented, f"{key} ({kind}) is in scheduler/store/keys.py, not in the docs"
        row = next(r for r in table_rows("The layout") if r[0].strip("`") == key)
        assert row[1] == kind
    assert len(documented) == len(names)


def test_documented_keys_are_the_ones_the_client_builds() -> None:
    k = scheduler.store.keys.CellKeys("default")
    built = {
        k.policy,
        k.nodes,
        k.stats,
        k.rr,
        k.expiry,
        k.node("<node>"),
        k.node_res("<node>"),
        k.node_sbx("<node>"),
        k.res("<reservation>"),
        k.bind("<sandbox>"),
        k.art_lru,
        k.art_names,
    }
    documented = {row[0].strip("`") for row in table_rows("The layout")}
    assert built <= documented
