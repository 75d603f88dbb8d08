"""``schedctl policy show`` / ``schedctl policy set``: the cell's shared policy."""

from __future__ import annotations

import click
import msgspec
from rich.console import Group
from rich.table import Table
from rich.text import Text

from scheduler.domain.catalog import CEILING_NAMES, STRATEGIES
from scheduler.domain.errors import CellNotInitialised
from scheduler.domain.policy import (
    MAX_AFFINITY_NODES,
    MAX_ARTIFACT_KEY_BYTES,
    MAX_ROSTER_IDS,
    Overcommit,
    Policy,
)

from .nodes import ceiling_amount
from .options import Duration, Target, cell_options, format_duration, pass_target


def policy_table(p: Policy, where: str) -> Table:
    table = Table(title=f"policy of {where}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("strategy", p.strategy)
    table.add_row("report_ttl", format_duration(p.report_ttl_ms))
    table.add_row("binding_ttl", format_duration(p.binding_ttl_ms))
    table.add_row("placement_reservation_ttl", format_duration(p.reservation_ttl_ms))
    table.add_row("unassigned_reservation_ttl", format_duration(p.unassigned_reservation_ttl_ms))
    table.add_row("overcommit", f"cpu {p.overcommit.cpu:g}, memory {p.overcommit.memory:g}")
    table.add_row(
        "default_request", f"cpu {p.default_request.cpu}, memory {p.default_request.memory_mb} MiB"
    )
    for name in CEILING_NAMES:
        value = getattr(p.limits, name)
        table.add_row(
            name, ceiling_amount(name, value) if value else Text("no ceiling", style="dim")
        )
    table.add_row(
        "static node list", "yes" if p.static_nodes else "no (nodes register by heartbeat)"
    )
    table.add_row("max_roster_ids", str(p.max_roster_ids))
    table.add_row(
        "node_forget_after",
        format_duration(p.node_forget_after_ms)
        if p.node_forget_after_ms
        else Text("never", style="dim"),
    )
    table.add_row("reservation_tombstone_ttl", format_duration(p.reservation_tombstone_ttl_ms))
    table.add_row("artifact_key_max_bytes", str(p.artifact_key_max_bytes))
    loc = p.locality
    table.add_row(
        "locality",
        f"weight {loc.weight:g}, max_pressure_gap {loc.max_pressure_gap:g}, headroom_share "
        f"{loc.headroom_share:g}, pending_decay "
        f"{loc.pending_decay:g}, affinity_ttl "
        f"{format_duration(loc.affinity_ttl_ms)}, affinity_max_nodes {loc.affinity_max_nodes}"
        if loc.weight > 0
        else Text("off (weight 0)", style="dim"),
    )
    return table


@click.group()
@cell_options()
def policy() -> None:
    """The limits, overcommit, TTLs and strategy every replica of the cell shares."""


@policy.command()
@cell_options()
@pass_target
def show(target: Target) -> None:
    """The cell's stored policy."""
    p = target.scheduler.policy()
    if p is None:
        raise CellNotInitialised()
    target.out.emit(p, lambda: policy_table(p, target.where))


class PolicyChange(msgspec.Struct, kw_only=True):
    outcome: str
    #: stored field -> [before, after] ("" when absent)
    changed: dict[str, list[str]]
    policy: Policy


def _limit(text: str) -> tuple[str, int]:
    name, eq, value = text.partition("=")
    name = name.strip().removeprefix("node_resource_limit.")
    if not eq or name not in CEILING_NAMES or not value.strip().isdigit():
        raise click.BadParameter(
            f"{text!r} is not NAME=VALUE with NAME one of "
            f"{', '.join(CEILING_NAMES)} and VALUE a whole number "
            "(0 removes the ceiling)",
            param_hint="'--limit'",
        )
    return name, int(value)


@policy.command(name="set")
@cell_options()
@click.option("--strategy", type=click.Choice(STRATEGIES), help="Placement strategy.")
@click.option("--report-ttl", type=Duration(), help="Heartbeat age after which a node is stale.")
@click.option("--binding-ttl", type=Duration(), help="Lifetime of a sandbox binding.")
@click.option(
    "--reservation-ttl",
    type=Duration(),
    help="placement_reservation_ttl: a reservation's life if nothing accounts for it.",
)
@click.option(
    "--unassigned-reservation-ttl",
    type=Duration(),
    help="unassigned_reservation_ttl: a reservation's life until its RecordAssignment.",
)
@click.option("--overcommit-cpu", type=click.FloatRange(0, 1000, min_open=True))
@click.option("--overcommit-memory", type=click.FloatRange(0, 1000, min_open=True))
@click.option("--default-cpu", type=click.IntRange(0), help="CPUs of a request without a size.")
@click.option(
    "--default-memory-mb", type=click.IntRange(0), help="Memory (MiB) of a request without a size."
)
@click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="NAME=VALUE",
    help="A node_resource_limit ceiling, e.g. max_sandbox_count=10 (0 removes it). Repeatable.",
)
@click.option(
    "--max-roster-ids",
    type=click.IntRange(1, MAX_ROSTER_IDS),
    help="Longest heartbeat roster accepted.",
)
@click.option(
    "--node-forget-after",
    type=Duration(zero_ok=True),
    help="Forget nodes silent this long (0 = never).",
)
@click.option(
    "--reservation-tombstone-ttl",
    type=Duration(),
    help="How long an ended reservation stays readable.",
)
@click.option(
    "--artifact-key-max-bytes",
    type=click.IntRange(1, MAX_ARTIFACT_KEY_BYTES),
    help="Longest P2P artifact key accepted (bytes).",
)
@click.option(
    "--locality-weight",
    type=click.FloatRange(0, 10),
    help="Largest locality bonus, in pressure units (0 = locality off).",
)
@click.option(
    "--locality-max-pressure-gap",
    type=click.FloatRange(0, 10),
    help="A warm node competes only within this pressure of the coolest.",
)
@click.option(
    "--locality-headroom-share",
    type=click.FloatRange(0, 1),
    help="The gap is at most this share of the coolest node's headroom (0 = no cap).",
)
@click.option(
    "--locality-pending-decay",
    type=click.FloatRange(0, 100),
    help="The bonus is divided by 1 + this x the node's pending starts of the template.",
)
@click.option(
    "--locality-affinity-ttl",
    type=Duration(),
    help="How long a start keeps its node warm for its template.",
)
@click.option(
    "--locality-affinity-max-nodes",
    type=click.IntRange(1, MAX_AFFINITY_NODES),
    help="Most recent starters kept per template.",
)
@pass_target
def set_(
    target: Target,
    strategy: str | None,
    report_ttl: int | None,
    binding_ttl: int | None,
    reservation_ttl: int | None,
    unassigned_reservation_ttl: int | None,
    overcommit_cpu: float | None,
    overcommit_memory: float | None,
    default_cpu: int | None,
    default_memory_mb: int | None,
    limits: tuple[str, ...],
    max_roster_ids: int | None,
    node_forget_after: int | None,
    reservation_tombstone_ttl: int | None,
    artifact_key_max_bytes: int | None,
    locality_weight: float | None,
    locality_max_pressure_gap: float | None,
    locality_headroom_share: float | None,
    locality_pending_decay: float | None,
    locality_affinity_ttl: int | None,
    locality_affinity_max_nodes: int | None,
) -> None:
    """Change fields of the cell's policy; every replica decides by it from the next call.

    Fields not given keep their stored value (or the default on a new cell).
    Replicas read the policy from the cell, but a replica started later with a
    config file that disagrees refuses to start until its file matches or it
    is told to overwrite.
    """
    given_limits = dict(_limit(x) for x in limits)
    bounds = {
        k: v
        for k, v in (
            ("max_roster_ids", max_roster_ids),
            ("node_forget_after_ms", node_forget_after),
            ("reservation_tombstone_ttl_ms", reservation_tombstone_ttl),
            ("artifact_key_max_bytes", artifact_key_max_bytes),
        )
        if v is not None
    }
    locality = {
        k: v
        for k, v in (
            ("weight", locality_weight),
            ("max_pressure_gap", locality_max_pressure_gap),
            ("headroom_share", locality_headroom_share),
            ("pending_decay", locality_pending_decay),
            ("affinity_ttl_ms", locality_affinity_ttl),
            ("affinity_max_nodes", locality_affinity_max_nodes),
        )
        if v is not None
    }
    if (
        not any(
            x is not None
            for x in (
                strategy,
                report_ttl,
                binding_ttl,
                reservation_ttl,
                unassigned_reservation_ttl,
                overcommit_cpu,
                overcommit_memory,
                default_cpu,
                default_memory_mb,
            )
        )
        and not given_limits
        and not bounds
        and not locality
    ):
        raise click.UsageError("nothing to set: give at least one option (see --help)")
    s = target.scheduler
    before = s.policy()
    p = before or Policy()
    new = msgspec.structs.replace(
        p,
        strategy=strategy or p.strategy,
        report_ttl_ms=report_ttl or p.report_ttl_ms,
        binding_ttl_ms=binding_ttl or p.binding_ttl_ms,
        reservation_ttl_ms=reservation_ttl or p.reservation_ttl_ms,
        unassigned_reservation_ttl_ms=unassigned_reservation_ttl or p.unassigned_reservation_ttl_ms,
        overcommit=Overcommit(
            cpu=p.overcommit.cpu if overcommit_cpu is None else overcommit_cpu,
            memory=p.overcommit.memory if overcommit_memory is None else overcommit_memory,
        ),
        default_request=msgspec.structs.replace(
            p.default_request,
            cpu=p.default_request.cpu if default_cpu is None else default_cpu,
            memory_mb=(
                p.default_request.memory_mb if default_memory_mb is None else default_memory_mb
            ),
        ),
        limits=msgspec.structs.replace(p.limits, **given_limits),
        locality=msgspec.structs.replace(p.locality, **locality),
        **bounds,
    )
    outcome = s.sync_policy(new, overwrite=True)
    old_fields = before.to_fields() if before else {}
    new_fields = new.to_fields()
    changed = {
        k: [old_fields.get(k, ""), new_fields.get(k, "")]
        for k in sorted(set(old_fields) | set(new_fields))
        if old_fields.get(k) != new_fields.get(k)
    }
    result = PolicyChange(outcome=outcome, changed=changed, policy=new)
    if changed:
        target.out.note(
            "replicas decide by the new policy from their next call; update their "
            "config files to match, or a restarted replica refuses to start"
        )

    def render() -> Group:
        lines = Text(f"policy {outcome}" + (":" if changed else " (nothing changed)"))
        for k, (old, now) in changed.items():
            lines.append(f"\n  {k}: {old or '-'} -> {now or '-'}")
        return Group(lines, policy_table(new, target.where))

    target.out.emit(result, render)
