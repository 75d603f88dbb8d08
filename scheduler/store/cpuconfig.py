"""CPU config intersection (docs/contract.md, "CPU configs").

Runtimes report their Firecracker CPU template once; per cluster, once every
node has one, each node gets the intersection of all of them exactly once.
:func:`intersect` is the pure rule; the bookkeeping (configs per node, the
computed intersection, delivery marks) lives in Redis (``lua/cpu_config-6.lua``)
so every replica agrees; :func:`exchange` is one heartbeat's part of it (the
clients run it: ``heartbeat(..., cpu_config=True)``).

Intersection rules: CPUID entries are keyed by (leaf, subleaf, flags) with
hex compared numerically and kept only if present in every config; leaves
0xb and 0x1f are always dropped (topology differs per machine).  Register
bitmaps (binary, optional "0b") present in every config are ANDed and written
as "0b" + 32 digits; MSRs are keyed by address, ANDed, "0b" + 64 digits;
``kvm_capabilities`` is a set intersection, sorted.  Field order:
kvm_capabilities, cpuid_modifiers, msr_modifiers; empty arrays stay ``[]``.
Invalid input (any config) gives no result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from scheduler.store import contracts as c
from scheduler.store.calls import Call, Plan
from scheduler.store.contracts import head, tagged, whole_reply
from scheduler.store.keys import CellKeys
from scheduler.store.replies import s

DROPPED_LEAVES = frozenset({0xB, 0x1F})
CpuidKey = tuple[int, int, int]


class InvalidConfig(ValueError):
    pass


def _hex(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise InvalidConfig(f"{what} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 16)
        except ValueError:
            raise InvalidConfig(f"{what} {value!r} is not hex") from None
    raise InvalidConfig(f"{what} is not a number")


def _flags(value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidConfig("flags is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            raise InvalidConfig(f"flags {value!r} is not a number") from None
    raise InvalidConfig("flags is not a number")


def _bitmap(value: Any, width: int) -> int:
    if not isinstance(value, str):
        raise InvalidConfig("bitmap is not a string")
    digits = value[2:] if value.startswith("0b") else value
    if not digits or len(digits) > width or set(digits) - {"0", "1"}:
        raise InvalidConfig(f"bitmap {value!r} is not {width} binary digits")
    return int(digits, 2)


def _list(doc: dict[str, Any], name: str) -> list[Any]:
    value = doc.get(name, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidConfig(f"{name} is not an array")
    return value


@dataclass
class _Parsed:
    kvm: set[str]
    cpuid: dict[CpuidKey, dict[str, int]]
    msr: dict[int, int]


def _parse(text: str) -> _Parsed:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidConfig("not JSON") from None
    if not isinstance(doc, dict):
        raise InvalidConfig("not a JSON object")
    kvm = set()
    for cap in _list(doc, "kvm_capabilities"):
        if not isinstance(cap, str):
            raise InvalidConfig("kvm_capabilities holds a non-string")
        kvm.add(cap)
    cpuid: dict[CpuidKey, dict[str, int]] = {}
    for entry in _list(doc, "cpuid_modifiers"):
        if not isinstance(entry, dict):
            raise InvalidConfig("cpuid_modifiers holds a non-object")
        key = (
            _hex(entry.get("leaf"), "leaf"),
            _hex(entry.get("subleaf", 0), "subleaf"),
            _flags(entry.get("flags", 0)),
        )
        regs = cpuid.setdefault(key, {})
        for mod in _list(entry, "modifiers"):
            if not isinstance(mod, dict) or not isinstance(mod.get("register"), str):
                raise InvalidConfig("a cpuid modifier has no register")
            bits = _bitmap(mod.get("bitmap"), 32)
            reg = mod["register"]
            regs[reg] = regs[reg] & bits if reg in regs else bits
    msr: dict[int, int] = {}
    for entry in _list(doc, "msr_modifiers"):
        if not isinstance(entry, dict):
            raise InvalidConfig("msr_modifiers holds a non-object")
        addr = _hex(entry.get("addr"), "addr")
        bits = _bitmap(entry.get("bitmap"), 64)
        msr[addr] = msr[addr] & bits if addr in msr else bits
    return _Parsed(kvm, cpuid, msr)


def intersect(configs: Sequence[str]) -> str | None:
    """The intersection of CPU configs as compact JSON, or None if any is invalid
    (or there are none)."""
    if not configs:
        return None
    try:
        parsed = [_parse(c) for c in configs]
    except InvalidConfig:
        return None
    first, rest = parsed[0], parsed[1:]
    kvm = set(first.kvm)
    for p in rest:
        kvm &= p.kvm
    cpuid_out = []
    for key in sorted(first.cpuid):
        if key[0] in DROPPED_LEAVES or any(key not in p.cpuid for p in rest):
            continue
        regs = dict(first.cpuid[key])
        for p in rest:
            other = p.cpuid[key]
            regs = {r: b & other[r] for r, b in regs.items() if r in other}
        cpuid_out.append(
            {
                "leaf": f"0x{key[0]:x}",
                "subleaf": f"0x{key[1]:x}",
                "flags": key[2],
                "modifiers": [{"register": r, "bitmap": f"0b{regs[r]:032b}"} for r in sorted(regs)],
            }
        )
    msr_out = []
    for addr in sorted(first.msr):
        if any(addr not in p.msr for p in rest):
            continue
        bits = first.msr[addr]
        for p in rest:
            bits &= p.msr[addr]
        msr_out.append({"addr": f"0x{addr:x}", "bitmap": f"0b{bits:064b}"})
    out = {"kvm_capabilities": sorted(kvm), "cpuid_modifiers": cpuid_out, "msr_modifiers": msr_out}
    return msgspec.json.encode(out).decode()


def digest(config: str) -> str:
    return hashlib.sha1(config.encode()).hexdigest() if config else ""


# ---------------------------------------------------------------------------
# Bookkeeping in Redis
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What one bookkeeping step says: deliver ``config``, or compute first."""

    config: str = ""
    epoch: str = ""
    configs: tuple[tuple[str, str], ...] = ()

    @property
    def needs_compute(self) -> bool:
        return bool(self.epoch)


