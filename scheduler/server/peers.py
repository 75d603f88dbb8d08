"""ListP2pPeers answered from a list the replica read a moment ago.

Every node with a P2P endpoint asks for its cluster's peers every few seconds
(the reference runtime's discovery: every 5 s), and each answer is the whole
cluster, read from Redis: one read of every member, so a cluster of N nodes
cost Redis O(N) per call and O(N^2 / 5 s) in all (30 ms a call at 1,000
members, 300 ms at 10,000, before this cache and the leaner read).  A
replica now reads one (cluster, backend)'s list at most once per
:data:`PEERS_FRESH_S`, or per :data:`PEERS_READ_TIMES` times what its last
read took if that is longer, and answers every request for it meanwhile
from that list, each without its own node (``exclude_node_id``).  Requests that find
no fresh list wait for the one read under way: one read at a time per key,
in a task and a context of its own (no caller's deadline bounds it), so a
caller that gives up cancels only its own wait.

A peer is a hint (the runtime falls back to its other sources), so a list a
second old (a few seconds for a cluster of many thousands) is what the
reference's own 5 s refresh already tolerates: a node that stopped being
READY is listed for at most that much longer.

Each list is also kept serialized, one part per peer (a ListP2pPeersResponse
is its peers' parts one after another), so an answer is the parts joined
without the asking node's: 45 us of the replica's CPU for 1,000 peers,
against 1.7 ms to build and serialize the message (a cluster of 1,000 P2P
nodes sends 200 of these a second).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from scheduler.client.aio import AsyncScheduler
from scheduler.client.plans import Observer
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.store.p2p import Peer

#: how long a read list answers requests (s), at least
PEERS_FRESH_S = 1.0
#: ... and at least this many times as long as it took to read: a replica
#: spends at most 1/20 of its time reading one list, whatever the cluster's
#: size (the reference's default config puts every node in one cluster, so
#: a cluster is the fleet: 10,000 members took 100-123 ms a read)
PEERS_READ_TIMES = 20.0
#: (cluster, backend) lists kept at most, the least recently read dropped first
PEERS_KEPT = 1024
#: how long one read may take (s): no caller's deadline bounds it, and while
#: it is under way every request for its list waits on it (the reference
#: runtime gives its ListP2pPeers 10 s)
PEERS_READ_S = 10.0

Key = tuple[str, str]


def protos(peers: Sequence[Peer]) -> list[pb.P2pPeer]:
    """Peers as the wire's P2pPeer (ListP2pPeers, LookupP2pArtifact)."""
    return [
        pb.P2pPeer(node_id=p.node_id, endpoint=pb.P2pEndpoint(backend=p.backend, address=p.address))
        for p in peers
    ]


class Listed:
    """One list as read: its peers, and each one's part of an answer."""

    __slots__ = ("fresh_until", "peers", "parts")

    def __init__(self, fresh_until: float, peers: list[Peer]) -> None:
        #: when the list is read again (by the next request after it)
        self.fresh_until = fresh_until
        self.peers = peers
        self.parts = [pb.ListP2pPeersResponse(peers=[m]).SerializeToString() for m in protos(peers)]


class PeerLists:
    def __init__(
        self,
        sched: AsyncScheduler,
        fresh_s: float = PEERS_FRESH_S,
        kept: int = PEERS_KEPT,
        clock: Callable[[], float] = time.monotonic,
        observe: Observer | None = None,
    ) -> None:
        self.sched = sched
        #: told of the read's Redis calls (the replica's metrics)
        self.observe = observe
        self.fresh_s = fresh_s
        self.kept = kept
        self.clock = clock
        self._lists: OrderedDict[Key, Listed] = OrderedDict()
        self._reading: dict[Key, asyncio.Task[Listed]] = {}

    async def peers(self, cluster_id: str, backend: str, exclude_node_id: str) -> list[Peer]:
        """As :meth:`AsyncScheduler.peers`, from a list at most ``fresh_s``
        old (bad input is refused as there, before anything is read)."""
        listed, exclude = await self._listed(cluster_id, backend, exclude_node_id)
        return [p for p in listed.peers if p.node_id != exclude]

    async def answer(self, cluster_id: str, backend: str, exclude_node_id: str) -> bytes:
        """:meth:`peers` as a serialized ListP2pPeersResponse."""
        listed, exclude = await self._listed(cluster_id, backend, exclude_node_id)
        if not exclude:
            return b"".join(listed.parts)
        return b"".join(
            part for p, part in zip(listed.peers, listed.parts, strict=True) if p.node_id != exclude
        )

    async def _listed(
        self, cluster_id: str, backend: str, exclude_node_id: str
    ) -> tuple[Listed, str]:
        cluster, backend, exclude = self.sched.peer_ops.filters(
            cluster_id, backend, exclude_node_id
        )
        key = (cluster, backend)
        listed = self._lists.get(key)
        if listed is None or self.clock() >= listed.fresh_until:
            reading = self._reading.get(key)
            if reading is None:
                # (in a context of its own: no caller's deadline or scope)
                reading = asyncio.get_running_loop().create_task(
                    self._read(key), context=contextvars.Context()
                )
                self._reading[key] = reading
                reading.add_done_callback(functools.partial(self._read_done, key))
            listed = await asyncio.shield(reading)
        return listed, exclude

    async def _read(self, key: Key) -> Listed:
        started = self.clock()
        with self.sched.scoped(timeout=PEERS_READ_S, observe=self.observe):
            peers = await self.sched.peers(key[0], key[1], "")
        took = self.clock() - started
        listed = Listed(started + max(self.fresh_s, PEERS_READ_TIMES * took), peers)
        self._lists[key] = listed
        self._lists.move_to_end(key)
        while len(self._lists) > self.kept:
            self._lists.popitem(last=False)
        return listed

    def _read_done(self, key: Key, task: asyncio.Task[Listed]) -> None:
        if self._reading.get(key) is task:
            del self._reading[key]
        if not task.cancelled():
            task.exception()  # (retrieved: the waiters, if any, raise it)
