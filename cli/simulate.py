"""``schedctl simulate``: a simulated fleet, N replicas and gateway load, then the verdict."""

from __future__ import annotations

import threading
import time

import click
from rich.console import Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from scheduler.domain.catalog import STRATEGIES
from scheduler.domain.errors import FailedPrecondition, InvalidArgument
from scheduler.ops import simulate as engine
from scheduler.store.connection import describe_target

from .nodes import compact_table
from .options import Failure, Target, cell_options, pass_target
from .output import console

_D = engine.Scenario()
#: Seconds between progress lines on stderr when it is not a terminal.
PROGRESS_EVERY_S = 5.0


def summary_table(r: engine.SimulationResult) -> Table:
    sc = r.scenario
    table = Table(title="summary", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "placed",
        f"{r.placed} of {sc.creates} creates"
        + (
            f" ({r.failed_creates} failed on the node, reservation cancelled)"
            if r.failed_creates
            else ""
        ),
    )
    refused = Text(f"{r.refused}")
    for message, n in sorted(r.refusals.items(), key=lambda kv: -kv[1]):
        refused.append(f"\n{n} × {message}", style="dim")
    table.add_row("refused", refused)
    if r.ceiling:
        verdict = (
            Text("held", style="bold green") if r.ceiling_held else Text("BROKEN", style="bold red")
        )
        table.add_row(
            "highest node count",
            Text.assemble(
                f"{r.max_node_count} on {r.max_node_id} against max_sandbox_count {r.ceiling}: ",
                "the ceiling ",
                verdict,
            ),
        )
    else:
        table.add_row("highest node count", f"{r.max_node_count} on {r.max_node_id} (no ceiling)")
    table.add_row("peak pressure", f"{r.peak_pressure:.3f} on {r.peak_pressure_node}")
    table.add_row(
        "accounting",
        Text(
            "settled: the cell counts exactly what every node runs, no reservation left",
            style="green",
        )
        if r.settled
        else Text(
            f"not settled: {r.pending_after_settle} reservations still pending", style="yellow"
        ),
    )
    table.add_row(
        "load",
        f"{sc.replicas} replicas, {sc.gateway_workers} gateway workers, "
        f"{sc.nodes} nodes, {r.heartbeats} heartbeats in {r.duration_s:.1f}s; "
        f"schedule p50 {r.schedule_p50_ms:.1f} ms, p99 "
        f"{r.schedule_p99_ms:.1f} ms",
    )
    for message, n in r.errors.items():
        table.add_row(Text("error", style="red"), f"{n} × {message}")
    return table


