"""``schedctl replicas``: which replicas serve a cell, their version, and when
each was last heard from (the roster every replica refreshes from its monitor
loop; an entry expires unless refreshed, see docs/operations.md)."""

from __future__ import annotations

import click
import msgspec
from rich.table import Table

from scheduler.ops.cells import read_replicas
from scheduler.store.calls import ReplicaEntry
from scheduler.store.translate import translated

from .options import Target, cell_options, pass_target
from .output import age


class ReplicaView(ReplicaEntry, kw_only=True):
    #: Redis time now minus seen_ms
    heard_ms_ago: int = 0


def replicas_table(rows: list[ReplicaView], where: str) -> Table:
    t = Table(title=f"{len(rows)} replicas of {where}", title_justify="left")
    for col in ("replica", "version", "commit", "grpc", "up", "heard"):
        t.add_column(col, justify="right" if col in ("up", "heard") else "left", no_wrap=True)
    for r in rows:
        t.add_row(
            r.replica_id,
            r.version,
            r.commit,
            r.grpc,
            age(r.seen_ms - r.started_ms).removesuffix(" ago"),
            age(r.heard_ms_ago),
        )
    return t


@click.command()
@cell_options()
@pass_target
def replicas(target: Target) -> None:
    """The replicas serving the cell: id (host/pid), version and commit, gRPC
    address, uptime, and when each was last heard from (entries of replicas
    not heard from for 15 s are gone)."""
    s = target.scheduler
    with translated(s.target):
        entries = read_replicas(s.client, s.keys.cell, s.keys.prefix)
        now_s, now_us = s.client.time()
    now = int(now_s) * 1000 + int(now_us) // 1000
    rows = [
        ReplicaView(**msgspec.structs.asdict(e), heard_ms_ago=max(0, now - e.seen_ms))
        for e in entries
    ]
    target.out.emit(rows, lambda: replicas_table(rows, target.where))
