"""Charts for ``--plot``.  matplotlib comes with the optional ``bench`` extra
and is imported here only, when a chart is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.runner import Result


def require() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit('--plot needs matplotlib: pip install -e ".[bench]"') from None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def draw(result: Result, path: str | Path) -> None:
    if result.scenario == "latency":
        _latency(result, path)
    elif result.scenario == "ceiling":
        _ceiling(result, path)
    elif result.scenario == "locality":
        _locality(result, path)
    else:
        raise ValueError(f"no chart for scenario {result.scenario!r}")


def _latency(result: Result, path: str | Path) -> None:
    plt = _pyplot()
    rows = sorted(result.rows, key=lambda r: r["nodes"])
    x = [r["nodes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (
        ("schedule_p99_us", "Schedule p99 (client)", "o-"),
        ("schedule_p50_us", "Schedule p50 (client)", "o-"),
        ("redis_us_per_schedule", "Redis CPU per Schedule (one client)", "s--"),
        ("redis_us_per_schedule_busy", "Redis CPU per Schedule (Redis busy)", "s-."),
        ("redis_us_floor_busy", "bare reservation writes (Redis busy)", "x:"),
        ("redis_us_per_heartbeat", "Redis CPU per changed Heartbeat", "d--"),
        ("redis_us_per_steady_heartbeat", "Redis CPU per steady Heartbeat", "d-."),
        ("ping_p50_us", "PING p50 (client, same run)", "^:"),
    ):
        if any(r.get(key) is None for r in rows):
            continue  # e.g. no floor on a server without functions
        ax.plot(x, [r[key] for r in rows], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes in the fleet")
    ax.set_ylabel("microseconds")
    ax.set_title("Schedule latency and Redis CPU by fleet size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _footer(fig, result)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _ceiling(result: Result, path: str | Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharey=True)
    limit = result.rows[0]["limit"] if result.rows else 0
    for ax, paced in zip(axes, (False, True), strict=True):
        rows = [r for r in result.rows if r["paced"] == paced]
        replicas = sorted({r["replicas"] for r in rows})
        width = 0.38
        for k, (system, color) in enumerate((("ours", "tab:blue"), ("reference-model", "tab:red"))):
            by_r = {r["replicas"]: r["max_node_sandboxes"] for r in rows if r["system"] == system}
            xs = [i + (k - 0.5) * width for i in range(len(replicas))]
            ax.bar(xs, [by_r.get(r, 0) for r in replicas], width, label=system, color=color)
        ax.axhline(
            limit, color="black", linestyle="--", linewidth=1, label=f"max_sandbox_count {limit}"
        )
        ax.set_xticks(range(len(replicas)), [str(r) for r in replicas])
        ax.set_xlabel("replicas")
        ax.set_title("paced, lagging heartbeats" if paced else "full speed")
    axes[0].set_ylabel("most sandboxes on one node")
    axes[0].legend(fontsize=8)
    _footer(fig, result)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _locality(result: Result, path: str | Path) -> None:
    """Four panels, one bar per strategy of the replay (at the run's replica
    count): warm starts, GiB pulled, peak pressure, Redis time per decision."""
    plt = _pyplot()
    replicas = result.params.get("replicas")
    nodes = result.params.get("nodes_per_shape", 0) * len(result.params.get("node_cpus", ()))
    rows = [
        r
        for r in result.rows
        if "placed" in r and r.get("replicas") == replicas and r.get("nodes") == nodes
    ]
    labels = [r["strategy"] + (f"\n{r['setting']}" if r.get("setting") else "") for r in rows]
    colors = ["tab:blue" if r["strategy"] == "ours" else "tab:gray" for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(
        axes.flat,
        (
            ("warm_pct", "warm starts (%)"),
            ("gib_pulled", "GiB pulled"),
            ("peak_pressure", "peak pressure"),
            ("redis_us_per_decision", "Redis us per decision"),
        ),
        strict=True,
    ):
        ax.bar(range(len(rows)), [r[key] for r in rows], color=colors)
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30, ha="right")
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"locality replay: the same arrivals, {replicas} replicas")
    fig.tight_layout()
    _footer(fig, result)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _footer(fig: Any, result: Result) -> None:
    m = result.machine
    if m:
        fig.text(
            0.01,
            -0.02,
            f"{m['nproc']} CPU {m['cpu_model']}, redis {m['redis_version']}, {m['date']}",
            fontsize=7,
            color="gray",
        )
