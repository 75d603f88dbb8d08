"""``schedctl reservations`` (list, show, cancel) and ``schedctl bindings lookup``."""

from __future__ import annotations

import re

import click
import msgspec
from rich.console import Group
from rich.table import Table
from rich.text import Text

from scheduler.domain.errors import FailedPrecondition, NotFound
from scheduler.domain.records import Binding, Reservation
from scheduler.store.calls import Call
from scheduler.store.contracts import LookupReply, whole_reply
from scheduler.store.keys import validate_id
from scheduler.store.translate import translated

from .completion import node_ids, reservation_ids
from .options import Failure, Target, cell_options, pass_target
from .output import age, duration_text, size
from .snapshot import atomically


class ReservationView(msgspec.Struct, kw_only=True):
    """A reservation as the CLI shows it: the record, its key and the cell's clock."""

    reservation: Reservation
    key: str
    now_ms: int


def _expires(r: Reservation, now: int) -> str:
    if r.ended_ms is not None:
        return age(now - r.ended_ms)
    return f"in {duration_text(max(0, r.expires_ms - now))}"


def _record(title: str, rows: list[tuple[str, str]], key: str) -> Group:
    """A record as a two-column table, with the redis-cli command that reads it."""
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        table.add_row(k, v)
    return Group(table, Text(f"redis-cli HGETALL '{key}'", style="dim"))


def reservations_table(found: list[Reservation], now: int, where: str) -> Table:
    table = Table(
        title=f"live reservations of {where}",
        title_justify="left",
        caption=f"{len(found)} live",
        caption_justify="left",
    )
    for col in (
        "reservation",
        "node",
        "state",
        "cpu",
        "memory",
        "sandbox",
        "age",
        "expires",
        "pressure at placement",
    ):
        table.add_column(col, justify="right" if col in ("cpu", "memory", "age") else "left")
    for r in found:
        table.add_row(
            r.reservation_id,
            r.node_id,
            r.state,
            str(r.cpu),
            size(r.memory_bytes),
            r.sandbox_id or "-",
            age(now - r.created_ms),
            _expires(r, now),
            "-" if r.pressure is None else f"{r.pressure:.3f}",
        )
    return table


@click.group(invoke_without_command=True)
@cell_options()
@click.option(
    "--node",
    "node_id",
    metavar="NODE",
    shell_complete=node_ids,
    help="Only this node's reservations.",
)
@click.pass_context
def reservations(ctx: click.Context, node_id: str | None) -> None:
    """Pending placements: list them (default), show or cancel one."""
    if ctx.invoked_subcommand is None:
        target = ctx.ensure_object(Target)
        s = target.scheduler
        if node_id:
            # (one node's: its view says whether it is known, at the same instant)
            found, (now, views) = atomically(
                s, s.ops.reservations(node_id), s.ops.nodes(node_id.strip())
            )
        else:
            # (the cell's, page by page; then one node's page for the clock:
            # nothing reads the whole fleet in one call)
            found = s.reservations()
            now, views = s.run(s.ops.nodes(page=1))
        if node_id and node_id.strip() not in {v.node_id for v in views}:
            raise NotFound(f"node {node_id.strip()} is not known in {target.where}")
        target.out.emit(found, lambda: reservations_table(found, now, target.where))


def _show_table(view: ReservationView) -> Group:
    r, now = view.reservation, view.now_ms
    return _record(
        f"reservation {r.reservation_id}",
        [
            ("node", r.node_id),
            ("state", r.state),
            ("cpu", str(r.cpu)),
            ("memory", f"{size(r.memory_bytes)} ({r.memory_bytes} B)"),
            ("sandbox", r.sandbox_id or "- (not assigned yet)"),
            ("created", age(now - r.created_ms)),
            ("ended" if r.ended_ms is not None else "expires", _expires(r, now)),
            ("pressure at placement", "-" if r.pressure is None else f"{r.pressure:.4f}"),
        ],
        view.key,
    )


@reservations.command()
@cell_options()
@click.argument("reservation_id", metavar="ID", shell_complete=reservation_ids)
@pass_target
def show(target: Target, reservation_id: str) -> None:
    """One reservation, live or ended (ended ones stay readable for the policy's
    reservation_tombstone_ttl, 10 minutes by default)."""
    s = target.scheduler
    found, (now, _) = atomically(s, s.ops.reservations(None, reservation_id), s.ops.nodes(page=1))
    if not found:
        raise NotFound(f"reservation {reservation_id.strip()} not found in {target.where}")
    view = ReservationView(
        reservation=found[0], key=s.keys.res(found[0].reservation_id), now_ms=now
    )
    target.out.emit(view, lambda: _show_table(view))


class Cancelled(msgspec.Struct, kw_only=True):
    reservation_id: str
    node_id: str
    #: "cancelled" now, or "already cancelled" / "already released" /
    #: "already expired" (it held nothing any more), or "not found"
    #: (with --ignore-not-found)
    state: str = "cancelled"


_ALREADY = re.compile(r"reservation (?P<id>\S+) already (?P<state>released|cancelled|expired)$")


