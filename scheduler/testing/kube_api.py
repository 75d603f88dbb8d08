"""A Kubernetes API server double: the list/watch wire of EndpointSlices and
pods, on a real HTTP server on a free loopback port (threads).

No Kubernetes API server can run on these machines; this one speaks the part
of its protocol that discovery uses, as the real one does:

* ``GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices`` and
  ``GET /api/v1/namespaces/NS/pods`` with ``labelSelector``: a list
  (``{"kind": "EndpointSliceList", "metadata": {"resourceVersion": "N"},
  "items": [...]}``);
* the same with ``watch=1&resourceVersion=N[&allowWatchBookmarks=true]
  [&timeoutSeconds=T]``: a chunked stream, one JSON event per line,
  ``ADDED`` / ``MODIFIED`` / ``DELETED`` after N (an object that leaves the
  selector is DELETED to that watch, one that enters it ADDED), ``BOOKMARK``
  when :meth:`KubeApiServer.bookmark` says so, and ``ERROR`` with a Status of
  code 410 when N is older than the history kept (:meth:`compact`) or when
  :meth:`expire_watches` ends the open watches;
* a resourceVersion too old as HTTP ``410 Gone`` instead, when
  ``too_old_as_status`` is set (both happen on real clusters);
* ``Authorization: Bearer <token>`` checked (401 otherwise); TLS if given a
  certificate;
* :meth:`down` / :meth:`up`: the server goes away (open watches are cut) and
  comes back on the same port with its objects and history.

One counter of resourceVersions serves every kind, as etcd's revision does.
"""

from __future__ import annotations

import json
import queue
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from scheduler.server.kubernetes import SERVICE_NAME_LABEL, parse_selector, selector_matches

SLICES = "endpointslices"
PODS = "pods"
_KINDS = {
    SLICES: ("/apis/discovery.k8s.io/v1", "EndpointSlice", "discovery.k8s.io/v1"),
    PODS: ("/api/v1", "Pod", "v1"),
}


def go_bool(text: str) -> bool:
    """A boolean query parameter as the API server reads it (Go's
    strconv.ParseBool: kubernetes_asyncio sends ``True``)."""
    return text in ("1", "t", "T", "TRUE", "true", "True")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def endpoint(
    pod: str,
    address: str,
    *,
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
    namespace: str = "agentenv-system",
    node_name: str = "worker-1",
) -> dict[str, Any]:
    """One entry of an EndpointSlice's ``endpoints``, shaped as the API's."""
    return {
        "addresses": [address],
        "conditions": {
            "ready": ready,
            "serving": ready if serving is None else serving,
            "terminating": terminating,
        },
        "targetRef": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": str(uuid.uuid4())},
        "nodeName": node_name,
    }


def endpoint_slice(
    name: str,
    service: str,
    endpoints: list[dict[str, Any]],
    *,
    namespace: str = "agentenv-system",
    port: int = 8000,
    port_name: str = "http",
) -> dict[str, Any]:
    """An EndpointSlice of ``service`` (labelled as the controller labels it)."""
    return {
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                SERVICE_NAME_LABEL: service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


def pod(
    name: str, labels: Mapping[str, str], *, namespace: str = "agentenv-system"
) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"containers": [{"name": "agentenv-node", "image": "agentenv-node"}]},
        "status": {"phase": "Running"},
    }


@dataclass
class _Change:
    rv: int
    kind: str
    namespace: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None  # None: deleted (old is the object)


@dataclass(eq=False)
class _Watch:
    kind: str
    namespace: str
    selector: Any
    bookmarks: bool
    #: event lines; _END ends the watch cleanly, None cuts the connection
    lines: queue.Queue[bytes | None] = field(default_factory=queue.Queue)


