"""P2P peers and the artifact index (ListP2pPeers, Record / Forget / Lookup
P2pArtifact), kept in Redis so every replica answers the same.

An artifact is named by (cluster, backend, key); its index entry is the sha1
of ``cluster\\nbackend\\nkey`` (scheduler/store/keys.py: art:<digest>, node-art:<node>,
art-lru, art-names).  :class:`PeerOps` builds the calls; the clients run
them (``peers``, ``record_artifact``, ``forget_artifact``, ``lookup_artifact``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from scheduler.domain.errors import InvalidArgument
from scheduler.domain.policy import MAX_ARTIFACT_KEY_BYTES, Policy
from scheduler.store import contracts as c
from scheduler.store.calls import Call, Page
from scheduler.store.contracts import head, whole_reply
from scheduler.store.keys import CellKeys, validate_id
from scheduler.store.replies import s

DEFAULT_STORE_CAPACITY = 1_000_000
MAX_KEY = MAX_ARTIFACT_KEY_BYTES
MAX_BACKEND = 256


class Peer(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    backend: str
    address: str


def _peers(r: list[Any]) -> Page[Peer]:
    a, rows = head(c.PeersReply, r)
    return s(a.next), _peer_rows(rows)


def _holders(r: list[Any]) -> list[str]:
    """The holders' ids, in node-id byte order."""
    _, ids = head(c.HoldersReply, r)
    return sorted(s(x) for x in ids)


def _peer_rows(rows: list[Any]) -> list[Peer]:
    return [
        Peer(node_id=s(p.node_id), backend=s(p.backend), address=s(p.address))
        for p in (whole_reply(c.PeerRow, row) for row in rows)
    ]


def _name_part(field: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise InvalidArgument(field, f"is longer than {limit} characters")
    if "\n" in value or "\r" in value:
        raise InvalidArgument(field, "contains a line break")
    return value


def artifact_digest(cluster_id: str, backend: str, key: str) -> str:
    return hashlib.sha1(f"{cluster_id}\n{backend}\n{key}".encode()).hexdigest()


def key_digest(key: str) -> str:
    """The sha1 of an artifact key alone: how a Schedule's locality
    requirement finds the key's index entries in every cluster and backend
    (art-key:<this>, lua/includes/art_keys.lua)."""
    return hashlib.sha1(key.encode()).hexdigest()


class PeerOps:
    """``bounds``: the cell's policy as the caller knows it (artifact_key_max_bytes)."""

    def __init__(self, keys: CellKeys, bounds: Callable[[], Policy] = Policy) -> None:
        self.k = keys
        self.bounds = bounds

    def _artifact(self, cluster_id: str, backend: str, key: str) -> tuple[str, str, str]:
        cluster = validate_id("cluster_id", cluster_id)
        backend = _name_part("backend", backend.strip(), MAX_BACKEND)
        key = _name_part("key", key.strip(), MAX_KEY)
        limit = self.bounds().artifact_key_max_bytes
        if len(key.encode()) > limit:
            raise InvalidArgument("key", f"is longer than {limit} bytes (artifact_key_max_bytes)")
        return artifact_digest(cluster, backend, key), f"{cluster}\n{backend}\n{key}", cluster

    def _art_keys(self) -> list[str]:
        return [*self.k.fixed(), self.k.art_lru, self.k.art_names]

    def filters(self, cluster_id: str, backend: str, exclude_node_id: str) -> tuple[str, str, str]:
        """A peer list's filters as a call sends them ("" = any, none), or
        InvalidArgument naming the field."""
        cluster = validate_id("cluster_id", cluster_id) if cluster_id.strip() else ""
        exclude = validate_id("exclude_node_id", exclude_node_id) if exclude_node_id.strip() else ""
        return cluster, _name_part("backend", backend.strip(), MAX_BACKEND), exclude

    def peers(
        self,
        cluster_id: str,
        backend: str,
        exclude_node_id: str,
        after: str = "",
        page: int = 0,
        ids: Sequence[str] = (),
    ) -> Call[Page[Peer]]:
        """Those of ``ids`` that are peers (a page of :meth:`members`, in its
        order); or else one page of the cell's nodes that are: at most
        ``page`` nodes after node id ``after`` (0: every node in one call), in
        node-id order, and the next page's ``after`` ("" after the last)."""
        cluster, backend, exclude = self.filters(cluster_id, backend, exclude_node_id)
        argv = c.PeerListArgv(
            cluster_id=cluster,
            backend=backend,
            exclude=exclude,
            after=after,
            page=str(page) if page else "",
            ids=list(ids),
        )
        return Call.of("peer_list", self.k.fixed(), argv, _peers)

    def members(self, cluster_id: str) -> Call[list[str]]:
        """The ids of a cluster's P2P member set, in node-id byte order (as
        UTF-8 keeps code point order)."""
        argv = c.PeerMembersArgv(cluster_id=validate_id("cluster_id", cluster_id))
        return Call.of(
            "peer_members", self.k.fixed(), argv, lambda r: sorted(s(x) for x in r), writes=False
        )

    def record(
        self,
        cluster_id: str,
        backend: str,
        key: str,
        node_id: str,
        capacity: int = DEFAULT_STORE_CAPACITY,
    ) -> Call[int]:
        if not (cluster_id.strip() and backend.strip() and key.strip() and node_id.strip()):
            raise InvalidArgument("", "cluster_id, backend, key, and node_id are required")
        digest, name, _ = self._artifact(cluster_id, backend, key)
        node = validate_id("node_id", node_id)
        if capacity < 1:
            raise InvalidArgument("artifact_store_capacity", "must be at least 1")
        argv = c.ArtifactRecordArgv(
            digest=digest,
            name=name,
            node_id=node,
            capacity=str(capacity),
            # (the key's own sha1: the locality index by key, lua/includes/art_keys.lua)
            key_sha1=key_digest(name.split("\n", 2)[2]),
        )
        return Call.of(
            "artifact_record",
            self._art_keys(),
            argv,
            lambda r: int(whole_reply(c.ArtifactRecordReply, r).evicted),
        )

    def forget(self, cluster_id: str, backend: str, key: str, node_id: str) -> Call[bool]:
        if not (cluster_id.strip() and backend.strip() and key.strip() and node_id.strip()):
            raise InvalidArgument("", "cluster_id, backend, key, and node_id are required")
        digest, _, _ = self._artifact(cluster_id, backend, key)
        node = validate_id("node_id", node_id)
        return Call.of(
            "artifact_forget",
            self._art_keys(),
            c.ArtifactForgetArgv(digest=digest, node_id=node),
            lambda r: whole_reply(c.ArtifactForgetReply, r).held == 1,
        )

    def lookup(
        self, cluster_id: str, backend: str, key: str, exclude_node_id: str = ""
    ) -> Call[list[str]]:
        """The artifact's holders' ids, sorted (its recency refreshed): the
        first step of a lookup, whose rows are :meth:`peers` with the ids."""
        if not (cluster_id.strip() and backend.strip() and key.strip()):
            raise InvalidArgument("", "cluster_id, backend, and key are required")
        digest, _, _ = self._artifact(cluster_id, backend, key)
        self.filters(cluster_id, backend, exclude_node_id)  # (refused before any write)
        argv = c.ArtifactLookupArgv(digest=digest)
        return Call.of("artifact_lookup", self._art_keys(), argv, _holders)
