"""``schedctl explain``: what Schedule would do right now, node by node.

The verdicts come from the schedule script itself in dry-run mode (it
reserves and writes nothing), so they cannot disagree with a real Schedule.
The numbers behind an exclusion (current + pending + request vs limit) are
read in the same MULTI from the node view, so they add up to the verdict.
"""

from __future__ import annotations

import click
import msgspec
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from scheduler.client.sync import Scheduler
from scheduler.domain.catalog import STRATEGIES, ceiling, ceiling_in
from scheduler.domain.policy import Policy
from scheduler.domain.records import (
    MIB,
    Explanation,
    LocalityRequirement,
    NodeView,
    Request,
    Verdict,
)
from scheduler.store.translate import translated

from .nodes import ceiling_amount
from .options import Target, cell_options, pass_target
from .output import age, console, gib, pressure_color, size, status_text
from .snapshot import atomically

#: Nodes above which explain runs only when asked to (--whole-fleet): its
#: one Redis call reads every node, about 26 us a node (bench scale: 25 ms
#: at 1,000 nodes, 260 ms at 10,000), and every other call of the cell
#: waits meanwhile; 2,000 nodes hold it about 50 ms
EXPLAIN_FLEET_MAX = 2_000
#: what explain's one call costs Redis a node (us), for the refusal's estimate
EXPLAIN_US_PER_NODE = 26

#: what round_robin and random pick from (docs/design.md "Selection")
SPREAD_RULES = {
    "round_robin": "the first eligible of the 64 nodes after the one it chose last",
    "random": "the first eligible of 32 nodes drawn",
}


class CeilingBreakdown(msgspec.Struct, kw_only=True):
    """Why a ceiling excludes a node: ``current + pending + request`` against ``limit``.

    Units: sandboxes, whole CPUs or bytes.  For the ``*_percent`` ceilings the
    total is compared as ``total * 100 <= limit * capacity`` and ``percent``
    is ``total * 100 / capacity``; the two observed ones (``max_*_used_percent``)
    have no pending or request part: they read the latest snapshot only.
    """

    name: str
    limit: int
    current: int
    pending: int
    request: int
    total: int
    capacity: int | None = None
    percent: float | None = None


class ExplainedVerdict(Verdict, kw_only=True):
    #: "chosen", "eligible" or "excluded"
    verdict: str = ""
    detail: str = ""
    heartbeat_age_ms: int | None = None
    ceiling: CeilingBreakdown | None = None


class Report(msgspec.Struct, kw_only=True):
    now_ms: int
    strategy: str
    chosen: str | None
    rotation: int
    cpu: int
    memory_bytes: int
    refusal: str | None
    reserved: bool = False
    verdicts: list[ExplainedVerdict]


def breakdown(
    name: str,
    limit: int,
    used: int,
    v: NodeView,
    cpu: int,
    mem: int,
) -> CeilingBreakdown:
    """Split ``used`` (the script's current + pending for ceiling ``name``) into its parts."""
    c = ceiling(name)
    capacity: int | None = None
    if c.capacity is not None:
        capacity = v.cpu_capacity if c.capacity == "cpu" else v.memory_capacity_bytes
    if c.observed is not None:
        pending, request = 0, 0
    elif c.counts == "sandboxes":
        pending, request = v.pending_reservations, 1
    elif c.counts == "memory":
        pending, request = v.memory_reserved_bytes, mem
    else:
        pending, request = v.cpu_reserved, cpu
    total = used + request
    percent = None
    if c.unit == "percent" and c.capacity is None:
        percent = float(used)  # reported as a percent (cpu_percent)
    elif capacity:
        percent = round(total * 100 / capacity, 2)
    return CeilingBreakdown(
        name=name,
        limit=limit,
        current=used - pending,
        pending=pending,
        request=request,
        total=total,
        capacity=capacity,
        percent=percent,
    )


def _ceiling_text(b: CeilingBreakdown) -> str:
    c = ceiling(b.name)
    if c.observed is not None:
        return f"{b.name}: observed {b.percent:g}% > {b.limit}% (latest snapshot)"
    if c.unit == "percent":
        unit = gib if c.counts == "memory" else str
        return (
            f"{b.name}: {unit(b.current)} current + {unit(b.pending)} pending + "
            f"{unit(b.request)} requested = {unit(b.total)} of {unit(b.capacity or 0)}"
            f"{' GiB' if c.counts == 'memory' else ' cpu'} = {b.percent:g}% > {b.limit}%"
        )
    amount = (lambda n: size(n)) if c.unit == "bytes" else str
    return (
        f"{b.name}: {amount(b.current)} current + {amount(b.pending)} pending + "
        f"{amount(b.request)} requested = {amount(b.total)} > "
        f"{ceiling_amount(b.name, b.limit)}"
    )


def _locality_text(v: Verdict) -> str:
    """What locality made of the node: its coverage and bonus, and why a warm
    node did not win ("" for a cold node that locality did not consider)."""
    if v.coverage == 0 and not v.locality:
        return ""
    text = f"; locality: coverage {v.coverage:.2f}, bonus {v.bonus:.3f}"
    if v.locality and not v.chosen:
        text += f", lost: {v.locality}"
    return text