class KubeApiServer:
    """Start with :meth:`start` (or as a context manager); ``url`` is where."""

    def __init__(
        self,
        token: str | None = "test-token",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        certfile: str | None = None,
        keyfile: str | None = None,
        first_rv: int = 1000,
    ) -> None:
        self.token = token
        self.host = host
        self.port = port
        self.certfile, self.keyfile = certfile, keyfile
        self.too_old_as_status = False
        self._lock = threading.Lock()
        self._rv = first_rv
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._history: list[_Change] = []
        self._compacted = first_rv  # a watch from an rv below this is 410
        self._watches: set[_Watch] = set()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: (path, query) of every request, in order
        self.requests: list[tuple[str, dict[str, str]]] = []
        #: how many of them were answered 401 (no token, or the wrong one)
        self.unauthorized = 0

    # -- the server --------------------------------------------------------
    @property
    def url(self) -> str:
        scheme = "https" if self.certfile else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def start(self) -> KubeApiServer:
        self.up()
        return self

    def up(self) -> None:
        owner = self

        class Handler(_Handler):
            api = owner

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        if self.certfile:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(self.certfile, self.keyfile)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening and cut every open watch (objects are kept)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            watches, self._watches = list(self._watches), set()
        for w in watches:
            w.lines.put(None)
        if self._thread is not None:
            self._thread.join(10)

    stop = down

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def resource_version(self) -> int:
        return self._rv

    # -- what a test does to the cluster -------------------------------------
    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (``kind``: SLICES or PODS); it gets the
        next resourceVersion, a uid if new, and goes to the matching watches."""
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        key = (kind, meta["namespace"], meta["name"])
        with self._lock:
            old = self._objects.get(key)
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
            meta["generation"] = old["metadata"].get("generation", 1) + 1 if old else 1
            self._objects[key] = obj
            self._record(_Change(self._rv, kind, meta["namespace"], old, obj))
        return obj

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            old = self._objects.pop((kind, namespace, name))
            self._rv += 1
            gone = json.loads(json.dumps(old))
            gone["metadata"]["resourceVersion"] = str(self._rv)
            self._record(_Change(self._rv, kind, namespace, gone, None))

    def touch(self) -> int:
        """A write elsewhere in the cluster: the resourceVersion moves on."""
        with self._lock:
            self._rv += 1
            return self._rv

    def compact(self) -> None:
        """Forget the history: a watch from any resourceVersion before now is 410."""
        with self._lock:
            self._history.clear()
            self._compacted = self._rv

    def expire_watches(self) -> int:
        """Compact, and end every open watch with an ERROR event of code 410
        (what a watch cache that fell too far behind does).  Returns how many."""
        self.compact()
        line = _line(
            {"type": "ERROR", "object": status(410, "Expired", "too old resource version")}
        )
        with self._lock:
            watches, self._watches = list(self._watches), set()
        for w in watches:
            w.lines.put(line)
            w.lines.put(_END)
        return len(watches)

    def bookmark(self) -> int:
        """Send a BOOKMARK at the current resourceVersion to every open watch
        that asked for them.  Returns how many got one."""
        with self._lock:
            watches = [w for w in self._watches if w.bookmarks]
            rv = self._rv
        for w in watches:
            _, kind, version = _KINDS[w.kind]
            obj = {"kind": kind, "apiVersion": version, "metadata": {"resourceVersion": str(rv)}}
            w.lines.put(_line({"type": "BOOKMARK", "object": obj}))
        return len(watches)

    def open_watches(self, kind: str | None = None) -> int:
        with self._lock:
            return sum(1 for w in self._watches if kind is None or w.kind == kind)

    # -- inside ----------------------------------------------------------------
    def _record(self, change: _Change) -> None:  # (holding the lock)
        self._history.append(change)
        for w in self._watches:
            line = _event_for(w, change)
            if line is not None:
                w.lines.put(line)

    def _list(self, kind: str, namespace: str, selector: Any) -> dict[str, Any]:
        _, name, version = _KINDS[kind]
        with self._lock:
            items = [
                o
                for (k, ns, _), o in sorted(self._objects.items())
                if k == kind and ns == namespace and _matches(selector, o)
            ]
            return {
                "kind": f"{name}List",
                "apiVersion": version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def _open_watch(self, w: _Watch, since: int) -> list[bytes] | None:
        """The backlog after ``since`` (None: too old), and w registered."""
        with self._lock:
            if since < self._compacted:
                return None
            backlog = [
                line
                for c in self._history
                if c.rv > since and (line := _event_for(w, c)) is not None
            ]
            self._watches.add(w)
            return backlog

    def _close_watch(self, w: _Watch) -> None:
        with self._lock:
            self._watches.discard(w)


def _matches(selector: Any, obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    return selector_matches(selector, obj["metadata"].get("labels") or {})


def _event_for(w: _Watch, c: _Change) -> bytes | None:
    if c.kind != w.kind or c.namespace != w.namespace:
        return None
    was, now = _matches(w.selector, c.old), _matches(w.selector, c.new)
    if c.new is None:
        return _line({"type": "DELETED", "object": c.old}) if was else None
    if now:
        return _line({"type": "MODIFIED" if was else "ADDED", "object": c.new})
    if was:  # (it left the selector: gone from this watch)
        return _line({"type": "DELETED", "object": c.new})
    return None


_END = b""


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class _Handler(BaseHTTPRequestHandler):
    api: KubeApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # (quiet)
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.api.requests.append((url.path, query))
        auth = self.headers.get("Authorization")
        if self.api.token is not None and auth != f"Bearer {self.api.token}":
            self.api.unauthorized += 1
            self._json(401, status(401, "Unauthorized", "Unauthorized"))
            return
        route = self._route(url.path)
        if route is None:
            self._json(404, status(404, "NotFound", f"the server could not find {url.path}"))
            return
        kind, namespace = route
        try:
            selector = parse_selector(query.get("labelSelector", ""), "labelSelector")
        except ValueError as e:
            self._json(400, status(400, "BadRequest", str(e)))
            return
        if go_bool(query.get("watch", "")):
            self._watch(kind, namespace, selector, query)
        else:
            self._json(200, self.api._list(kind, namespace, selector))

    def _route(self, path: str) -> tuple[str, str] | None:
        for kind, (prefix, _, _) in _KINDS.items():
            head = prefix + "/namespaces/"
            if path.startswith(head) and path.endswith("/" + kind):
                namespace = path[len(head) : -len(kind) - 1]
                if namespace and "/" not in namespace:
                    return kind, namespace
        return None

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _watch(self, kind: str, namespace: str, selector: Any, query: dict[str, str]) -> None:
        try:
            since = int(query.get("resourceVersion") or self.api.resource_version)
        except ValueError:
            self._json(400, status(400, "BadRequest", "resourceVersion: not a number"))
            return
        w = _Watch(kind, namespace, selector, go_bool(query.get("allowWatchBookmarks", "")))
        backlog = self.api._open_watch(w, since)
        if backlog is None and self.api.too_old_as_status:
            self._json(410, status(410, "Gone", f"too old resource version: {since}"))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        timeout = float(query.get("timeoutSeconds") or 1800)
        try:
            if backlog is None:
                msg = f"too old resource version: {since} ({self.api._compacted})"
                self._chunk(_line({"type": "ERROR", "object": status(410, "Expired", msg)}))
            else:
                for line in _drain(backlog, w, timeout, self._client_gone):
                    if line is None:  # (the server went down: no clean end)
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self._chunk(line)
            self._chunk(b"")
        except OSError:
            pass  # (the client went away)
        finally:
            self.api._close_watch(w)
            self.close_connection = True

    def _client_gone(self) -> bool:
        """The client closed its end (a watch client sends nothing more)."""
        sock = self.connection
        if not select.select([sock], [], [], 0)[0]:
            return False
        try:
            return not sock.recv(1)
        except (ssl.SSLWantReadError, BlockingIOError):
            return False
        except OSError:
            return True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _drain(
    backlog: list[bytes], w: _Watch, timeout: float, gone: Callable[[], bool]
) -> Iterator[bytes | None]:
    """The lines to send until the watch ends: its timeout, _END, None last
    (cut), or the client going away."""
    yield from backlog
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        try:
            line = w.lines.get(timeout=min(left, 0.05))
        except queue.Empty:
            if gone():
                return
            continue
        if line is None:
            yield None
            return
        if line == _END:
            return
        yield line