@reservations.command()
@cell_options()
@click.argument("reservation_id", metavar="ID", shell_complete=reservation_ids)
@click.option(
    "--ignore-not-found",
    is_flag=True,
    help="Exit 0 when the cell does not know the reservation (its tombstone is gone too).",
)
@pass_target
def cancel(target: Target, reservation_id: str, ignore_not_found: bool) -> None:
    """Give a reservation back now (its create failed), instead of waiting for its TTL.

    Idempotent: a reservation that already ended (cancelled, released or
    expired) holds nothing; that exits 0 and says how it ended."""
    s = target.scheduler
    rid = reservation_id.strip()
    try:
        done = Cancelled(reservation_id=rid, node_id=s.cancel(reservation_id))
    except FailedPrecondition as e:
        m = _ALREADY.match(e.message)
        if m is None:
            raise
        ended = s.reservation(rid)
        done = Cancelled(reservation_id=rid, node_id=ended.node_id, state=f"already {ended.state}")
    except NotFound:
        if not ignore_not_found:
            raise
        done = Cancelled(reservation_id=rid, node_id="", state="not found")

    def render() -> str:
        if done.state == "cancelled":
            return (
                f"cancelled reservation {rid} on node {done.node_id}: "
                "its cpu, memory and slot are free again"
            )
        if done.state == "not found":
            return f"reservation {rid} not found in {target.where} (nothing to cancel)"
        return f"reservation {rid} on node {done.node_id} was {done.state}: it holds nothing"

    target.out.emit(done, render)


@click.group()
@cell_options()
def bindings() -> None:
    """Sandbox -> node bindings (what LookupNode answers)."""


class BindingView(msgspec.Struct, kw_only=True):
    binding: Binding
    key: str
    now_ms: int


@bindings.command()
@cell_options()
@click.argument("sandbox_id", metavar="SANDBOX")
@pass_target
def lookup(target: Target, sandbox_id: str) -> None:
    """The node a sandbox is bound to, as every replica would answer it."""
    s = target.scheduler
    call = s.ops.lookup(sandbox_id)
    # The script also returns the cell's clock; keep it for "expires in".
    try:
        with_now: Call[tuple[Binding, int]] = Call(
            call.script,
            call.keys,
            call.args,
            lambda r: (call.parse(r), int(whole_reply(LookupReply, r).now_ms)),
            argv=call.argv,
        )
        binding, now = s.run(with_now)
    except NotFound:
        raise _why_not_bound(target, validate_id("sandbox_id", sandbox_id)) from None
    view = BindingView(binding=binding, key=s.keys.bind(binding.sandbox_id), now_ms=now)

    target.out.emit(
        view,
        lambda: _record(
            f"sandbox {binding.sandbox_id}",
            [
                ("node", binding.node_id),
                ("endpoint", binding.endpoint),
                ("expires", f"in {duration_text(max(0, binding.expires_ms - now))}"),
                ("reservation", binding.reservation_id or "-"),
                ("listed by the node's roster", "yes" if binding.listed else "not yet"),
            ],
            view.key,
        ),
    )


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _why_not_bound(target: Target, sb: str) -> Failure:
    """LookupNode answers NOT_FOUND for a binding that is missing, deleted or
    expired; the record may still be in Redis (until its key's own TTL), so
    say which, with the node, its heartbeat and the binding's age."""
    s = target.scheduler
    key = s.keys.bind(sb)
    with translated(s.target):
        raw = {_text(k): _text(v) for k, v in s.client.hgetall(key).items()}
    if not raw.get("node_id"):
        return Failure(
            f"sandbox {sb} has no binding in {target.where} (never assigned, "
            "or its record is gone)",
            detail={"sandbox_id": sb, "state": "missing"},
        )
    node = raw["node_id"]
    (now, views), policy = atomically(s, s.ops.nodes(node), s.ops.policy())
    view = next((v for v in views if v.node_id == node), None)
    ttl = policy.binding_ttl_ms if policy else 0
    listed = raw.get("listed") == "1"
    expires = int(raw.get("expires_ms") or 0)
    if listed and view is not None and view.last_seen_ms is not None:
        expires = max(expires, view.last_seen_ms + ttl)
    heartbeat = (
        "not known to the cell any more"
        if view is None
        else f"{view.status}, last heartbeat {age(view.heartbeat_age_ms)}"
    )
    if raw.get("deleted") == "1":
        state, why = "deleted", "the node reported the sandbox deleted"
    elif listed:
        state = "expired"
        why = (
            f"the node's roster listed it, but no heartbeat came within binding_ttl "
            f"{duration_text(ttl)}"
        )
    else:
        state = "expired"
        why = f"no heartbeat of the node listed it within binding_ttl {duration_text(ttl)}"
    return Failure(
        f"sandbox {sb}: its binding to node {node} {state} {age(now - expires)} "
        f"(node {heartbeat}): {why}; LookupNode answers NOT_FOUND "
        f"(redis-cli HGETALL '{key}')",
        detail={
            "sandbox_id": sb,
            "state": state,
            "node_id": node,
            "expired_ms_ago": now - expires,
            "listed": listed,
            "node_status": view.status if view else None,
            "heartbeat_age_ms": view.heartbeat_age_ms if view else None,
            "key": key,
        },
    )
