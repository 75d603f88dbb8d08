"""Functions run in separate OS processes by the concurrency tests (each
process opens its own connection)."""

from __future__ import annotations

from multiprocessing.synchronize import Event

from scheduler import NoNodesAvailable, Request, Scheduler


def schedule_many(url: str, cell: str, count: int, cpu: int, memory_mb: int,
                  start: Event) -> list[tuple[str | None, str]]:
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