@click.command()
@cell_options(default_cell=engine.DEFAULT_CELL, embedded_default=True)
@click.option("--nodes", type=click.IntRange(1, 10_000), default=_D.nodes, show_default=True)
@click.option(
    "--node-shapes",
    default=",".join(str(s) for s in _D.node_shapes),
    show_default=True,
    metavar="CPUxMEM,...",
    help="Node sizes, cycled over the nodes (memory in MiB, or G for GiB).",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 64),
    default=_D.replicas,
    show_default=True,
    help="Stateless scheduler replicas (each its own client, as its own process would be).",
)
@click.option(
    "--gateways",
    type=click.IntRange(0, 256),
    default=_D.gateways,
    help="Concurrent gateway workers [default: 2 per replica].",
)
@click.option("--creates", type=click.IntRange(0, 1_000_000), default=_D.creates, show_default=True)
@click.option(
    "--rate",
    type=click.FloatRange(0),
    default=_D.rate,
    show_default=True,
    help="Creates per second over all gateways (0: as fast as they go).",
)
@click.option(
    "--cpu",
    type=click.IntRange(0, 4096),
    default=_D.cpu,
    show_default=True,
    help="CPUs per sandbox.",
)
@click.option(
    "--memory-mb",
    type=click.IntRange(0),
    default=_D.memory_mb,
    show_default=True,
    help="Memory per sandbox (MiB).",
)
@click.option("--strategy", type=click.Choice(STRATEGIES), default=_D.strategy, show_default=True)
@click.option(
    "--max-sandbox-count",
    type=click.IntRange(0),
    default=_D.max_sandbox_count,
    show_default=True,
    help="The ceiling to hold (0: none).",
)
@click.option(
    "--heartbeat-interval",
    type=click.FloatRange(0.01, 60),
    default=_D.heartbeat_interval,
    show_default=True,
    help="Seconds.",
)
@click.option(
    "--heartbeat-lag",
    type=click.FloatRange(0, 60),
    default=_D.heartbeat_lag,
    show_default=True,
    help="Up to this many seconds between snapshot and delivery.",
)
@click.option(
    "--create-delay",
    type=click.FloatRange(0, 60),
    default=_D.create_delay,
    show_default=True,
    help="Up to this many seconds for a node to create a sandbox.",
)
@click.option(
    "--lifetime",
    type=click.FloatRange(0),
    default=_D.sandbox_lifetime,
    show_default=True,
    help="Seconds a sandbox lives (0: it stays).",
)
@click.option(
    "--fail-rate",
    type=click.FloatRange(0, 1),
    default=_D.create_fail_rate,
    show_default=True,
    help="Fraction of creates the node fails.",
)
@click.option(
    "--roster/--no-roster",
    default=_D.roster,
    show_default=True,
    help="Nodes send their sandbox roster (else counter mode).",
)
@click.option("--seed", type=int, default=_D.seed, show_default=True)
@click.option("--reset", is_flag=True, help="Wipe the cell first if it holds state.")
@pass_target
def simulate(
    target: Target,
    nodes: int,
    node_shapes: str,
    replicas: int,
    gateways: int,
    creates: int,
    rate: float,
    cpu: int,
    memory_mb: int,
    strategy: str,
    max_sandbox_count: int,
    heartbeat_interval: float,
    heartbeat_lag: float,
    create_delay: float,
    lifetime: float,
    fail_rate: float,
    roster: bool,
    seed: int,
    reset: bool,
) -> None:
    """Run a simulated fleet against the scheduler and show that the ceiling holds.

    Nodes heartbeat with lag through the replicas, gateway workers place
    sandboxes through them, and nodes take a while to create each one.  Ends
    with the node table and a summary: placed, refused (with the reasons),
    the highest count any node really ran against its ceiling, peak pressure.
    Runs on the embedded store unless --redis is given (its first line on
    stderr says which).  Exit status 1 when
    the ceiling broke or a request failed for another reason than a refusal.
    """
    try:
        shapes = engine.parse_shapes(node_shapes)
    except InvalidArgument as e:
        raise click.BadParameter(e.message, param_hint="'--node-shapes'") from None
    scenario = engine.Scenario(
        nodes=nodes,
        node_shapes=shapes,
        replicas=replicas,
        gateways=gateways,
        creates=creates,
        rate=rate,
        cpu=cpu,
        memory_mb=memory_mb,
        strategy=strategy,
        max_sandbox_count=max_sandbox_count,
        heartbeat_interval=heartbeat_interval,
        heartbeat_lag=heartbeat_lag,
        create_delay=create_delay,
        sandbox_lifetime=lifetime,
        create_fail_rate=fail_rate,
        roster=roster,
        seed=seed,
    ).validate()
    out = target.out
    url = target.url
    out.note(
        f"simulate: on {describe_target(url)}, cell {target.cell}"
        + ("" if url else " (no --redis given; other processes cannot see it)")
    )
    progress = Progress(
        TextColumn("creates"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tally]}"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=True,
        disable=not console(stderr=True).is_terminal,
    )
    task = progress.add_task("creates", total=creates, tally="")
    on_terminal = console(stderr=True).is_terminal
    started = last_line = time.monotonic()

    def advance(done: int, placed: int, refused: int) -> None:
        nonlocal last_line
        progress.update(task, completed=done, tally=f"placed {placed} refused {refused}")
        now = time.monotonic()
        if not on_terminal and now - last_line >= PROGRESS_EVERY_S:
            with lock:
                if now - last_line < PROGRESS_EVERY_S:
                    return
                last_line = now
                out.note(
                    f"simulate: {done}/{creates} creates, placed {placed}, refused {refused} "
                    f"({now - started:.0f}s)"
                )

    lock = threading.Lock()
    try:
        with progress:
            result = engine.run(scenario, url, target.cell, reset=reset, on_progress=advance)
    except FailedPrecondition as e:  # (the engine names its Python parameter too)
        raise Failure(e.message.replace(" (reset=True)", "")) from None
    header = (
        f"simulated {nodes} nodes ({node_shapes}), {replicas} replicas, "
        f"{scenario.gateway_workers} gateway workers: {creates} creates of {cpu} cpu / "
        f"{memory_mb} MiB, max_sandbox_count {max_sandbox_count or 'none'}, "
        f"strategy {strategy}"
    )
    out.emit(
        result,
        lambda: Group(
            header,
            compact_table(result.final_view, scenario.policy(), target.where, console().width),
            summary_table(result),
        ),
    )
    if not out.json and url:
        out.note(
            f"the cell is kept: schedctl nodes --redis {describe_target(url)} --cell {target.cell}"
        )
    if not result.ceiling_held:
        raise Failure(
            f"ceiling broken: a node ran {result.max_node_count} sandboxes, "
            f"max_sandbox_count is {result.ceiling}"
        )
    if result.errors:
        raise Failure(f"{sum(result.errors.values())} requests failed: " + "; ".join(result.errors))