def explain_node(
    v: Verdict,
    view: NodeView | None,
    e: Explanation,
    policy: Policy,
) -> ExplainedVerdict:
    out = ExplainedVerdict(**msgspec.structs.asdict(v))
    out.heartbeat_age_ms = view.heartbeat_age_ms if view else None
    if v.reason is None:
        out.verdict = "chosen" if v.chosen else "eligible"
        out.detail = (
            f"rank {v.rank}: pressure {v.pressure:.4f}, starting {v.starting}, "
            f"running {v.running}, paused {v.paused}"
        )
        if not v.known_capacity:
            out.detail += " (capacity unknown: fallback after every known node)"
        out.detail += _locality_text(v)
        return out
    out.verdict = "excluded"
    out.detail = v.reason
    limits = policy.limits.active()
    reached = ceiling_in(v.reason)
    if reached is not None and reached.name in limits and view is not None:
        name = reached.name
        use = next((c for c in view.ceilings if c.name == name), None)
        if use is not None:
            out.ceiling = breakdown(name, limits[name], use.used, view, e.cpu, e.memory_bytes)
            out.detail = _ceiling_text(out.ceiling)
    elif v.reason == "stale heartbeat":
        out.detail = (
            f"stale heartbeat: last seen {age(out.heartbeat_age_ms)}, "
            f"report_ttl {policy.report_ttl_ms / 1000:g}s"
        )
    elif v.reason == "insufficient cpu":
        out.detail = (
            f"insufficient cpu: {v.projected_cpu} projected > {v.cpu_capacity} × "
            f"{policy.overcommit.cpu:g} overcommit"
        )
    elif v.reason == "insufficient memory":
        out.detail = (
            f"insufficient memory: {gib(v.projected_memory_bytes)} GiB projected > "
            f"{gib(v.memory_capacity_bytes)} GiB × {policy.overcommit.memory:g} "
            "overcommit"
        )
    elif v.reason == "lingering":
        out.detail = "lingering: draining, takes no new placements"
    elif v.reason.startswith("not accepting: "):
        out.detail = f"{v.reason}: the node's heartbeat says it takes no new sandboxes"
    if v.coverage > 0:
        out.detail += f"; locality: coverage {v.coverage:.2f} (filtered: never chosen for it)"
    return out


def _requirement(text: str) -> LocalityRequirement:
    """``KEY`` or ``KEY=BYTES`` (the last ``=`` splits: keys may hold one)."""
    key, sep, size = text.rpartition("=")
    if not sep or not size.isdigit():
        return LocalityRequirement(key=text)
    return LocalityRequirement(key=key, size_bytes=int(size))


def _order(v: ExplainedVerdict) -> tuple[int, int, str]:
    return (0 if v.chosen else 1 if v.rank is not None else 2, v.rank or 0, v.node_id)


def report_table(r: Report, where: str, width: int = 200) -> Group:
    """The verdicts as a table, and under it each node's reason whole: one
    line per node (wrapped, never cut), so it reads at 80 columns.  The
    starting / running / paused counts (tie-breaks) show where they fit;
    the reasons keep every number that decides."""
    request = f"{r.cpu} cpu, {size(r.memory_bytes)}"
    if r.chosen:
        head = Text.assemble(("would place on ", ""), (r.chosen, "bold green"))
    else:
        head = Text(f"would refuse: {r.refusal}", style="bold red")
    head.append(
        f"\n(request {request}; strategy {r.strategy}; dry run, nothing reserved)", style="dim"
    )
    table = Table(
        title=f"explain on {where}",
        title_justify="left",
        caption="cpu, mem GiB: projected (with this request) / capacity",
        caption_justify="left",
        box=None,
        padding=(0, 1),
        pad_edge=False,
        header_style="bold",
    )
    base = ("node", "verdict", "status", "pressure")
    counted_cols = ("starting", "running", "paused")
    tail = ("cpu", "mem GiB")
    verdict_words = [
        "chosen" if v.chosen else f"#{v.rank}" if v.rank is not None else "excluded"
        for v in r.verdicts
    ]
    natural = (
        sum(
            max([len(h), *(len(x) for x in xs)])
            for h, xs in (
                ("node", [v.node_id for v in r.verdicts]),
                ("verdict", verdict_words),
                ("status", [v.status for v in r.verdicts]),
                ("pressure", ["0.000"]),
                ("cpu", [f"{v.projected_cpu}/{v.cpu_capacity}" for v in r.verdicts]),
                (
                    "mem GiB",
                    [
                        f"{gib(v.projected_memory_bytes)}/{gib(v.memory_capacity_bytes)}"
                        for v in r.verdicts
                    ],
                ),
            )
        )
        + 2 * 5
    )
    counts = counted_cols if natural + sum(len(c) + 2 for c in counted_cols) <= width else ()
    for col in (*base, *counts, *tail):
        table.add_column(
            col,
            justify="right" if col in ("pressure", *counted_cols) else "left",
            no_wrap=True,
        )
    reasons = Table.grid(padding=(0, 2))
    reasons.add_column(no_wrap=True, style="bold")
    reasons.add_column(overflow="fold")
    for v in r.verdicts:
        verdict = (
            Text("chosen", style="bold green")
            if v.chosen
            else Text(f"#{v.rank}")
            if v.rank is not None
            else Text("excluded", style="red")
        )
        counted = (str(v.starting), str(v.running), str(v.paused)) if counts else ()
        table.add_row(
            v.node_id,
            verdict,
            status_text(v.status),
            Text(f"{v.pressure:.3f}", style=pressure_color(v.pressure)),
            *counted,
            f"{v.projected_cpu}/{v.cpu_capacity}",
            f"{gib(v.projected_memory_bytes)}/{gib(v.memory_capacity_bytes)}",
        )
        reasons.add_row(v.node_id, Text(v.detail, style="" if v.reason is None else "red"))
    parts: list[RenderableType] = [head, table, Text("why:", style="bold"), reasons]
    if r.strategy in SPREAD_RULES:
        parts.append(
            Text(
                f"ranks are least_loaded order; {r.strategy} takes {SPREAD_RULES[r.strategy]}"
                " without pressure, and least_loaded's choice when none of them is eligible",
                style="dim",
            )
        )
    return Group(*parts)


