"""The include ``constants``: the Python tables as Lua, so no list is typed twice.

The script loader (scheduler/store/scripts.py) adds the text :func:`render`
returns to the includes it reads from lua/includes/; scripts name it like
any other include (``-- @include constants``); it exports every name it
defines (scheduler/store/lua_modules.py).  Every value is a literal: a
function library's load-time code may not call functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from scheduler.domain import catalog
from scheduler.domain.errors import NO_POLICY, SCRIPT_CODES
from scheduler.domain.records import snapshot_fields
from scheduler.store import contracts
from scheduler.store.calls import HEARTBEAT_FIELDS, HEARTBEAT_SCRIPTS

NAME = "constants"


#: fields one pattern of PACKED_RES captures (one more for the rest, where
#: more follow): below Lua's 32 captures a pattern
PACKED_CHUNK = 30


def packed_patterns(n: int) -> list[str]:
    """The patterns that split a packed policy of ``n`` tab-separated fields:
    each captures up to PACKED_CHUNK of them and, where more follow, the
    rest (matched by the next pattern)."""
    out = []
    while n > PACKED_CHUNK:
        out.append("^" + "\t".join(["([^\t]*)"] * PACKED_CHUNK) + "\t(.*)$")
        n -= PACKED_CHUNK
    out.append("^" + "\t".join(["([^\t]*)"] * n) + "$")
    return out


def _str(s: str) -> str:
    """A Lua string literal."""
    escaped = s.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + escaped.replace("\n", "\\n").replace("\t", "\\t") + "'"


def _list(items: Iterable[str]) -> str:
    return "{ " + ", ".join(_str(i) for i in items) + " }"


def _value(v: str | int | float | bool) -> str:
    """A Lua literal of a string, a number or a boolean."""
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, bool):  # (before int: a bool is one)
        return "true" if v else "false"
    return str(v)


def _map(items: Mapping[str, str | int | float | bool]) -> str:
    return "{ " + ", ".join(f"[{_str(k)}] = {_value(v)}" for k, v in items.items()) + " }"


def _set(items: Iterable[str]) -> str:
    return _map(dict.fromkeys(items, True))


def index_movers(snapshot: Mapping[str, Any]) -> dict[str, str | bool]:
    """Snapshot field -> True (it places the node) or the observed ceiling that
    reads it (it matters while that ceiling is set)."""
    movers: dict[str, str | bool] = {
        c.observed: c.name for c in catalog.CEILINGS if c.observed is not None
    }
    movers.update({n: True for n, f in snapshot.items() if f.index})
    # (not a snapshot number: the heartbeat's word on admission, calls.py)
    movers["admission"] = True
    return movers


#: The policy's durations a decision reads, which every stored policy has.
POLICY_TTLS = ("report_ttl_ms", "binding_ttl_ms", "reservation_ttl_ms")


def render() -> str:
    """The include's text."""
    ceilings = catalog.CEILINGS
    packed = catalog.PACKED
    snapshot = snapshot_fields()
    strategies = catalog.STRATEGIES
    kinds = [*HEARTBEAT_SCRIPTS.values(), contracts.BATCH_INGEST]
    lines = [
        "--[[",
        "  includes/constants.lua: written by the script loader from the Python tables",
        "  (scheduler/store/lua_constants.py); there is no such file: change the tables.",
        "]]",
        "-- The ceilings of node_resource_limit, in the order the stages check them",
        "-- (scheduler/domain/catalog.py CEILINGS).",
        f"local LIMIT_NAMES = {_list(catalog.CEILING_NAMES)}",
        "-- Percent ceilings: compared as used * 100 <= limit * this capacity.",
        "local CEILING_CAPACITY = "
        + _map({c.name: c.capacity for c in ceilings if c.capacity is not None}),
        "-- Observed-utilisation ceilings and the snapshot field each reads.",
        "local OBSERVED_CEILINGS = "
        + _map({c.name: c.observed for c in ceilings if c.observed is not None}),
        "-- The policy hash's fields, packed in this order into its field `packed`.",
        f"local PACKED = {_list(packed)}",
        f"-- {len(packed)} tab-separated captures, one per PACKED name, in patterns of at",
        f"-- most {PACKED_CHUNK} (each but the last also captures the rest): a Lua pattern",
        "-- holds at most 32 captures (LUA_MAXCAPTURES)",
        f"local PACKED_RES = {_list(packed_patterns(len(packed)))}",
        "-- Kept in the policy hash beside the policy, not part of it.",
        f"local NOT_POLICY = {_set(catalog.BESIDE_POLICY)}",
        "-- Bounds absent from the policy hash have these values.",
        f"local BOUNDS_DEFAULTS = {_map(catalog.BOUNDS_DEFAULTS)}",
        "-- Locality settings absent from the policy hash have these values.",
        f"local LOCALITY_DEFAULTS = {_map(catalog.LOCALITY_DEFAULTS)}",
        "-- A node's admission reason (snapshot admission_reason) as a refusal names it.",
        f"local ADMISSION_TEXT = {_map(catalog.ADMISSION_TEXT)}",
        f"local STRATEGIES = {_set(strategies)}",
        f"local DEFAULT_STRATEGY = {_str(catalog.DEFAULT_STRATEGY)}",
        "local STRATEGY_CHOICES = " + _str(", ".join(strategies[:-1]) + " or " + strategies[-1]),
        f"local EVENT_TYPES = {_set(catalog.EVENT_TYPES)}",
        f"local LIVE = {_set(catalog.LIVE_STATES)}",
        f"local ENDED = {_set(catalog.OUTCOMES)}",
        "-- Expired reservations a script call ends, at most.",
        f"local SWEEP_BATCH = {catalog.SWEEP_BATCH}",
        "-- The nodes, first by id, whose reasons a refusal counts, at most.",
        f"local REFUSAL_COUNTED = {catalog.REFUSAL_COUNTED}",
        "-- The most nodes a Schedule's full scan reads (larger: refused BEHIND).",
        f"local FULL_SCAN_MAX = {catalog.FULL_SCAN_MAX}",
        "-- The one-heartbeat release: its margin after the assignment, and the",
        "-- window of a node's stamp lead (includes/base.lua stamp_lead).",
        f"local STAMP_MARGIN_MS = {catalog.STAMP_MARGIN_MS}",
        f"local STAMP_WINDOW_MS = {catalog.STAMP_WINDOW_MS}",
        f"local NO_POLICY = {_str(NO_POLICY)}",
        "-- The modes and forms the clients send in ARGV (scheduler/store/contracts.py).",
        "local ROSTER_FORM = "
        + _map(
            {
                "same": contracts.ROSTER_SAME,
                "full": contracts.ROSTER_FULL,
                "delta": contracts.ROSTER_DELTA,
            }
        ),
        "local CANCEL_MODE = " + _map({"cancel": contracts.CANCEL, "abandon": contracts.ABANDON}),
        "local POLICY_MODE = "
        + _map(
            {
                "check": contracts.POLICY_CHECK,
                "overwrite": contracts.POLICY_OVERWRITE,
                "restore": contracts.POLICY_RESTORE,
            }
        ),
        "-- The codes of error replies, fail(ERR.NOT_FOUND, ...) (scheduler/domain/errors.py).",
        "local ERR = { " + ", ".join(f"{c} = {_str(c)}" for c in SCRIPT_CODES) + " }",
        "-- The kinds of call a heartbeat batch holds (heartbeat_batch-5.lua).",
        f"local HEARTBEAT_KINDS = {_set(kinds)}",
        "local HEARTBEAT_KIND_CHOICES = "
        + _str(", ".join(f'"{k}"' for k in kinds[:-1]) + f' or "{kinds[-1]}"'),
        "-- What a heartbeat may write to a node record.",
        f"local SNAPSHOT_FIELDS = {_set(HEARTBEAT_FIELDS)}",
        "-- Snapshot fields that can move a node in the placement index (or in or",
        "-- out of it): true, or the OBSERVED_CEILINGS one under which observed",
        "-- utilisation matters (a heartbeat looks each field it sends up once).",
        "local INDEX_MOVERS = " + _map(index_movers(snapshot)),
        "-- Numbers a decision reads: whole numbers the placement index may spell.",
        f"local WHOLE_FIELDS = {_set(n for n, f in snapshot.items() if f.decides and f.maximum)}",
        "-- The policy's durations every policy has (load_policy checks them).",
        f"local POLICY_TTLS = {_list(POLICY_TTLS)}",
    ]
    names = [line.split()[1] for line in lines if line.startswith("local ")]
    exports = [f"-- @exports {' '.join(names[i : i + 8])}" for i in range(0, len(names), 8)]
    return "\n".join(lines[:4] + exports + lines[4:]) + "\n"