def _outcome(r: list[Any]) -> Outcome:
    if tagged(c.CpuDeliver, r):
        return Outcome(config=s(whole_reply(c.CpuDeliver, r).config))
    if tagged(c.CpuCompute, r):
        compute, rest = head(c.CpuCompute, r)
        flat = [s(x) for x in rest]
        return Outcome(
            epoch=s(compute.epoch), configs=tuple(zip(flat[::2], flat[1::2], strict=True))
        )
    whole_reply(c.CpuNone, r)
    return Outcome()


class CpuConfigOps:
    """Builds the bookkeeping calls (run them with ``sched.run(call)``)."""

    def __init__(self, keys: CellKeys) -> None:
        self.k = keys

    def ingest(
        self, node_id: str, cluster_id: str, carried_config: str, restarted: bool
    ) -> Call[Outcome]:
        argv = c.CpuIngestArgv(
            op=c.CPU_INGEST,
            node_id=node_id,
            cluster_id=cluster_id,
            digest=digest(carried_config),
            restarted=c.flag(restarted),
        )
        return Call.of("cpu_config", [*self.k.fixed(), self.k.cpucfg(cluster_id)], argv, _outcome)

    def store(
        self,
        node_id: str,
        cluster_id: str,
        epoch: str,
        result: str | None,
    ) -> Call[Outcome]:
        argv = c.CpuStoreArgv(
            op=c.CPU_STORE, node_id=node_id, cluster_id=cluster_id, epoch=epoch, result=result or ""
        )
        return Call.of("cpu_config", [*self.k.fixed(), self.k.cpucfg(cluster_id)], argv, _outcome)


def exchange(
    step: Callable[[Call[Outcome]], Plan[Outcome]],
    ops: CpuConfigOps,
    node_id: str,
    cluster_id: str,
    carried_config: str,
    restarted: bool,
    ingested: Outcome | None = None,
) -> Plan[str]:
    """One heartbeat's part, a plan of one or two calls (each run by ``step``):
    its value is the config to deliver to the node, or "".  ``ingested``: the
    ingest's outcome where it ran already, in the heartbeat's own trip."""
    out = ingested
    if out is None:
        out = yield from step(ops.ingest(node_id, cluster_id, carried_config, restarted))
    if out.needs_compute:
        result = intersect([cfg for _, cfg in out.configs])
        out = yield from step(ops.store(node_id, cluster_id, out.epoch, result))
    return out.config
