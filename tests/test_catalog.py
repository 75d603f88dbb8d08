"""One table per concept: the Lua, the Python and the CLI read the same lists.

scheduler/domain/catalog.py (ceilings, strategies, statuses, event types, policy
fields) and scheduler/domain/records.py NodeSnapshot (snapshot fields) are the only
places they are spelled; the scripts get them from the generated include
``constants``.  Here the generated Lua is evaluated by Redis (real and fake)
and compared with the Python tables, the wire enums and the CLI's choices,
and no Lua file may spell one of the lists itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from scheduler.cli import explain as explain_cli
from scheduler.cli import policy as policy_cli
from scheduler.cli import simulate as simulate_cli
from scheduler.cli.nodes import nodes_table

from scheduler.domain import catalog
from scheduler.domain.errors import NO_POLICY, SCRIPT_CODES
from scheduler.domain.policy import Limits, Policy
from scheduler.domain.records import Heartbeat, NodeSnapshot, NodeView, snapshot_fields
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.server.config import ConfigError, load
from scheduler.server.metrics import DERIVED_STATUSES
from scheduler.server.service import EVENT_NAMES, NODE_STATUS_NAMES
from scheduler.store import contracts
from scheduler.store.calls import HEARTBEAT_FIELDS, Ops, heartbeat_fields
from scheduler.store.keys import CellKeys
from scheduler.store.lua_constants import packed_patterns, render
from scheduler.store.replies import CAPACITY_FIELDS
from scheduler.testing import model

ROOT = Path(__file__).resolve().parents[1]
LUA_FILES = sorted((ROOT / "lua").rglob("*.lua"))

#: what the test script returns: every constant of the include, JSON-encoded
_DUMP = """
return cjson.encode({
  LIMIT_NAMES = LIMIT_NAMES, CEILING_CAPACITY = CEILING_CAPACITY,
  OBSERVED_CEILINGS = OBSERVED_CEILINGS, PACKED = PACKED, NOT_POLICY = NOT_POLICY,
  BOUNDS_DEFAULTS = BOUNDS_DEFAULTS, STRATEGIES = STRATEGIES,
  LOCALITY_DEFAULTS = LOCALITY_DEFAULTS, ADMISSION_TEXT = ADMISSION_TEXT,
  DEFAULT_STRATEGY = DEFAULT_STRATEGY, STRATEGY_CHOICES = STRATEGY_CHOICES,
  EVENT_TYPES = EVENT_TYPES, LIVE = LIVE, SWEEP_BATCH = SWEEP_BATCH, NO_POLICY = NO_POLICY,
  SNAPSHOT_FIELDS = SNAPSHOT_FIELDS, INDEX_MOVERS = INDEX_MOVERS, WHOLE_FIELDS = WHOLE_FIELDS,
  PACKED_MATCH = split_packed(table.concat(PACKED, '\\t'), PACKED_RES), ERR = ERR,
  ROSTER_FORM = ROSTER_FORM, CANCEL_MODE = CANCEL_MODE, POLICY_MODE = POLICY_MODE,
})
"""

#: base.lua's raw_policy split of a packed policy, alone: each pattern's
#: captures, the rest (all but the last pattern) going to the next
_SPLIT = """
local function split_packed(packed, patterns)
  local v, rest = {}, packed
  for j = 1, #patterns do
    local got = { string.match(rest, patterns[j]) }
    if not got[1] then return false end
    if j < #patterns then rest = table.remove(got) end
    for k = 1, #got do v[#v + 1] = got[k] end
  end
  return v
