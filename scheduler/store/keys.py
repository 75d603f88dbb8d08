"""The whole Redis key layout of a cell, on one screen.

Every key of a cell starts with ``<prefix>:{<cell>}:`` so all of them hash to
one Redis Cluster slot and one Lua script may touch any of them.  Fixed keys
have no further colon; typed keys are ``<type>:<id>`` with the id last.  Ids
are validated (:func:`validate_id`) and may not contain ``:``, ``{`` or ``}``,
so no id can name a fixed key, another type's key, or another cell.

    <base>policy              hash    shared policy (limits, overcommit, TTLs, strategy)
    <base>nodes               zset    ids of every known node, all scored 0 (byte order)
    <base>static              set     ids of the static (listed or discovered) nodes
    <base>stats               hash    counters: reserved/released/... totals, seq, probes, rewinds
    <base>rr                  string  round-robin rotation counter
    <base>rr-cursor           string  the node strategy round_robin chose last
    <base>expiry              zset    reservation id -> expiry time (ms, Redis time)
    <base>census              hash    node census: pass cursor, counts by status (lua/census-5.lua)
    <base>node:<node>         hash    node record: identity, latest snapshot, pending aggregates
    <base>node-res:<node>     zset    the node's pending reservation ids, by creation sequence
    <base>node-sbx:<node>     set     sandbox ids bound to the node that its roster does not list
    <base>node-roster:<node>  set     the node's last heartbeat roster (its listed bindings)
    <base>res:<reservation>   hash    reservation record (a tombstone once ended)
    <base>bind:<sandbox>      hash    sandbox -> node binding (expires with binding_ttl)
    <base>idx-shapes          set     node shapes ("C:M") present in the placement index
    <base>idx-cpu:<C>:<M>     zset    index buckets of one shape, scored by CPU load
    <base>idx-mem:<C>:<M>     zset    the same buckets, scored by memory load
    <base>idx-bucket:<bucket> zset    interchangeable nodes of one bucket, scored 0
    <base>idx-seen            zset    indexed node -> a recent heartbeat (ms), for the stale sweep
    <base>idx-rebuild         hash    the index rebuild's epoch and cursor (lua/index_rebuild-5.lua)
    <base>seen                zset    node -> a recent full heartbeat (ms), for the forget sweep
    <base>cpucfg:<cluster>    hash    per-cluster CPU config intersection bookkeeping
    <base>cpucfg-missing:<cluster> set  members of that round without a CPU config yet
    <base>cpucfg-configs:<cluster> hash  that round's configs by digest, and members of each
    <base>p2p:<cluster>       set     nodes of a cluster that advertise a P2P endpoint
    <base>art:<digest>        set     nodes holding one P2P artifact
    <base>node-art:<node>     set     artifact digests a node holds
    <base>art-lru             zset    artifact digest -> recency
    <base>art-names           hash    artifact digest -> "cluster\\nbackend\\nkey"
    <base>art-key:<digest>    set     sha1 of an artifact key -> its digests (any cluster, backend)
    <base>art-kd              hash    artifact digest -> the sha1 of its key (art-key's back link)
    <base>aff:<digest>        zset    sha1 of a template / first image -> node -> last start (ms)
    <base>node-loc:<node>     hash    sha1 of a template / first image -> the node's pending starts
    <base>replica:<replica>   hash    a replica serving the cell (version, host, pid; expires)
    <base>sync-pass           hash    a node-list sync pass under way (sync_begin-5.lua; expires)
    <base>sync-stage:<token>  set     that pass's listed ids not walked yet (expires)

The Lua scripts receive ``<base>`` as KEYS[1] and derive typed keys from it the
same way (see ``lua/includes/base.lua``); the fixed keys are passed explicitly.

Nothing outlives its use unbounded: :data:`LIFETIMES` says for every key how
it goes (tests/test_bounded_state.py proves each on a real Redis and on
fakeredis).
"""

from __future__ import annotations

import re

from scheduler.domain.errors import InvalidArgument

#: How each key of the layout goes away:
#:   "ttl"    written with an expiry
#:   "sweep"  deleted by a bounded sweep inside the scripts (forgetting a silent
#:            node, expiring reservations, evicting artifacts, pruning the index)
#:   "cell"   one key per cell whose members leave by those sweeps
#: "ttl+sweep": an expiry in some states, a sweep in the others.
LIFETIMES: dict[str, str] = {
    "policy": "cell",
    "nodes": "cell",
    "static": "cell",
    "stats": "cell",
    "rr": "cell",
    "rr-cursor": "cell",
    "expiry": "cell",
    "census": "cell",
    "seen": "cell",
    "node:<node>": "sweep",
    "node-res:<node>": "sweep",
    "node-sbx:<node>": "sweep",
    "node-roster:<node>": "sweep",
    "res:<reservation>": "ttl+sweep",
    "bind:<sandbox>": "ttl+sweep",
    "idx-shapes": "cell",
    "idx-cpu:<C>:<M>": "sweep",
    "idx-mem:<C>:<M>": "sweep",
    "idx-bucket:<bucket>": "sweep",
    "idx-seen": "cell",
    "idx-rebuild": "cell",
    "cpucfg:<cluster>": "sweep",
    "cpucfg-missing:<cluster>": "sweep",
    "cpucfg-configs:<cluster>": "sweep",
    "p2p:<cluster>": "sweep",
    "art:<digest>": "sweep",
    "node-art:<node>": "sweep",
    "art-lru": "cell",
    "art-names": "cell",
    # locality (lua/includes/locality.lua, art_keys.lua)
    "art-key:<digest>": "sweep",
    "art-kd": "cell",
    "aff:<digest>": "ttl",
    "node-loc:<node>": "sweep",
    "replica:<replica>": "ttl",
    # a node-list sync pass (lua/includes/sync_pass.lua)
    "sync-pass": "ttl",
    "sync-stage:<token>": "ttl",
}