def explain_report(s: Scheduler, req: Request, strategy: str | None = None) -> Report:
    """The dry-run Schedule of ``req`` with every node's numbers, read in one
    atomic step: what ``schedctl explain`` shows."""
    e, (_, views), policy = atomically(
        s, s.ops.explain(req, strategy), s.ops.nodes(), s.ops.policy()
    )
    assert policy is not None  # explain fails with PRECONDITION on a cell without one
    by_id = {v.node_id: v for v in views}
    verdicts = sorted(
        (explain_node(v, by_id.get(v.node_id), e, policy) for v in e.verdicts), key=_order
    )
    return Report(
        now_ms=e.now_ms,
        strategy=e.strategy,
        chosen=e.chosen,
        rotation=e.rotation,
        cpu=e.cpu,
        memory_bytes=e.memory_bytes,
        refusal=e.refusal,
        verdicts=verdicts,
    )


@click.command()
@cell_options()
@click.option(
    "--cpu",
    type=click.IntRange(0),
    default=None,
    metavar="N",
    help="CPUs requested (absent or 0: the policy's default_request).",
)
@click.option(
    "--memory-mb",
    type=click.IntRange(0),
    default=None,
    metavar="M",
    help="Memory requested in MiB (absent or 0: the policy's default_request).",
)
@click.option(
    "--strategy",
    type=click.Choice(STRATEGIES),
    default=None,
    help="Override the cell's strategy for this explanation.",
)
@click.option(
    "--locality",
    "requirements",
    multiple=True,
    metavar="KEY[=BYTES]",
    help="An artifact the sandbox needs (repeatable; BYTES: what a node without it pulls).",
)
@click.option("--template", "template_id", default="", metavar="ID", help="Template id.")
@click.option(
    "--whole-fleet",
    is_flag=True,
    help=f"Run it on a cell of more than {EXPLAIN_FLEET_MAX:,} nodes too (one Redis call "
    "reads them all: every other call waits).",
)
@click.option(
    "--image", "images", multiple=True, metavar="IMAGE", help="Image (repeatable, in order)."
)
@pass_target
def explain(
    target: Target,
    cpu: int | None,
    memory_mb: int | None,
    strategy: str | None,
    requirements: tuple[str, ...],
    template_id: str,
    images: tuple[str, ...],
    whole_fleet: bool,
) -> None:
    """Dry-run Schedule at this instant: every node's verdict, nothing reserved.

    The same script as Schedule decides (in dry-run mode), so what it shows is
    what a Schedule would do now: the chosen node, the rank and tie-break
    values of every eligible node, and the exact reason for every excluded one.
    It reads every node in one Redis call: on a cell of more than 2,000 nodes
    it runs only with --whole-fleet.
    """
    s = target.scheduler
    with translated(s.target):  # (Redis down: UNAVAILABLE naming it, as every command)
        nodes = int(s.client.zcard(s.keys.nodes))
    if nodes > EXPLAIN_FLEET_MAX and not whole_fleet:
        held = nodes * EXPLAIN_US_PER_NODE / 1e6
        raise click.ClickException(
            f"explain reads all {nodes:,} nodes of the cell in one Redis call, which holds "
            f"every other call of the cell for about {held:.1f} s; run it again with "
            "--whole-fleet to do it anyway"
        )
    req = Request(
        cpu=cpu or None,
        memory_bytes=memory_mb * MIB if memory_mb else None,
        locality=tuple(_requirement(r) for r in requirements),
        template_id=template_id,
        images=images,
    )
    report = explain_report(target.scheduler, req, strategy)
    target.out.emit(report, lambda: report_table(report, target.where, console().width))
