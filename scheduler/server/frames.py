"""A request frame that is not the protobuf message its method takes is
INVALID_ARGUMENT naming the method, with a rate-limited log line; before,
gRPC answered UNKNOWN and logged a traceback for each one.

gRPC deserializes a request before any servicer code runs, so the guard sits
in the method handlers: :func:`add_guarded` registers a servicer through its
generated ``add_<Service>Servicer_to_server`` with every unary-unary handler's
deserializer wrapped (a frame that does not decode becomes a
:class:`Malformed` value instead of an exception) and its behaviour answering
such a value with INVALID_ARGUMENT.  A behaviour may also answer with the
response already serialized (``bytes``), which goes out as it is
(ListP2pPeers: scheduler/server/peers.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger("scheduler.server.service")

#: at most one log line per method in this many seconds (the rest are counted)
LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class Malformed:
    """What a frame that does not decode deserializes to."""

    why: str
    size: int


class _Limiter:
    """One log line per method per LOG_EVERY_S; says how many it held back."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self.lock = threading.Lock()
        self.last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def __call__(self, method: str, bad: Malformed) -> None:
        now = time.monotonic()
        with self.lock:
            if now - self.last.get(method, -self.every_s) < self.every_s:
                self.held[method] = self.held.get(method, 0) + 1
                return
            self.last[method] = now
            held = self.held.pop(method, 0)
        more = f" ({held} more since the last line)" if held else ""
        log.warning(
            "%s: refused a malformed request of %d bytes (%s)%s", method, bad.size, bad.why, more
        )


def _guard(method: str, handler: Any, limit: _Limiter) -> Any:
    if handler.request_streaming or handler.response_streaming or handler.unary_unary is None:
        return handler
    decode: Callable[[bytes], Any] = handler.request_deserializer
    inner = handler.unary_unary

    def deserialize(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as e:  # (protobuf's DecodeError, and whatever a decoder raises)
            return Malformed(why=str(e) or type(e).__name__, size=len(data))

    async def behaviour(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Malformed):
            limit(method, request)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{method}: the request is not a valid protobuf message ({request.why})",
            )
        return await inner(request, context)

    encode: Callable[[Any], bytes] = handler.response_serializer

    def serialize(response: Any) -> bytes:
        return response if isinstance(response, bytes) else encode(response)

    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=deserialize, response_serializer=serialize
    )


class _Registering:
    """The server as a generated ``add_..._to_server`` sees it: takes the
    method handlers, registers them guarded on the real server."""

    def __init__(self, server: grpc.aio.Server, limit: _Limiter) -> None:
        self.server = server
        self.limit = limit
        self.registered = False

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # (the same handlers come to add_registered_method_handlers: guarded there)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        guarded = {name: _guard(name, h, self.limit) for name, h in handlers.items()}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, guarded),)
        )
        self.server.add_registered_method_handlers(service, guarded)
        self.registered = True


def add_guarded(add: Callable[[Any, Any], None], servicer: Any, server: grpc.aio.Server) -> None:
    """``add(servicer, server)`` (a generated ``add_<Service>Servicer_to_server``)
    with every unary-unary method's request guarded."""
    proxy = _Registering(server, _Limiter())
    add(servicer, proxy)
    if not proxy.registered:  # (a generated module of another shape)
        raise RuntimeError(f"{add.__name__} registered no method handlers")


# -- answers within what a default client accepts -----------------------------
#: gRPC's default receive limit: what the reference gateway's client takes
CLIENT_MAX_BYTES = 4 * 1024 * 1024
#: what an answer may fill of it (room for the status, trailers and framing)
ANSWER_BUDGET = CLIENT_MAX_BYTES - 64 * 1024
#: trailing metadata saying what a bounded answer left out
STRIPPED_METADATA = "x-observed-stripped"
OMITTED_METADATA = "x-observed-omitted"


def _entry_bytes(n: Any) -> int:
    size = int(n.ByteSize())
    return size + 1 + len(_varint(size))  # (its tag and length in the list)


def _varint(x: int) -> bytes:
    out = bytearray()
    while True:
        out.append((x & 0x7F) | (0x80 if x > 0x7F else 0))
        x >>= 7
        if not x:
            return bytes(out)


def fit_observed(nodes: list[Any], budget: int = ANSWER_BUDGET) -> tuple[int, int]:
    """Bound a ListObservedNodes answer (``ObservedNode`` messages, changed in
    place) to ``budget`` bytes: first each entry's ``machine_info.cpu_config_json``
    is left out, largest first, then its ``snapshot.disks``, until it fits;
    only if the bare entries still do not fit are the last ones left out.
    Returns (entries stripped, entries left out).  GetNode answers one node
    whole."""
    sizes = [_entry_bytes(n) for n in nodes]
    total = sum(sizes)
    stripped: set[int] = set()
    for strip in ("cpu_config_json", "disks"):
        if total <= budget:
            break
        order = sorted(range(len(nodes)), key=lambda i: -sizes[i])
        for i in order:
            if total <= budget:
                break
            n = nodes[i]
            if strip == "cpu_config_json" and n.machine_info.cpu_config_json:
                n.machine_info.cpu_config_json = ""
            elif strip == "disks" and len(n.snapshot.disks):
                del n.snapshot.disks[:]
            else:
                continue
            stripped.add(i)
            new = _entry_bytes(n)
            total += new - sizes[i]
            sizes[i] = new
    omitted = 0
    while total > budget and nodes:
        total -= sizes.pop()
        nodes.pop()
        stripped.discard(len(nodes))
        omitted += 1
    return len(stripped), omitted