MAX_ID_BYTES = 256
_ID_RE = re.compile(r"[A-Za-z0-9._@/+=~-]+")
_CELL_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")

DEFAULT_PREFIX = "sched"
DEFAULT_CELL = "default"


def validate_id(field: str, value: object) -> str:
    """Return ``value`` trimmed, or raise InvalidArgument naming ``field``."""
    if not isinstance(value, str):
        raise InvalidArgument(field, "must be a string")
    v = value.strip()
    if not v:
        raise InvalidArgument(field, "is required")
    if len(v.encode()) > MAX_ID_BYTES:
        raise InvalidArgument(field, f"is longer than {MAX_ID_BYTES} bytes")
    if not _ID_RE.fullmatch(v):
        bad = next(c for c in v if not _ID_RE.fullmatch(c))
        raise InvalidArgument(
            field, f"contains {bad!r}; allowed: letters, digits and . _ @ / + = ~ -"
        )
    return v


class CellKeys:
    """Key names of one cell.  Pure string building, no I/O."""

    __slots__ = ("prefix", "cell", "base")

    def __init__(self, cell: str = DEFAULT_CELL, prefix: str = DEFAULT_PREFIX) -> None:
        if not _CELL_RE.fullmatch(cell):
            raise InvalidArgument("cell", "must be 1-64 of letters, digits, '.', '_' or '-'")
        if not _CELL_RE.fullmatch(prefix):
            raise InvalidArgument("prefix", "must be 1-64 of letters, digits, '.', '_' or '-'")
        self.prefix = prefix
        self.cell = cell
        self.base = f"{prefix}:{{{cell}}}:"

    # fixed keys
    @property
    def policy(self) -> str:
        return self.base + "policy"

    @property
    def nodes(self) -> str:
        return self.base + "nodes"

    @property
    def stats(self) -> str:
        return self.base + "stats"

    @property
    def rr(self) -> str:
        return self.base + "rr"

    @property
    def rr_cursor(self) -> str:
        return self.base + "rr-cursor"

    @property
    def expiry(self) -> str:
        return self.base + "expiry"

    @property
    def seen(self) -> str:
        return self.base + "seen"

    @property
    def art_lru(self) -> str:
        return self.base + "art-lru"

    @property
    def art_names(self) -> str:
        return self.base + "art-names"

    # typed keys
    def node(self, node_id: str) -> str:
        return f"{self.base}node:{node_id}"

    def node_res(self, node_id: str) -> str:
        return f"{self.base}node-res:{node_id}"

    def node_sbx(self, node_id: str) -> str:
        return f"{self.base}node-sbx:{node_id}"

    def res(self, reservation_id: str) -> str:
        return f"{self.base}res:{reservation_id}"

    def bind(self, sandbox_id: str) -> str:
        return f"{self.base}bind:{sandbox_id}"

    def cpucfg(self, cluster_id: str) -> str:
        return f"{self.base}cpucfg:{cluster_id}"

    def p2p(self, cluster_id: str) -> str:
        return f"{self.base}p2p:{cluster_id}"

    def art(self, digest: str) -> str:
        return f"{self.base}art:{digest}"

    def node_roster(self, node_id: str) -> str:
        return f"{self.base}node-roster:{node_id}"

    def replica(self, replica_id: str) -> str:
        return f"{self.base}replica:{replica_id}"

    def node_art(self, node_id: str) -> str:
        return f"{self.base}node-art:{node_id}"

    def art_key(self, key_digest: str) -> str:
        return f"{self.base}art-key:{key_digest}"

    @property
    def art_kd(self) -> str:
        return self.base + "art-kd"

    def affinity(self, group_digest: str) -> str:
        return f"{self.base}aff:{group_digest}"

    def node_loc(self, node_id: str) -> str:
        return f"{self.base}node-loc:{node_id}"

    def fixed(self) -> list[str]:
        """KEYS[1..5] common to every script: base, policy, nodes, stats, expiry."""
        return [self.base, self.policy, self.nodes, self.stats, self.expiry]
