"""Functions run in separate OS processes by the concurrency tests (each
process opens its own connection)."""

from __future__ import annotations

from multiprocessing.synchronize import Event

from scheduler import NoNodesAvailable, Request, Scheduler


def schedule_many(
    url: str, cell: str, count: int, cpu: int, memory_mb: int, start: Event
) -> list[tuple[str | None, str]]:
    """``count`` creations; each result is (node_id, reservation_id) or (None, refusal)."""
    s = Scheduler.connect(url, cell=cell)
    start.wait(30)
    out: list[tuple[str | None, str]] = []
    try:
        for _ in range(count):
            try:
                p = s.schedule(Request.cold(cpu, memory_mb))
                out.append((p.node_id, p.reservation_id or ""))
            except NoNodesAvailable as e:
                out.append((None, str(e)))
    finally:
        s.close()
    return out


def paced_gateway(
    url: str,
    cell: str,
    count: int,
    pause: float,
    created: list[tuple[str, str, float]],
    start: Event,
) -> int:
    """A gateway that creates one sandbox per batch: schedule, create on the
    node (recorded in ``created`` with its time), record the assignment."""
    import os
    import time

    s = Scheduler.connect(url, cell=cell)
    start.wait(30)
    placed = 0
    try:
        for i in range(count):
            try:
                p = s.schedule(Request.cold(2, 4096))
            except NoNodesAvailable:
                time.sleep(pause)
                continue
            sb = f"sb-{os.getpid()}-{i}"
            created.append((p.node_id, sb, time.time()))
            s.assign(sb, p.node_id, p.endpoint, p.reservation_id)
            placed += 1
            time.sleep(pause)
    finally:
        s.close()
    return placed


def schedule_then_die(url: str, cell: str) -> None:
    """A caller that gets its placement and dies before creating anything."""
    import os

    s = Scheduler.connect(url, cell=cell)
    s.schedule(Request.cold(1, 0))
    os._exit(0)
