"""Every cell on a target: one Redis, or every primary of a Redis Cluster.

A cell is found by its policy hash (``<prefix>:{<cell>}:policy``, the key a
replica writes first); its numbers come from its own scripts, so they read
exactly as ``schedctl nodes`` and ``schedctl reservations`` would.

Also here: deleting a cell (every key under its ``<prefix>:{<cell>}:``, in
bounded SCAN / UNLINK steps) and reading its replica roster (the
``replica:<id>`` entries each replica refreshes, see
:meth:`scheduler.store.calls.Ops.replica_seen`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from redis.crc import key_slot

from scheduler.client.sync import Scheduler
from scheduler.domain.errors import FailedPrecondition
from scheduler.store.calls import ReplicaEntry
from scheduler.store.keys import DEFAULT_PREFIX, CellKeys
from scheduler.store.translate import translated

#: Keys a SCAN step asks for, and keys one UNLINK removes.
DELETE_STEP = 500


class CellSummary(msgspec.Struct, kw_only=True):
    cell: str
    #: the hash slot all of the cell's keys live in (its hash tag's)
    slot: int
    #: host:port of the primary that serves it
    primary: str
    nodes: int
    ready: int
    pending_reservations: int
    #: placements made since the cell was created (its reserved_total counter)
    placed_total: int
    strategy: str


def cell_names(client: Any, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Cells with a policy on ``client``'s target (every primary of a cluster)."""
    head = f"{prefix}:{{"
    names = set()
    for key in client.scan_iter(match=f"{prefix}:{{*}}:policy", count=1000):
        text = key.decode() if isinstance(key, bytes) else str(key)
        if text.startswith(head) and text.endswith("}:policy"):
            names.add(text[len(head) : -len("}:policy")])
    return sorted(names)


def primary_of(client: Any, key: str) -> str:
    get_node = getattr(client, "get_node_from_key", None)
    if get_node is not None:  # a cluster client
        node = get_node(key)
        return f"{node.host}:{node.port}"
    kw = client.connection_pool.connection_kwargs
    if "path" in kw:
        return f"unix:{kw['path']}"
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}"


def summarize(sched: Scheduler, prefix: str = DEFAULT_PREFIX) -> list[CellSummary]:
    out = []
    with translated(sched.target):  # (an ACL without SCAN: one line, not a traceback)
        names = cell_names(sched.client, prefix)
    for name in names:
        cell = Scheduler(sched.client, cell=name, prefix=prefix, url=sched.url)
        keys = CellKeys(name, prefix)
        views = cell.nodes()
        stats = cell.stats()
        policy = cell.policy()
        out.append(
            CellSummary(
                cell=name,
                slot=key_slot(keys.policy.encode()),
                primary=primary_of(sched.client, keys.policy),
                nodes=len(views),
                ready=sum(1 for v in views if v.status == "READY"),
                pending_reservations=stats.pending,
                placed_total=stats.reserved_total,
                strategy=policy.strategy if policy else "",
            )
        )
    return out


def cell_keys(client: Any, keys: CellKeys, match: str = "*") -> list[str]:
    """Every key of the cell matching ``<base><match>`` (a cell's name holds no
    glob characters: see :class:`~scheduler.store.keys.CellKeys`)."""
    found = client.scan_iter(match=keys.base + match, count=DELETE_STEP)
    return sorted({_text(k) for k in found})


def delete_cell(
    client: Any,
    cell: str,
    prefix: str = DEFAULT_PREFIX,
    on_step: Callable[[int], None] | None = None,
) -> int:
    """Remove every key of ``cell``: SCAN in steps of :data:`DELETE_STEP`, each
    step's keys UNLINKed at once (Redis frees them in the background).  The
    policy goes first, so a replica or a command that comes between sees an
    uninitialised cell, never half a cell that looks served.  Returns how many
    keys went; 0 for a cell that does not exist (deleting twice is harmless).
    """
    keys = CellKeys(cell, prefix)
    removed = int(client.unlink(keys.policy))
    batch: list[Any] = []
    # (SCAN returns every key that stays present while it runs; deleting the
    # keys it already returned does not make it skip others)
    for key in client.scan_iter(match=keys.base + "*", count=DELETE_STEP):
        batch.append(key)
        if len(batch) >= DELETE_STEP:
            removed += int(client.unlink(*batch))
            batch = []
            if on_step is not None:
                on_step(removed)
    if batch:
        removed += int(client.unlink(*batch))
    return removed


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def read_replicas(client: Any, cell: str, prefix: str = DEFAULT_PREFIX) -> list[ReplicaEntry]:
    """The cell's replica roster: every entry not yet expired, newest first."""
    keys = CellKeys(cell, prefix)
    names = cell_keys(client, keys, "replica:*")
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(name)
    out = []
    for name, raw in zip(names, pipe.execute(), strict=True):
        if not raw:
            continue  # expired between SCAN and HGETALL
        fields = {_text(k): _text(v) for k, v in raw.items()}
        out.append(
            ReplicaEntry(
                replica_id=fields.get("replica_id") or name.removeprefix(keys.base + "replica:"),
                version=fields.get("version", ""),
                commit=fields.get("commit", ""),
                host=fields.get("host", ""),
                pid=_int(fields.get("pid")),
                grpc=fields.get("grpc", ""),
                started_ms=_int(fields.get("started_ms")),
                seen_ms=_int(fields.get("seen_ms")),
            )
        )
    return sorted(out, key=lambda e: (-e.seen_ms, e.replica_id))


def _int(text: str | None) -> int:
    if text is None or text == "":
        return 0
    try:
        return int(text)
    except ValueError:
        raise FailedPrecondition(
            f"replica roster entry has a non-numeric field: {text!r}"
        ) from None
