"""The replica's configuration: JSON file, environment, flags -> :class:`Settings`.

The file has the reference system's shared shape: ``{"scheduler": {...}}``
plus ``service``, ``log_level`` and ``log_format`` at the top level, and the
sections of its other services (``gateway``), which are ignored with one info
line naming them (docs/operations.md lists the keys).  It is decoded with
msgspec: an unknown or misspelled key is an error that names it, never a
silent default.  Durations are strings ("30s", "10m", "1h30m", "500ms").
Precedence: flags > environment > file > defaults, as the reference binary
has it (its only flags are ``-config`` and ``-query-only``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from scheduler.domain.catalog import BOUNDS_DEFAULTS
from scheduler.domain.errors import InvalidArgument
from scheduler.domain.limits import MAX_STATIC_NODES
from scheduler.domain.policy import DefaultRequest, Limits, Locality, Overcommit, Policy
from scheduler.server.tls import TlsFiles
from scheduler.store.address import parse_address
from scheduler.store.durability import Durability
from scheduler.store.keys import DEFAULT_CELL, DEFAULT_PREFIX, CellKeys, validate_id
from scheduler.store.p2p import DEFAULT_STORE_CAPACITY


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key."""


class NodeEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: str
    endpoint: str


class GrpcTls(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``grpc_tls``: PEM files; with ``client_ca_file`` clients must present a
    certificate it signed (mutual TLS)."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""


class KubernetesDiscovery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    namespace: str = ""
    service_name: str = ""
    port: int = 0
    scheme: str = "http"
    ignore_pod_selector: str = ""
    no_schedule_pod_selector: str = ""


class HeartbeatDiscovery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``discovery.heartbeat`` (ours): a heartbeat without ``x-node-endpoint``
    metadata gets ``scheme://<the caller's address>:port`` as its endpoint;
    port 0 = off (such a node is refused for placement: no endpoint)."""

    port: int = 0
    scheme: str = "http"


class Discovery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The reference system's object form of ``scheduler.discovery``."""

    #: "" = static when ``nodes`` is given, else heartbeat
    mode: str = ""
    kubernetes: KubernetesDiscovery = msgspec.field(default_factory=KubernetesDiscovery)
    heartbeat: HeartbeatDiscovery = msgspec.field(default_factory=HeartbeatDiscovery)


class LocalitySection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``scheduler.locality`` (ours; docs/design.md, "Locality"): weight 0 is off."""

    weight: float = Locality().weight
    max_pressure_gap: float = Locality().max_pressure_gap
    pending_decay: float = Locality().pending_decay
    headroom_share: float = Locality().headroom_share
    affinity_ttl: str = "10m"
    affinity_max_nodes: int = Locality().affinity_max_nodes


class SchedulerSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # the reference system's defaults: a gateway left on its own finds us
    grpc_listen_addr: str = ":9090"
    metrics_listen_addr: str = ":9101"
    strategy: str = "least_loaded"
    report_ttl: str = "30s"
    binding_ttl: str = "30s"
    placement_reservation_ttl: str = "10m"
    unassigned_reservation_ttl: str = "90s"
    redis_addr: str = ""
    nodes: list[NodeEntry] = msgspec.field(default_factory=list)
    node_resource_limit: Limits = msgspec.field(default_factory=Limits)
    artifact_store_capacity: int = DEFAULT_STORE_CAPACITY
    artifact_lookup_node_limit: int = 0
    #: "" = static when ``nodes`` is given, else heartbeat; or "static" /
    #: "heartbeat" / "kubernetes"; or the object form (:class:`Discovery`)
    discovery: str | Discovery = ""
    # ours
    overcommit: Overcommit = msgspec.field(default_factory=Overcommit)
    default_request: DefaultRequest = msgspec.field(default_factory=DefaultRequest)
    locality: LocalitySection = msgspec.field(default_factory=LocalitySection)
    cell: str = DEFAULT_CELL
    key_prefix: str = DEFAULT_PREFIX
    drain_timeout: str = "10s"
    # hardening: input limits, forgetting, TLS
    max_roster_ids: int = BOUNDS_DEFAULTS["max_roster_ids"]
    node_forget_after: str = "1h"
    reservation_tombstone_ttl: str = "10m"
    artifact_key_max_bytes: int = BOUNDS_DEFAULTS["artifact_key_max_bytes"]
    grpc_tls: GrpcTls = msgspec.field(default_factory=GrpcTls)
    #: > 0: a write is answered only once this many Redis replicas have it (WAIT)
    min_replicas_acked: int = 0
    replica_ack_timeout: str = "200ms"
    #: the longest a replica waits for Redis on one call (a caller's deadline may cut it shorter)
    redis_timeout: str = "2s"
    #: Schedules that arrive while one is on its way to Redis go as one batch call
    coalesce_schedules: bool = True
    #: heartbeats likewise
    coalesce_heartbeats: bool = True
    decision_log: bool = False  # one log line per Schedule (scheduler/server/logs.py)
    grpc_reflection: bool = True  # the gRPC reflection service (grpcurl list)
    #: accept a Redis whose maxmemory-policy evicts keys (logged, not refused)
    allow_eviction: bool = False


class ConfigFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: the reference system's shared file names the service; this is the scheduler
    service: str = ""
    scheduler: SchedulerSection = msgspec.field(default_factory=SchedulerSection)
    log_level: str = "info"
    log_format: str = "text"
    #: the reference system's other service in the shared file: ignored
    gateway: dict[str, Any] | None = None


LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
#: "auto" = json when stderr is not a terminal; "console" is our text format
LOG_FORMATS = ("auto", "json", "console", "text")
DISCOVERY = ("", "static", "heartbeat", "kubernetes")
#: top-level sections of the shared file that configure another service
OTHER_SERVICES = ("gateway",)
#: every variable the reference binary reads for its scheduler (its
#: ``overrideWithEnv``), and the scheduler.* key each sets; like it, an empty
#: value counts as unset
ENV_OVERRIDES = {
    "SCHEDULER_GRPC_LISTEN_ADDR": "grpc_listen_addr",
    "SCHEDULER_METRICS_LISTEN_ADDR": "metrics_listen_addr",
    "SCHEDULER_STRATEGY": "strategy",
    "SCHEDULER_REDIS_ADDR": "redis_addr",
    "SCHEDULER_BINDING_TTL": "binding_ttl",
    "SCHEDULER_ARTIFACT_STORE_CAPACITY": "artifact_store_capacity",
    "SCHEDULER_ARTIFACT_LOOKUP_NODE_LIMIT": "artifact_lookup_node_limit",
}
#: read elsewhere: ``SCHEDULER_CONFIG`` is ``--config``'s variable,
#: ``SCHEDULER_BUILD_COMMIT`` the commit an image bakes in (scheduler.version),
#: ``SCHEDULER_LOG_THIRD_PARTY`` the third-party loggers' level (scheduler.server.logs)
ENV_KNOWN = (
    *ENV_OVERRIDES,
    "SCHEDULER_CONFIG",
    "SCHEDULER_BUILD_COMMIT",
    "SCHEDULER_LOG_THIRD_PARTY",
)

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


def parse_duration_ms(key: str, text: str, zero_ok: bool = False) -> int:
    """A Go-style duration ("30s", "1h30m", "500ms") in whole milliseconds (>= 1;
    with ``zero_ok``, "0" is 0)."""
    s = text.strip()
    if zero_ok and s == "0":
        return 0
    pos, total_ns = 0, 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None:
            break
        total_ns += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise ConfigError(f"{key}: {text!r} is not a duration (like 500ms, 30s, 10m, 1h)")
    ms = int(total_ns // 1_000_000)
    if ms < 1:
        raise ConfigError(f"{key}: {text!r} is shorter than 1ms")
    return ms


def listen_address(key: str, addr: str) -> str:
    """``host:port``; Go's ``:port`` form means every interface."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: {addr!r} is not host:port")
    return f"[::]:{port}" if host == "" else f"{host}:{port}"


@dataclass(frozen=True)
class Overrides:
    """Command-line flags; None = not given."""

    redis: str | None = None
    grpc_listen: str | None = None
    metrics_listen: str | None = None
    cell: str | None = None
    log_level: str | None = None
    grpc_tls_cert: str | None = None
    grpc_tls_key: str | None = None
    grpc_tls_client_ca: str | None = None
    coalesce: bool | None = None
    #: ``-query-only``: serve LookupNode alone (the reference system's HA mode)
    query_only: bool = False


@dataclass(frozen=True)
class Settings:
    policy: Policy
    redis_url: str | None
    grpc_listen: str
    metrics_listen: str | None
    cell: str
    prefix: str
    nodes: list[tuple[str, str]]
    discovery: str
    artifact_store_capacity: int
    artifact_lookup_node_limit: int
    drain_timeout_s: float
    durability: Durability
    redis_timeout_s: float
    coalesce_schedules: bool
    coalesce_heartbeats: bool
    log_level: str
    log_format: str
    source: str = field(default="defaults")
    #: None = plaintext gRPC
    grpc_tls: TlsFiles | None = None
    #: discovery kubernetes: what to watch (None for every other mode)
    kubernetes: KubernetesDiscovery | None = None
    #: heartbeat discovery: a heartbeat without x-node-endpoint gets
    #: ``heartbeat_scheme://<peer address>:heartbeat_port`` (0 = off)
    heartbeat_port: int = 0
    heartbeat_scheme: str = "http"
    #: ``-query-only``: LookupNode alone; every other call UNAVAILABLE
    query_only: bool = False
    #: start-up lines the loader has for the log: (level, text)
    notes: tuple[tuple[str, str], ...] = ()
    decision_log: bool = False
    grpc_reflection: bool = True
    #: accept a Redis whose maxmemory-policy evicts keys (scheduler.allow_eviction)
    allow_eviction: bool = False


def decode(raw: bytes, source: str = "config") -> ConfigFile:
    try:
        return msgspec.json.decode(raw, type=ConfigFile)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {_readable(str(e))}") from None
    except msgspec.DecodeError as e:
        raise ConfigError(f"{source}: not valid JSON: {e}") from None


def _readable(msg: str) -> str:
    # msgspec says "Object contains unknown field `x` - at `$.scheduler`"
    m = re.fullmatch(r"Object contains unknown field `(.+?)`(?: - at `\$\.?(.*)`)?", msg)
    if m:
        where = f"{m.group(2)}.{m.group(1)}" if m.group(2) else m.group(1)
        return f"unknown key {where!r}"
    m = re.fullmatch(r"(.*) - at `\$\.?(.*)`", msg)
    if m:
        return f"{m.group(2)}: {m.group(1)}"
    return msg


def _env_int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not a whole number") from None


def resolve_log_format(fmt: str, stream: TextIO | None = None) -> str:
    """The formatter a ``log_format`` value chooses: "json" or "text" ("console"
    is text; "auto" is json unless ``stream``, stderr by default, is a terminal)."""
    fmt = fmt.strip().lower()
    if fmt == "auto":
        stream = sys.stderr if stream is None else stream
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        return "text" if tty else "json"
    return "json" if fmt == "json" else "text"


def _env(env: Mapping[str, str], sec: SchedulerSection) -> tuple[str | None, str | None]:
    """Apply the reference binary's variables to ``sec``; returns LOG_LEVEL and
    LOG_FORMAT (None when unset)."""

    def get(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    for name, key in ENV_OVERRIDES.items():
        value = get(name)
        if value is None:
            continue
        if key in ("artifact_store_capacity", "artifact_lookup_node_limit"):
            setattr(sec, key, _env_int(name, value))
        else:
            setattr(sec, key, value)
    return get("LOG_LEVEL"), get("LOG_FORMAT")


def load(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Overrides | None = None,
) -> Settings:
    env = os.environ if env is None else env
    flags = flags or Overrides()
    source = str(path) if path else "defaults"
    if path:
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        cfg = decode(raw, source)
    else:
        cfg = ConfigFile()
    sec = cfg.scheduler
    notes: list[tuple[str, str]] = []
    for name in OTHER_SERVICES:
        if getattr(cfg, name) is not None:
            notes.append(("info", f"{source}: section {name!r} ignored (it configures the {name})"))
    if cfg.service.strip() not in ("", "scheduler"):
        notes.append(("info", f"{source}: service {cfg.service!r} ignored: this is the scheduler"))
    for name in sorted(env):
        if name.startswith("SCHEDULER_") and name not in ENV_KNOWN:
            notes.append(("warning", f"environment: {name} is not a setting; ignored"))

    env_level, env_format = _env(env, sec)
    if env_format is not None:
        cfg.log_format = env_format
    if flags.redis is not None:
        sec.redis_addr = flags.redis
    if flags.grpc_listen is not None:
        sec.grpc_listen_addr = flags.grpc_listen
    if flags.metrics_listen is not None:
        sec.metrics_listen_addr = flags.metrics_listen
    if flags.cell is not None:
        sec.cell = flags.cell
    if flags.coalesce is not None:
        sec.coalesce_schedules = sec.coalesce_heartbeats = flags.coalesce
    if flags.grpc_tls_cert is not None:
        sec.grpc_tls.cert_file = flags.grpc_tls_cert
    if flags.grpc_tls_key is not None:
        sec.grpc_tls.key_file = flags.grpc_tls_key
    if flags.grpc_tls_client_ca is not None:
        sec.grpc_tls.client_ca_file = flags.grpc_tls_client_ca
    log_level = (flags.log_level or env_level or cfg.log_level).strip().lower()
    return _settings(cfg, sec, log_level, source, tuple(notes), flags.query_only)


def _discovery(
    sec: SchedulerSection, query_only: bool
) -> tuple[str, KubernetesDiscovery | None, HeartbeatDiscovery]:
    """The discovery mode, what kubernetes watches, and heartbeat's endpoint rule."""
    obj = sec.discovery if isinstance(sec.discovery, Discovery) else Discovery(mode=sec.discovery)
    key = (
        "scheduler.discovery.mode"
        if isinstance(sec.discovery, Discovery)
        else "scheduler.discovery"
    )
    mode = obj.mode.strip().lower()
    if mode not in DISCOVERY:
        raise ConfigError(f"{key}: must be one of static, heartbeat, kubernetes, not {obj.mode!r}")
    mode = mode or ("static" if sec.nodes else "heartbeat")
    hb = obj.heartbeat
    if not 0 <= hb.port <= 65535:
        raise ConfigError(f"scheduler.discovery.heartbeat.port: must be 0..65535, not {hb.port}")
    if hb.port and not hb.scheme.strip():
        raise ConfigError("scheduler.discovery.heartbeat.scheme: is required")
    if query_only:  # (the reference binary checks none of discovery for it)
        return mode, None, hb
    if mode == "static" and not sec.nodes:
        raise ConfigError(f"{key}: static needs a non-empty scheduler.nodes list")
    if mode != "static" and sec.nodes:
        raise ConfigError(f"scheduler.nodes: a static node list contradicts discovery {mode}")
    if hb.port and mode != "heartbeat":
        raise ConfigError(
            f"scheduler.discovery.heartbeat: applies to discovery heartbeat, not {mode}"
        )
    if mode != "kubernetes":
        return mode, None, hb
    kube = obj.kubernetes
    for name in ("namespace", "service_name"):
        if not getattr(kube, name).strip():
            raise ConfigError(f"scheduler.discovery.kubernetes.{name}: is required")
    if not 0 < kube.port <= 65535:
        raise ConfigError(
            f"scheduler.discovery.kubernetes.port: must be greater than zero (at most 65535), "
            f"not {kube.port}"
        )
    if not kube.scheme.strip():
        raise ConfigError("scheduler.discovery.kubernetes.scheme: is required")
    return mode, kube, hb


def _settings(
    cfg: ConfigFile,
    sec: SchedulerSection,
    log_level: str,
    source: str,
    notes: tuple[tuple[str, str], ...] = (),
    query_only: bool = False,
) -> Settings:
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"log_level: must be one of {', '.join(LOG_LEVELS)}, not {log_level!r}")
    log_format = cfg.log_format.strip().lower()
    if log_format not in LOG_FORMATS:
        raise ConfigError(
            f"log_format: must be one of {', '.join(LOG_FORMATS)}, not {cfg.log_format!r}"
        )
    if query_only and not sec.redis_addr.strip():
        raise ConfigError(
            "scheduler.redis_addr: -query-only needs a Redis (SCHEDULER_REDIS_ADDR or "
            "scheduler.redis_addr): it answers LookupNode from the bindings other replicas write"
        )
    discovery, kube, hb = _discovery(sec, query_only)
    if sec.artifact_store_capacity < 0:
        raise ConfigError("scheduler.artifact_store_capacity: must not be negative")
    nodes: list[tuple[str, str]] = []
    seen: set[str] = set()
    if len(sec.nodes) > MAX_STATIC_NODES:
        raise ConfigError(
            f"scheduler.nodes: has {len(sec.nodes)} entries, more than {MAX_STATIC_NODES}"
        )
    try:
        CellKeys(sec.cell, sec.key_prefix)
        for i, n in enumerate(sec.nodes):
            nid = validate_id(f"scheduler.nodes[{i}].id", n.id)
            if not n.endpoint.strip():
                raise InvalidArgument(f"scheduler.nodes[{i}].endpoint", "is required")
            if nid in seen:
                raise InvalidArgument(f"scheduler.nodes[{i}].id", f"{nid!r} is listed twice")
            seen.add(nid)
            nodes.append((nid, n.endpoint.strip()))
        policy = Policy(
            strategy=sec.strategy,
            report_ttl_ms=parse_duration_ms("scheduler.report_ttl", sec.report_ttl),
            binding_ttl_ms=parse_duration_ms("scheduler.binding_ttl", sec.binding_ttl),
            reservation_ttl_ms=parse_duration_ms(
                "scheduler.placement_reservation_ttl", sec.placement_reservation_ttl
            ),
            unassigned_reservation_ttl_ms=parse_duration_ms(
                "scheduler.unassigned_reservation_ttl", sec.unassigned_reservation_ttl
            ),
            limits=sec.node_resource_limit,
            overcommit=sec.overcommit,
            default_request=sec.default_request,
            # kubernetes: the watcher's list is the node list (a heartbeat from
            # a node not in it is refused, as with a static list)
            static_nodes=discovery in ("static", "kubernetes"),
            max_roster_ids=sec.max_roster_ids,
            node_forget_after_ms=parse_duration_ms(
                "scheduler.node_forget_after", sec.node_forget_after, zero_ok=True
            ),
            reservation_tombstone_ttl_ms=parse_duration_ms(
                "scheduler.reservation_tombstone_ttl", sec.reservation_tombstone_ttl
            ),
            artifact_key_max_bytes=sec.artifact_key_max_bytes,
            locality=Locality(
                weight=sec.locality.weight,
                max_pressure_gap=sec.locality.max_pressure_gap,
                pending_decay=sec.locality.pending_decay,
                headroom_share=sec.locality.headroom_share,
                affinity_ttl_ms=parse_duration_ms(
                    "scheduler.locality.affinity_ttl", sec.locality.affinity_ttl
                ),
                affinity_max_nodes=sec.locality.affinity_max_nodes,
            ),
        ).validate()
    except InvalidArgument as e:
        key = e.field if e.field.startswith("scheduler.") else f"scheduler.{e.field}"
        raise ConfigError(f"{key}: {e.message.removeprefix(e.field).strip()}") from None
    metrics = sec.metrics_listen_addr.strip()
    try:
        address = parse_address(sec.redis_addr)
    except InvalidArgument as e:
        raise ConfigError(
            f"scheduler.redis_addr: {e.message.removeprefix(e.field).strip()}",
        ) from None
    if not 0 <= sec.min_replicas_acked <= 64:
        raise ConfigError(
            f"scheduler.min_replicas_acked: must be 0..64, not {sec.min_replicas_acked}"
        )
    if sec.min_replicas_acked and address.kind == "cluster":
        raise ConfigError(
            "scheduler.min_replicas_acked: not supported with a Redis Cluster "
            "address yet (WAIT must follow each call to its slot's primary)"
        )
    if sec.min_replicas_acked and address.kind == "embedded":
        raise ConfigError(
            "scheduler.min_replicas_acked: needs a Redis with replicas "
            "(redis_addr), not the embedded store"
        )
    durability = Durability(
        replicas=sec.min_replicas_acked,
        timeout_ms=parse_duration_ms("scheduler.replica_ack_timeout", sec.replica_ack_timeout),
    )
    return Settings(
        policy=policy,
        redis_url=sec.redis_addr.strip() or None,
        grpc_listen=listen_address("scheduler.grpc_listen_addr", sec.grpc_listen_addr),
        metrics_listen=listen_address("scheduler.metrics_listen_addr", metrics)
        if metrics
        else None,
        cell=sec.cell,
        prefix=sec.key_prefix,
        nodes=nodes,
        discovery=discovery,
        artifact_store_capacity=sec.artifact_store_capacity or DEFAULT_STORE_CAPACITY,
        artifact_lookup_node_limit=sec.artifact_lookup_node_limit,
        drain_timeout_s=parse_duration_ms("scheduler.drain_timeout", sec.drain_timeout) / 1000,
        durability=durability,
        redis_timeout_s=parse_duration_ms("scheduler.redis_timeout", sec.redis_timeout) / 1000,
        coalesce_schedules=sec.coalesce_schedules,
        coalesce_heartbeats=sec.coalesce_heartbeats,
        log_level=log_level,
        log_format=log_format,
        source=source,
        grpc_tls=_tls(sec.grpc_tls),
        kubernetes=kube,
        heartbeat_port=hb.port if discovery == "heartbeat" else 0,
        heartbeat_scheme=hb.scheme.strip(),
        query_only=query_only,
        notes=notes,
        decision_log=sec.decision_log,
        grpc_reflection=sec.grpc_reflection,
        allow_eviction=sec.allow_eviction,
    )


def _tls(t: GrpcTls) -> TlsFiles | None:
    cert, key, ca = t.cert_file.strip(), t.key_file.strip(), t.client_ca_file.strip()
    if not (cert or key or ca):
        return None
    if not cert or not key:
        missing = "cert_file" if not cert else "key_file"
        raise ConfigError(f"scheduler.grpc_tls.{missing}: is required when grpc_tls is set")
    return TlsFiles(cert_file=cert, key_file=key, client_ca_file=ca or None)


def summary(s: Settings, target: str) -> list[str]:
    """The effective settings, one line each, as logged at start."""
    p = s.policy
    limits = ", ".join(f"{k}={v}" for k, v in p.limits.active().items()) or "none"
    return [
        f"config: {s.source}; cell {s.cell!r} (key prefix {s.prefix!r}); Redis: {target}",
        f"strategy: {p.strategy}; discovery: {s.discovery}"
        + (f" ({len(s.nodes)} static nodes)" if s.nodes else "")
        + _discovery_summary(s),
        f"node_resource_limit: {limits}",
        f"report_ttl: {p.report_ttl_ms}ms; binding_ttl: {p.binding_ttl_ms}ms; "
        f"placement_reservation_ttl: {p.reservation_ttl_ms}ms; "
        f"unassigned_reservation_ttl: {p.unassigned_reservation_ttl_ms}ms",
        f"overcommit: cpu {p.overcommit.cpu} memory {p.overcommit.memory}; default_request: "
        f"cpu {p.default_request.cpu} memory_mb {p.default_request.memory_mb}",
        f"artifact_store_capacity: {s.artifact_store_capacity}; artifact_lookup_node_limit: "
        f"{s.artifact_lookup_node_limit}",
        f"max_roster_ids: {p.max_roster_ids}; node_forget_after: "
        f"{p.node_forget_after_ms}ms{' (never)' if not p.node_forget_after_ms else ''}; "
        f"reservation_tombstone_ttl: {p.reservation_tombstone_ttl_ms}ms; "
        f"artifact_key_max_bytes: {p.artifact_key_max_bytes}",
        (
            f"locality: weight {p.locality.weight:g}, max_pressure_gap "
            f"{p.locality.max_pressure_gap:g}, headroom_share {p.locality.headroom_share:g}, "
            f"pending_decay {p.locality.pending_decay:g}, "
            f"affinity_ttl {p.locality.affinity_ttl_ms}ms, "
            f"affinity_max_nodes {p.locality.affinity_max_nodes}"
            if p.locality.weight > 0
            else "locality: off (weight 0)"
        ),
        f"grpc: {s.grpc_listen} ({_tls_summary(s.grpc_tls)}); metrics: {s.metrics_listen or 'off'}",
        f"coalesce_schedules: {'on' if s.coalesce_schedules else 'off'}; coalesce_heartbeats: "
        f"{'on' if s.coalesce_heartbeats else 'off'}; "
        f"redis_timeout: {round(s.redis_timeout_s * 1000)}ms; "
        + (
            f"writes acknowledged once {s.durability.replicas} Redis replica(s) have them "
            f"(min_replicas_acked; WAIT up to {s.durability.timeout_ms}ms)"
            if s.durability.replicas
            else "writes acknowledged by the primary alone (min_replicas_acked 0: a failover may "
            "lose what it had not yet replicated)"
        ),
    ]


def _discovery_summary(s: Settings) -> str:
    if s.query_only:
        return "; query-only: LookupNode alone, every other call UNAVAILABLE"
    if s.kubernetes is not None:
        k = s.kubernetes
        return (
            f" (EndpointSlices of {k.namespace}/{k.service_name}, endpoints "
            f"{k.scheme}://<address>:{k.port})"
        )
    if s.discovery != "heartbeat":
        return ""
    if s.heartbeat_port:
        return (
            f" (a heartbeat without x-node-endpoint metadata gets "
            f"{s.heartbeat_scheme}://<its address>:{s.heartbeat_port})"
        )
    return (
        " (a node whose heartbeat has no x-node-endpoint metadata is refused for placement "
        "with 'no endpoint': set scheduler.discovery.heartbeat.port and scheme, "
        'e.g. {"mode": "heartbeat", "heartbeat": {"port": 8000, "scheme": "http"}})'
    )


def _tls_summary(t: TlsFiles | None) -> str:
    if t is None:
        return "plaintext"
    if t.client_ca_file:
        return f"mutual TLS: cert {t.cert_file}, clients signed by {t.client_ca_file}"
    return f"TLS: cert {t.cert_file}"
