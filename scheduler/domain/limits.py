"""Bounds on input that are the same for every cell, checked before anything
reaches Redis (docs/operations.md, "Security", lists them with the policy's
own: ``max_roster_ids`` and ``artifact_key_max_bytes``, which replicas of a
cell must agree on, live in :class:`~scheduler.domain.policy.Policy`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sized

from scheduler.domain.errors import InvalidArgument

#: ReportSandboxEventRequest.events
MAX_EVENTS = 1024
#: NodeSnapshot.disks
MAX_DISKS = 256
#: NewColdSandboxHint.images (not used for placement, but parsed)
MAX_IMAGES = 256
#: entries of a hint's metadata map, and their total size in bytes
MAX_METADATA = 256
MAX_METADATA_BYTES = 64 * 1024
#: scheduler.nodes, the static node list
MAX_STATIC_NODES = 10_000
#: text fields of a heartbeat (version, commit, machine_info.*, disk fields,
#: p2p_endpoint.*) and endpoints, in characters
MAX_TEXT = 1024
#: machine_info.cpu_config_json, in characters
MAX_CPU_CONFIG = 64 * 1024
#: gRPC messages a replica accepts: 4 MiB (gRPC's default), raised for
#: rosters longer than the default max_roster_ids fits
MESSAGE_BASE_BYTES = 4 * 1024 * 1024


def max_message_bytes(max_roster_ids: int) -> int:
    """The largest request a replica takes: a full roster of the longest ids
    (256 bytes and 3 of framing each) on top of the base."""
    return MESSAGE_BASE_BYTES + max_roster_ids * 259


def text(field: str, value: str, limit: int = MAX_TEXT) -> str:
    """``value`` if it has at most ``limit`` characters, else InvalidArgument."""
    if len(value) > limit:
        raise InvalidArgument(field, f"is longer than {limit} characters")
    return value


def at_most(field: str, items: Sized, limit: int, what: str = "") -> None:
    if len(items) > limit:
        raise InvalidArgument(field, f"has {len(items)} entries, more than {what or limit}")


_HOST = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_ENDPOINT = re.compile(
    r"(?:(?P<scheme>https?)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+)"
    r":(?P<port>\d{1,5})(?P<slash>/?)"
)


def endpoint(field: str, value: str) -> str:
    """``host:port`` or ``http(s)://host:port`` (host a DNS name, an IPv4
    address or a bracketed IPv6 one; port 1-65535), else InvalidArgument
    naming ``field``."""
    v = value.strip()
    m = _ENDPOINT.fullmatch(v)
    ok = (
        m is not None
        and 1 <= int(m.group("port")) <= 65535
        and (m.group("scheme") is not None or not m.group("slash"))
    )
    if m is not None and ok:
        host = m.group("host")
        if host.startswith("["):
            try:
                ipaddress.IPv6Address(host[1:-1])
            except ValueError:
                ok = False
        else:
            ok = _HOST.fullmatch(host) is not None
    if not ok:
        shown = v if len(v) <= 64 else v[:61] + "..."
        raise InvalidArgument(
            field, f"must be host:port or an http(s)://host:port URL, not {shown!r}"
        )
    return v
