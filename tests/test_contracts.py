"""Every script's header (the comment at the top of lua/<name>-<n>.lua) names
the KEYS, ARGV and reply fields its Python declaration
(scheduler/store/contracts.py) has, in the same order: renaming or moving a
field on one side only fails here.  The header grammar is docs/contract.md's
"Script contracts"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from scheduler.domain.errors import CorruptState
from scheduler.domain.history import Placed
from scheduler.domain.policy import Policy
from scheduler.domain.records import Heartbeat, NodeSnapshot, Request
from scheduler.store import contracts as c
from scheduler.store.calls import Ops, ReplicaEntry, Resync
from scheduler.store.cpuconfig import CpuConfigOps
from scheduler.store.keys import CellKeys
from scheduler.store.p2p import PeerOps
from scheduler.store.replies import parsed

LUA = Path(__file__).resolve().parent.parent / "lua"
SCRIPTS = {p.stem.rsplit("-", 1)[0]: p for p in sorted(LUA.glob("*-*.lua"))}
NAME = re.compile(r"[A-Za-z_][\w-]*")


def header(path: Path) -> list[str]:
    text = path.read_text()
    assert text.startswith("--[["), f"{path.name} starts without its header"
    return text[4 : text.index("]]")].splitlines()


def groups(text: str) -> list[tuple[int, str]]:
    """The top-level {...} groups of ``text``: (where it starts, inside)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                out.append((start, text[start + 1 : i]))
    return out


def items(inside: str) -> list[str]:
    """``inside`` split at its top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in inside:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return [i for i in out if i]


def keys_of(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        m = re.match(r"\s{2}KEYS\[(\d+)(?:\.\.(\d+))?\]\s+(.*)$", line)
        if m:
            first, last = int(m[1]), int(m[2] or m[1])
            assert first == len(out) + 1, f"KEYS[{first}] after {len(out)} keys"
            names = [NAME.match(x.strip())[0] for x in m[3].split(",")[: last - first + 1]]  # type: ignore[index]
            out += names
    return out


def argv_of(lines: list[str]) -> list[tuple[str, bool, bool]]:
    """(names of the field in each form joined by |, many values?, may be absent?)"""
    out: list[tuple[str, bool, bool]] = []
    for line in lines:
        m = re.match(r"\s{2}ARGV(?:\[([^\]]+)\])?\s{2,}(.*)$", line)
        if not m:
            continue
        if m[1] is None:
            assert m[2].split()[0] == "none", line
            continue
        name = re.match(r"[A-Za-z_]\w*(?:\s*\|\s*[A-Za-z_]\w*)*", m[2])
        assert name, f"ARGV[{m[1]}] names no field: {line.strip()}"
        many = ".." in m[1]
        if not many and not any(prev_many for _, prev_many, _ in out):
            assert int(m[1]) == len(out) + 1, f"ARGV[{m[1]}] is field {len(out) + 1}"
        out.append((re.sub(r"\s+", "", name[0]), many, "or absent" in m[2]))
    return out


def returns_text(lines: list[str]) -> str:
    text, on = "", False
    for line in lines:
        if re.match(r"\s{2}Returns\b", line):
            on = True
        elif re.match(r"\s{2}\S", line) or not line.strip():
            on = False
        if on:
            text += " " + line.strip()
    assert text, "the header has no Returns"
    return text


def form_fields(inside: str, rows: dict[str, str]) -> tuple[list[tuple[str, bool]], Any, str]:
    """A reply form's (field, optional) list, its tail and its tag."""
    fields: list[tuple[str, bool]] = []
    tail: Any = ""
    tag = ""
    optional = False
    for item in items(inside.replace("[,", ",[")):
        if item.startswith("["):
            optional, item = True, item[1:]
        done = item.endswith("]")
        item = item.rstrip("]").strip()
        if item.endswith("..."):
            name = item[:-3].strip()
            tail = rows.get(name, name)
        else:
            name = NAME.match(item)[0]  # type: ignore[index]
            quoted = re.fullmatch(r'\w+\s+"([^"]*)"', item)
            if not fields and quoted:  # (`kind "RESYNC"`: the form's tag)
                tag = quoted[1]
            fields.append((name, optional))
        if done:
            optional = False
    return fields, tail, tag


def replies_of(lines: list[str]) -> list[Any]:
    text = returns_text(lines)
    found = groups(text)
    rows: dict[str, str] = {}
    forms: list[str] = []
    for start, inside in found:
        row = re.search(r"(\w+)\s*=\s*$", text[:start])
        if row:
            rows[row[1]] = inside
        else:
            forms.append(inside)
    if not forms:
        m = re.match(r"\s*Returns\s+(\w+)", text)
        assert m, f"a reply that is no list names its value: {text}"
        return [c.Scalar(m[1])]
    return [(form_fields(f, rows), rows) for f in forms]