end
"""


@pytest.mark.parametrize("n", [1, 29, 30, 31, 32, 33, 60, 61, 95])
def test_a_packed_policy_of_any_size_splits_below_luas_capture_limit(
    redis_client: Any, n: int
) -> None:
    """Lua allows 32 captures a pattern: a policy of more packed fields (a
    new ceiling adds one) splits over several patterns, every field once."""
    fields = [f"f{i}" if i % 3 else "" for i in range(n)]
    patterns = packed_patterns(n)
    assert all(p.count("(") <= 32 for p in patterns)
    script = _SPLIT + "return cjson.encode(split_packed(ARGV[1], cjson.decode(ARGV[2])))"
    got = json.loads(redis_client.eval(script, 0, "\t".join(fields), json.dumps(patterns)))
    assert got == fields
    # (a packed copy of another layout matches none: the named fields are read)
    other = json.loads(
        redis_client.eval(script, 0, "\t".join(fields + ["x"]), json.dumps(patterns))
    )
    assert other is False


def truth(names: Any) -> dict[str, bool]:
    return {n: True for n in names}


def test_the_generated_include_is_the_python_tables(redis_client: Any) -> None:
    got = json.loads(redis_client.eval(render() + _SPLIT + _DUMP, 0))
    assert got["LIMIT_NAMES"] == list(catalog.CEILING_NAMES)
    assert got["CEILING_CAPACITY"] == {c.name: c.capacity for c in catalog.CEILINGS if c.capacity}
    assert got["OBSERVED_CEILINGS"] == {c.name: c.observed for c in catalog.CEILINGS if c.observed}
    assert got["PACKED"] == list(catalog.PACKED)
    assert got["PACKED_MATCH"] == list(catalog.PACKED)  # one capture per packed field
    assert got["NOT_POLICY"] == truth(catalog.BESIDE_POLICY)
    assert got["BOUNDS_DEFAULTS"] == catalog.BOUNDS_DEFAULTS
    assert got["LOCALITY_DEFAULTS"] == catalog.LOCALITY_DEFAULTS
    assert got["ADMISSION_TEXT"] == catalog.ADMISSION_TEXT
    assert got["STRATEGIES"] == truth(catalog.STRATEGIES)
    assert got["DEFAULT_STRATEGY"] == catalog.DEFAULT_STRATEGY == Policy().strategy
    assert got["STRATEGY_CHOICES"] == "least_loaded, round_robin or random"
    assert got["EVENT_TYPES"] == truth(catalog.EVENT_TYPES)
    assert got["LIVE"] == truth(catalog.LIVE_STATES)
    assert got["SWEEP_BATCH"] == catalog.SWEEP_BATCH == model.SWEEP_BATCH
    assert got["NO_POLICY"] == NO_POLICY
    # the ARGV modes and forms the clients send, by the names the scripts compare
    assert got["ROSTER_FORM"] == {
        "same": contracts.ROSTER_SAME,
        "full": contracts.ROSTER_FULL,
        "delta": contracts.ROSTER_DELTA,
    }
    assert got["CANCEL_MODE"] == {"cancel": contracts.CANCEL, "abandon": contracts.ABANDON}
    assert got["POLICY_MODE"] == {
        "check": contracts.POLICY_CHECK,
        "overwrite": contracts.POLICY_OVERWRITE,
        "restore": contracts.POLICY_RESTORE,
    }
    assert got["ERR"] == {c: c for c in SCRIPT_CODES}
    assert got["SNAPSHOT_FIELDS"] == truth(HEARTBEAT_FIELDS)
    fields = snapshot_fields()
    assert got["INDEX_MOVERS"] == {
        **{c.observed: c.name for c in catalog.CEILINGS if c.observed},
        **{n: True for n, f in fields.items() if f.index},
        "admission": True,  # the heartbeat's word on admission (calls.heartbeat_fields)
    }
    assert got["WHOLE_FIELDS"] == truth(n for n, f in fields.items() if f.decides)


def test_python_tables_agree_with_each_other_and_the_wire() -> None:
    # ceilings: the config struct, the stored policy, the oracle and the views
    assert Limits.__struct_fields__ == catalog.CEILING_NAMES
    every = Policy(limits=Limits(**{n: 1 for n in catalog.CEILING_NAMES}))
    assert [k for k in every.to_fields() if k in catalog.CEILING_NAMES] == list(
        catalog.CEILING_NAMES
    )
    assert set(catalog.PACKED) == set(every.to_fields()) | {
        *catalog.BESIDE_POLICY,
        *catalog.BOUNDS_DEFAULTS,
        *catalog.LOCALITY_DEFAULTS,
    } - {"packed"}
    for c in catalog.CEILINGS:
        assert (
            model.ceiling_use(
                model.NodeState(node_id="n", cpu_count=1, memory_total_bytes=1),
                c.name,
                model.Demand(True, 1, 1, 1),
            )
            is not None
        ), c.name
        assert catalog.ceiling_in(catalog.ceiling_reason(c.name, 7)) == c
        assert c.capacity is None or c.capacity in CAPACITY_FIELDS
        assert c.observed is None or c.observed in snapshot_fields()
    with pytest.raises(ValueError):
        model.ceiling_use(model.NodeState(node_id="n"), "max_unknown", model.Demand(True, 1, 1, 1))
    # snapshot fields: the record is the wire message
    wire = pb.NodeSnapshot.DESCRIPTOR.fields_by_name
    assert list(NodeSnapshot.__struct_fields__) == list(wire)
    assert set(snapshot_fields()) == set(wire) - {"disks"}
    assert heartbeat_fields(Heartbeat(node_id="n", service_instance_id="s"))[::2] == list(
        HEARTBEAT_FIELDS
    )
    # statuses, admission reasons and event types: the wire enums without their prefixes
    assert [
        v.name.removeprefix("ADMISSION_REASON_") for v in pb.AdmissionReason.DESCRIPTOR.values
    ] == list(catalog.ADMISSION_REASONS)
    assert [v.name.removeprefix("NODE_STATUS_") for v in pb.NodeStatus.DESCRIPTOR.values] == list(
        catalog.NODE_STATUSES
    )
    assert sorted(NODE_STATUS_NAMES.values()) == sorted(catalog.NODE_STATUSES)
    assert [
        v.name.removeprefix("SANDBOX_EVENT_TYPE_") for v in pb.SandboxEventType.DESCRIPTOR.values
    ][1:] == list(catalog.EVENT_TYPES)
    assert sorted(EVENT_NAMES.values()) == sorted(catalog.EVENT_TYPES)
    assert DERIVED_STATUSES == ("READY", "CONNECTING", "UNHEALTHY", "LINGERING")


def _choices(command: click.Command, option: str) -> tuple[str, ...]:
    param = next(p for p in command.params if p.name == option)
    assert isinstance(param.type, click.Choice)
    return tuple(param.type.choices)


def test_the_config_file_takes_every_ceiling(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.json"
    limits = {n: i + 1 for i, n in enumerate(catalog.CEILING_NAMES)}
    path.write_text(json.dumps({"scheduler": {"node_resource_limit": limits}}))
    assert load(path, env={}).policy.limits.active() == limits
    path.write_text(json.dumps({"scheduler": {"node_resource_limit": {"max_unknown": 1}}}))
    with pytest.raises(ConfigError, match="max_unknown"):
        load(path, env={})


def test_the_cli_offers_what_the_catalog_says() -> None:
    assert _choices(explain_cli.explain, "strategy") == catalog.STRATEGIES
    assert _choices(simulate_cli.simulate, "strategy") == catalog.STRATEGIES
    set_cmd = policy_cli.policy.commands["set"]
    assert _choices(set_cmd, "strategy") == catalog.STRATEGIES
    for name in catalog.CEILING_NAMES:
        assert policy_cli._limit(f"{name}=3") == (name, 3)
    with pytest.raises(click.BadParameter):
        policy_cli._limit("max_unknown=3")
    # every ceiling has its column, in the order the stage checks them
    limits = Limits(**{n: 1 for n in catalog.CEILING_NAMES})
    table = nodes_table([], Policy(limits=limits), "cell test")
    rooms = [str(c.header).split("\n")[0] for c in table.columns if "room" in str(c.header)]
    assert rooms == [f"room {c.alias}" for c in catalog.CEILINGS]


def test_nodes_view_headroom_is_in_each_ceilings_unit() -> None:
    ops = Ops(CellKeys("t"))
    row = [
        "node_id",
        "n1",
        "derived_status",
        "READY",
        "pressure",
        "0",
        "known",
        "1",
        "cpu_count",
        "8",
        "memory_total_bytes",
        "1000",
    ]
    for c in catalog.CEILINGS:
        row += [f"use:{c.name}", "4", f"limit:{c.name}", "50"]
    _, views = ops.nodes().parse(["0", "", row])
    view: NodeView = views[0]
    assert [u.name for u in view.ceilings] == list(catalog.CEILING_NAMES)
    for u in view.ceilings:
        c = catalog.ceiling(u.name)
        capacity = {"cpu": 8, "memory": 1000, None: None}[c.capacity]
        assert u.headroom == (50 - 4 * 100 / capacity if capacity else 46), u.name


#: lists a Lua file must not spell
_LISTS = {
    "ceilings": catalog.CEILING_NAMES,
    "strategies": catalog.STRATEGIES,
    "event types": catalog.EVENT_TYPES,
    "statuses": catalog.NODE_STATUSES,
    "reservation states": (*catalog.LIVE_STATES, *catalog.OUTCOMES),
    "snapshot fields": tuple(snapshot_fields()),
    "policy fields": catalog.PACKED,
}


def _names(text: str) -> set[str]:
    return set(re.findall(r"'([A-Za-z_]+)'", text)) | set(re.findall(r"\b([a-z_]+) = true\b", text))


@pytest.mark.parametrize("path", LUA_FILES, ids=lambda p: p.name)
def test_no_lua_file_spells_a_list(path: Path) -> None:
    """No table literal holds two names of one list, and no line all of them
    (a chain of comparisons is a list too)."""
    code = "\n".join(line.split("--")[0] for line in path.read_text().splitlines())
    # (stages.lua NODE_FIELDS and snapshot.lua PREV are not copies: the record
    # fields a decision, or a heartbeat, reads, in the positions it takes them
    # from)
    code = re.sub(r"local (NODE_FIELDS|PREV) = \{[^{}]*\}", "", code)
    tables = re.findall(r"\{[^{}]*\}", code, re.S)
    for what, names in _LISTS.items():
        for table in tables:
            spelled = _names(table) & set(names)
            assert len(spelled) < 2, f"{path.name}: a table spells {what} {sorted(spelled)}"
        for number, line in enumerate(code.splitlines(), 1):
            assert not set(names) <= _names(line), f"{path.name}:{number} spells every {what}"


@pytest.mark.parametrize("path", LUA_FILES, ids=lambda p: p.name)
def test_no_lua_file_spells_an_error_code(path: Path) -> None:
    """Error codes come from scheduler/domain/errors.py through the include
    ``constants`` (``ERR``): no Lua file writes one as a string, every failure
    names its code from ERR, and every ERR name a file reads exists."""
    text = path.read_text()
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("--")[0]
        for literal in re.findall(r"'([^']*)'|\"([^\"]*)\"", code):
            word = (literal[0] or literal[1]).split(" ")[0]
            assert word not in SCRIPT_CODES, f"{path.name}:{number} spells the code {word}"
        for call in re.findall(r"\bfail\(([^,)]*)", code):
            if "local function fail" not in code:
                assert call.startswith("ERR."), f"{path.name}:{number}: fail({call}, ...)"
        for name in re.findall(r"\bERR\.(\w+)", code):
            assert name in SCRIPT_CODES, f"{path.name}:{number}: ERR.{name} is no code"


def test_the_design_lists_every_ceiling_in_the_stages_order() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("| ceiling | compared with the limit |") :]
    rows = re.findall(r"^\| `(\w+)` \|", section.split("\n\n")[0], re.M)
    assert rows == list(catalog.CEILING_NAMES)


def test_each_ceiling_has_one_formula_in_the_lua_stage() -> None:
    stages = (ROOT / "lua" / "includes" / "stages.lua").read_text()
    body = stages[
        stages.index("local CEILING_USE = {") : stages.index("local function ceiling_use")
    ]
    formulas = re.findall(r"^  (\w+) = function", body, re.M)
    assert sorted(formulas) == sorted(catalog.CEILING_NAMES)  # each once
    for path in LUA_FILES:
        if path.name != "stages.lua":
            for name in catalog.CEILING_NAMES:
                assert name not in path.read_text(), f"{path.name} names {name}"


def test_each_strategy_has_one_pick_in_the_lua_schedule() -> None:
    schedule = (ROOT / "lua" / "includes" / "schedule.lua").read_text()
    body = schedule[
        schedule.index("SPREAD.PICK = {") : schedule.index("local function schedule_one")
    ]
    picks = re.findall(r"^  (\w+) = function", body, re.M)
    assert sorted(picks) == sorted(catalog.STRATEGIES)  # each once
