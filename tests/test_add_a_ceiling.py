"""Adding a ceiling is one table row, its formula in the Lua stage and its
formula in the oracle.

A copy of the package gets exactly those three edits (a new allocation
ceiling, ``max_allocated_cpu``: active CPUs + pending + this request), and a
fresh interpreter that imports the copy shows that everything else picks it
up: the config, the stored policy, the generated Lua include, the scripts'
decisions (which agree with the oracle's), ``schedctl policy`` and
``schedctl nodes``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ROW = '    Ceiling("max_allocated_cpu", "cpu", "cpus", "cpu now"),\n'
LUA_FORMULA = (
    "  max_allocated_cpu = function(n, req)\n"
    "    return n.alloc_cpu + n.pend_cpu + req.cpu\n"
    "  end,\n"
)
ORACLE_FORMULA = (
    '    if name == "max_allocated_cpu":\n        return n.allocated_cpu + n.pending_cpu + d.cpu\n'
)

CHECK = r"""
import json, sys
from click.testing import CliRunner
import scheduler
from scheduler import Heartbeat, Limits, NodeSnapshot, NoNodesAvailable, Policy, Request, Scheduler
from scheduler.cli.main import main
from scheduler.store.scripts import _files
from scheduler.testing import model

assert scheduler.__file__.startswith(sys.argv[1]), scheduler.__file__
out = {}
out["constants"] = _files()[0]["constants"]
policy = Policy(limits=Limits(max_allocated_cpu=4, max_sandbox_count=10))
out["stored"] = policy.to_fields()
s = Scheduler.connect(None, cell="t", policy=policy)
s.heartbeat(Heartbeat(node_id="n1", service_instance_id="b", endpoint="n1:1",
                      snapshot=NodeSnapshot(cpu_count=16, memory_total_bytes=1 << 36,
                                            allocated_cpu=2, sandbox_count=1)))
out["first"] = s.schedule(Request(cpu=2, memory_bytes=1 << 20)).node_id
states = [model.NodeState.from_record({k.decode(): v.decode() for k, v in
          s.client.hgetall(s.keys.node("n1")).items()})]
try:
    s.schedule(Request(cpu=1, memory_bytes=1 << 20))
except NoNodesAvailable as e:
    out["refusal"] = e.message
out["oracle"] = model.decide(states, policy, Request(cpu=1, memory_bytes=1 << 20),
                             now_ms=states[0].last_seen_ms, rr_next=1).refusal
runner = CliRunner()
on = ["--redis", "embedded", "--cell", "t"]  # (this process's store, by name)
out["policy_show"] = runner.invoke(main, [*on, "policy", "show"]).output
out["nodes"] = runner.invoke(main, [*on, "nodes", "--json"]).stdout
out["nodes_table"] = runner.invoke(main, [*on, "nodes", "-o", "wide"],
                                   env={"COLUMNS": "250"}).output
print(json.dumps(out))
"""


def _insert_before(path: Path, anchor: str, text: str) -> None:
    source = path.read_text()
    assert source.count(anchor) == 1, (path, anchor)
    path.write_text(source.replace(anchor, text + anchor))


def test_a_new_ceiling_is_a_row_and_two_formulas(tmp_path: Path) -> None:
    package = tmp_path / "scheduler"
    shutil.copytree(ROOT / "scheduler", package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "lua", package / "lua", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "cli", package / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    # the three edits
    _insert_before(package / "domain" / "catalog.py", '    Ceiling("max_cpu_used_percent"', ROW)
    _insert_before(
        package / "lua" / "includes" / "stages.lua",
        "  max_cpu_used_percent = function(n)",
        LUA_FORMULA,
    )
    _insert_before(
        package / "testing" / "model.py", '    if name == "max_cpu_used_percent":', ORACLE_FORMULA
    )

    run = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    # the Lua include lists it, in the stage's order, and packs it
    assert (
        "'max_allocated_memory_bytes_including_paused', 'max_allocated_cpu', 'max_cpu_used_percent'"
    ) in out["constants"]
    assert "-- 27 tab-separated captures" in out["constants"]
    assert out["stored"]["max_allocated_cpu"] == "4"
    # the scripts decide by it, as the oracle does
    assert out["first"] == "n1"  # 2 + 0 + 2 = 4 <= 4
    assert out["refusal"] == ("no nodes available: 0/1 nodes available: 1 at max_allocated_cpu (4)")
    assert out["oracle"] == out["refusal"]
    # and the CLI shows it
    assert "max_allocated_cpu" in out["policy_show"]
    (view,) = json.loads(out["nodes"])
    assert {c["name"]: c["headroom"] for c in view["ceilings"]}["max_allocated_cpu"] == 0.0
    assert "room cpu now" in out["nodes_table"]