def check_form(cls: type[c.Reply], got: Any, where: str) -> None:
    (fields, tail, tag), rows = got
    want = [(f.name, not f.required) for f in msgspec.structs.fields(cls)]
    assert fields == want, f"{where}: the header's fields {fields}, {cls.__name__}'s {want}"
    assert tag == cls.TAG, f"{where}: tag {tag!r}, {cls.__name__}.TAG {cls.TAG!r}"
    if isinstance(cls.TAIL, type):
        assert isinstance(tail, str) and tail in rows.values(), f"{where}: rows {cls.TAIL}"
        check_form(cls.TAIL, (form_fields(tail, rows), rows), f"{where} row")
    elif cls.TAIL == "pairs":
        assert tail is not None and items(tail) == ["field", "value", "..."], (
            f"{where}: rows of field, value, ... (TAIL pairs), the header's {tail!r}"
        )
    else:
        assert tail == cls.TAIL, f"{where}: tail {tail!r}, {cls.__name__}.TAIL {cls.TAIL!r}"


def test_every_script_has_a_contract() -> None:
    assert set(SCRIPTS) == set(c.CONTRACTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_header_matches_the_declaration(script: str) -> None:
    check_header(script, header(SCRIPTS[script]))


def check_header(script: str, lines: list[str]) -> None:
    contract = c.CONTRACTS[script]
    where = SCRIPTS[script].name
    assert keys_of(lines) == list(contract.keys), f"{where}: KEYS"
    argv = argv_of(lines)
    for i, cls in enumerate(contract.argv):
        got = [
            (names.split("|")[i] if "|" in names else names, many, absent)
            for names, many, absent in argv
        ]
        want = [
            (f.name, "list" in str(f.type), not f.required) for f in msgspec.structs.fields(cls)
        ]
        assert got == want, f"{where}: ARGV {got}, {cls.__name__}'s {want}"
    replies = replies_of(lines)
    assert len(replies) == len(contract.replies), f"{where}: {len(replies)} reply forms"
    for got, declared in zip(replies, contract.replies, strict=True):
        if isinstance(declared, c.Scalar):
            assert got == declared, f"{where}: reply {got}, declared {declared}"
        else:
            check_form(declared, got, f"{where} {declared.__name__}")


def test_a_changed_header_fails() -> None:
    """The check is not vacuous: two ARGV lines swapped, a reply field
    renamed or a KEYS name changed no longer match."""
    lines = header(SCRIPTS["cancel"])
    first = next(i for i, line in enumerate(lines) if "ARGV[1]" in line)
    second = next(i for i, line in enumerate(lines) if "ARGV[2]" in line)
    swapped = list(lines)
    swapped[first] = lines[second].replace("ARGV[2]", "ARGV[1]")
    swapped[second] = lines[first].replace("ARGV[1]", "ARGV[2]")
    for changed in (
        swapped,
        [line.replace("{node_id", "{node") for line in lines],
        [line.replace("nodes, stats", "nodes, counters") for line in lines],
    ):
        assert changed != lines
        with pytest.raises(AssertionError):
            check_header("cancel", changed)


def _calls() -> dict[str, list[Any]]:
    """A call of every kind each Ops builds, by script."""
    k = CellKeys("t")
    ops = Ops(k)
    peers = PeerOps(k, Policy)
    cpu = CpuConfigOps(k)
    hb = Heartbeat(node_id="n1", service_instance_id="s1", snapshot=NodeSnapshot(status="READY"))
    made = [
        ops.schedule(Request()),
        ops.explain(Request()),
        ops.schedule_batch([ops.schedule(Request())]),
        ops.heartbeat(hb),
        ops.assign("sb1", "n1", "e:1"),
        ops.cancel("r1"),
        ops.abandon("r1"),
        ops.probe(),
        ops.rewound(1, None, 1000),
        ops.reconcile_rewound(5, 10),
        ops.replay([(Placed(0.0, "r1", "n1", 1, 2, 3, 0.5), "sb1")], 10_000),
        ops.index_rebuild(),
        ops.events("n1", []),
        ops.lookup("sb1"),
        ops.unregister("n1", "s1"),
        ops.sync_begin("12", ops.static_list([("n1", "e:1")])),
        ops.sync_begin("12", ops.discovered_list([1, 2, 3], [("n1", "e:1", False)])),
        ops.sync_stage("12", ops.static_list([("n1", "e:1")]).nodes),
        ops.sync_walk("12"),
        ops.set_lingering("n1", True),
        ops.sync_policy(Policy()),
        ops.settle(),
        ops.nodes(),
        ops.reservations(),
        ops.stats(),
        ops.census(),
        ops.policy(),
        ops.listed(),
        ops.observed(),
        ops.sweep(),
        ops.replica_seen(
            ReplicaEntry(
                replica_id="h/1", version="v", commit="c", host="h", pid=1, grpc=":1", started_ms=1
            )
        ),
        ops.advance_clock(1),
        peers.peers("", "", ""),
        peers.peers("c1", "b", "", ids=["n1", "n2"]),
        peers.members("c1"),
        peers.record("c1", "b", "k", "n1"),
        peers.forget("c1", "b", "k", "n1"),
        peers.lookup("c1", "b", "k"),
        cpu.ingest("n1", "c1", "", False),
        cpu.store("n1", "c1", "1", None),
    ]
    memo: dict[str, Any] = {}
    first = ops.heartbeat(hb, memo)
    first.parse([1, 0, 0, 0, 5, "i"])
    made += [ops.heartbeat(hb, memo), ops.heartbeat_batch([ops.heartbeat(hb)])]
    out: dict[str, list[Any]] = {}
    for call in made:
        out.setdefault(call.script, []).append(call)
    return out


def test_every_call_is_built_from_its_declaration() -> None:
    """Each call carries its named ARGV, of a form its script's contract
    declares, whose wire is the ARGV sent; its KEYS are as many as declared."""
    calls = _calls()
    assert set(calls) == set(c.CONTRACTS)
    for script, made in calls.items():
        contract = c.CONTRACTS[script]
        for call in made:
            assert type(call.argv) in contract.argv, (script, type(call.argv))
            assert call.args == call.argv.wire(), script
            assert len(call.keys) == len(contract.keys), script


def test_a_reply_of_the_wrong_shape_is_unreadable() -> None:
    """A reply read through its struct: one value short or one too many is
    CorruptState naming the script, never a traceback or a silent misread."""
    ops = Ops(CellKeys("t"))
    call = ops.schedule(Request(), reservation_id="r1")
    decision = [b"n1", b"n1:1", b"r1", b"0.5", 1, 2, b"READY", 7]
    placed = parsed(call.script, call.parse, decision)
    assert (placed.node_id, placed.reservation_id, placed.pressure, placed.now_ms) == (
        "n1",
        "r1",
        0.5,
        7,
    )
    assert (placed.warmth, placed.pull_bytes) == ("", 0)  # (the optional tail absent)
    warm = parsed(call.script, call.parse, [*decision, b"warm", 9])
    assert (warm.warmth, warm.pull_bytes) == ("warm", 9)
    for bad in (decision[:-1], [*decision, b"warm", 9, b"extra"]):
        with pytest.raises(CorruptState, match="the reply of schedule cannot be read"):
            parsed(call.script, call.parse, bad)
    lookup = ops.lookup("sb1")
    with pytest.raises(CorruptState, match="the reply of lookup"):
        parsed(lookup.script, lookup.parse, [b"n1", b"e", 5, b"", b"1"])  # no now_ms


def test_tagged_forms_are_told_apart_by_their_tag() -> None:
    cpu = CpuConfigOps(CellKeys("t"))
    ingest = cpu.ingest("n1", "c1", "", False)
    assert ingest.parse([b"deliver", b"{}"]).config == "{}"
    assert not ingest.parse([b"none"]).needs_compute
    out = ingest.parse([b"compute", b"4", b"n1", b"cfg1", b"n2", b"cfg2"])
    assert out.epoch == "4" and out.configs == (("n1", "cfg1"), ("n2", "cfg2"))
    with pytest.raises(TypeError):
        ingest.parse([b"deliver"])  # (its config missing: unreadable)
    ops = Ops(CellKeys("t"))
    hb = Heartbeat(node_id="n1", service_instance_id="s1", snapshot=NodeSnapshot(status="READY"))
    with pytest.raises(Resync):
        ops.heartbeat(hb).parse([b"RESYNC"])
    assert ops.heartbeat(hb).parse([4, 1, 0, 0, 9, b"i"]).generation == 4


def test_the_explain_rows_layout_is_the_verdicts_fields() -> None:
    """schedule.lua writes an explain row's locality fields by the names of
    its VERDICT layout; the reply is read as contracts.Verdict."""
    from scheduler.store.lua_modules import layouts
    from scheduler.store.scripts import _files

    includes, _ = _files()
    got = layouts(includes["schedule"], "lua/includes/schedule.lua")["VERDICT"]
    assert got == list(c.Verdict.__struct_fields__)
