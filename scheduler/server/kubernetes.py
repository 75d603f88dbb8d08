"""Kubernetes node discovery (``discovery.mode: kubernetes``).

Nodes are the endpoints of the EndpointSlices (``discovery.k8s.io/v1``)
labelled ``kubernetes.io/service-name=<service_name>`` in ``namespace``, as
the reference scheduler derives them:

* only slices that carry a port equal to ``port`` count;
* an endpoint counts when ``conditions.serving`` is true (``ready`` is not
  read) and it has a ``targetRef`` with a name; the node id is that name
  (the pod's), the endpoint ``scheme://<first valid IP address>:port``;
* a serving endpoint that is also ``terminating`` is lingering;
* a pod (by the node id, in ``namespace``) matched by ``ignore_pod_selector``
  is left out, one matched by ``no_schedule_pod_selector`` is lingering.

Each collection (the slices, and the pods of each selector) is listed, then
watched from the list's resourceVersion with bookmarks; a ``410 Gone`` (the
watch's HTTP status or its ERROR event) relists, any other failure reconnects
after a backoff, and the objects last known stay in hand meanwhile.  The view
goes to Redis through :meth:`AsyncScheduler.sync_discovered` with the
resourceVersion each stream has reached: the script applies a view only if no
replica wrote one further on in any stream (docs/design.md, "Kubernetes
discovery"), so a lagging replica never removes a node a fresher one added.

The client library is ``kubernetes_asyncio`` (in-cluster configuration and
the kubeconfig loader, TLS, token refresh, its ``Watch`` surfaces 410 as
``ApiException(status=410)``); objects are read from the raw JSON with
msgspec.  In a pod the watcher uses the in-cluster configuration; outside
one, the kubeconfig (:func:`load_client_configuration`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from kubernetes_asyncio import client as _k8s_client
from kubernetes_asyncio import config as _k8s_config
from kubernetes_asyncio import watch as _k8s_watch

from scheduler.domain.errors import InvalidArgument

log = logging.getLogger(__name__)

#: kubernetes_asyncio has no annotations; its calls go through Any.
k8s_client: Any = _k8s_client
k8s_config: Any = _k8s_config
k8s_watch: Any = _k8s_watch

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: where a pod finds its service account token and the cluster's CA
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
FIELD = "scheduler.discovery.kubernetes."
#: a URL scheme (RFC 3986); the reference takes any non-empty one
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


class KubernetesSettings(Protocol):
    """What the watcher reads of ``scheduler.discovery.kubernetes``."""

    @property
    def namespace(self) -> str: ...
    @property
    def service_name(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def scheme(self) -> str: ...
    @property
    def ignore_pod_selector(self) -> str: ...
    @property
    def no_schedule_pod_selector(self) -> str: ...


# -- label selectors -----------------------------------------------------------
# The API server evaluates the selectors; they are parsed here so a bad one is a
# clear error at start-up (as the reference's labels.Parse) and so the test
# double can evaluate them.

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"(?:[a-z0-9](?:[a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE = re.compile(rf"(?:{_NAME})?")
_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|[^\s!=(),]+)")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # "!=", "notin"


def parse_selector(text: str, field: str = "selector") -> tuple[Requirement, ...]:
    """Requirements of a label selector (``a=b,c!=d,e in (f,g),!h``); an
    invalid one is InvalidArgument naming ``field``."""
    tokens = [m.group(1) for m in _TOKEN.finditer(text)]
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise InvalidArgument(field, f"is not a label selector: {text!r}")
    out: list[Requirement] = []
    i = 0

    def bad(why: str) -> InvalidArgument:
        return InvalidArgument(field, f"is not a label selector ({why}): {text!r}")

    def key_at(j: int) -> str:
        if j >= len(tokens) or not _KEY.fullmatch(tokens[j]) or len(tokens[j]) > 316:
            raise bad("a label key expected")
        return tokens[j]

    def value(v: str) -> str:
        if not _VALUE.fullmatch(v) or len(v) > 63:
            raise bad(f"{v!r} is not a label value")
        return v

    while i < len(tokens):
        if tokens[i] == "!":
            out.append(Requirement(key_at(i + 1), "!"))
            i += 2
        else:
            key = key_at(i)
            i += 1
            nxt = tokens[i] if i < len(tokens) else ","
            if nxt in ("=", "==", "!="):
                v = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] != "," else ""
                out.append(Requirement(key, "!=" if nxt == "!=" else "=", (value(v),)))
                i += 2 if v else 1
            elif nxt in ("in", "notin"):
                if i + 1 >= len(tokens) or tokens[i + 1] != "(":
                    raise bad("'(' expected")
                j, values = i + 2, list[str]()
                while True:
                    if j >= len(tokens):
                        raise bad("')' expected")
                    if tokens[j] == ")" and not values:
                        break
                    v = tokens[j] if tokens[j] not in (",", ")") else ""
                    values.append(value(v))
                    j += 1 if v else 0
                    if j < len(tokens) and tokens[j] == ")":
                        break
                    if j >= len(tokens) or tokens[j] != ",":
                        raise bad("',' or ')' expected")
                    j += 1
                if not values:
                    raise bad(f"{nxt} needs at least one value")
                out.append(Requirement(key, nxt, tuple(values)))
                i = j + 1
            else:
                out.append(Requirement(key, "exists"))
        if i < len(tokens):
            if tokens[i] != ",":
                raise bad(f"',' expected before {tokens[i]!r}")
            i += 1
            if i >= len(tokens):
                raise bad("a requirement expected after ','")
    return tuple(out)


def selector_matches(reqs: Iterable[Requirement], labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in reqs)


def check_settings(s: KubernetesSettings) -> None:
    """InvalidArgument naming the first bad key of ``discovery.kubernetes``."""
    if not s.namespace.strip():
        raise InvalidArgument(FIELD + "namespace", "is required")
    if not s.service_name.strip():
        raise InvalidArgument(FIELD + "service_name", "is required")
    if isinstance(s.port, bool) or not isinstance(s.port, int) or not 0 < s.port < 65536:
        raise InvalidArgument(FIELD + "port", f"must be 1-65535, not {s.port!r}")
    if not _SCHEME.fullmatch(s.scheme.strip() or "http"):
        raise InvalidArgument(FIELD + "scheme", f"is not a URL scheme (http, https): {s.scheme!r}")
    for name in ("ignore_pod_selector", "no_schedule_pod_selector"):
        text = getattr(s, name).strip()
        if text:
            parse_selector(text, FIELD + name)


# -- the objects, as the API sends them ----------------------------------------


class ObjectMeta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] | None = None


class Conditions(msgspec.Struct):
    ready: bool | None = None
    serving: bool | None = None
    terminating: bool | None = None


class ObjectReference(msgspec.Struct):
    kind: str = ""
    name: str = ""
    namespace: str = ""


class Endpoint(msgspec.Struct, rename="camel"):
    addresses: list[str] = []
    conditions: Conditions = msgspec.field(default_factory=Conditions)
    target_ref: ObjectReference | None = None
    node_name: str | None = None


class EndpointPort(msgspec.Struct):
    port: int | None = None
    name: str | None = None


class EndpointSlice(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    endpoints: list[Endpoint] | None = None
    ports: list[EndpointPort] | None = None


class Pod(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


class ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""


class ObjectList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[msgspec.Raw] | None = None


_list_decoder = msgspec.json.Decoder(ObjectList)


# -- the reference's derivation ------------------------------------------------


def _address(addresses: Iterable[str]) -> str | None:
    """The first address that is an IP literal (the reference's netip.ParseAddr)."""
    import ipaddress

    for a in addresses:
        a = a.strip()
        try:
            ip = ipaddress.ip_address(a)
        except ValueError:
            continue
        return f"[{ip}]" if ip.version == 6 else str(ip)
    return None


def nodes_from_slices(
    slices: Iterable[EndpointSlice], port: int, scheme: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(active, lingering): node id -> endpoint, from the slices' endpoints."""
    scheme = scheme.strip() or "http"
    active: dict[str, str] = {}
    lingering: dict[str, str] = {}
    for sl in slices:
        if not any(p.port == port for p in sl.ports or ()):
            continue
        for ep in sl.endpoints or ():
            if ep.conditions.serving is not True:
                continue
            if ep.target_ref is None or not ep.target_ref.name:
                continue
            address = _address(ep.addresses)
            if address is None:
                continue
            into = lingering if ep.conditions.terminating is True else active
            into[ep.target_ref.name] = f"{scheme}://{address}:{port}"
    return active, lingering


def discovered_view(
    active: Mapping[str, str],
    lingering: Mapping[str, str],
    ignored: Iterable[str] = (),
    no_schedule: Iterable[str] = (),
) -> dict[str, tuple[str, bool]]:
    """node id -> (endpoint, lingering): ignored pods out, no-schedule pods
    lingering.  A node active in one slice and terminating in another is
    lingering, at the terminating endpoint (as the reference's registry)."""
    ignored, no_schedule = set(ignored), set(no_schedule)
    view = {i: (e, False) for i, e in active.items()}
    view.update((i, (e, True)) for i, e in lingering.items())
    for node_id in list(view):
        if node_id in ignored:
            del view[node_id]
        elif node_id in no_schedule:
            view[node_id] = (view[node_id][0], True)
    return view


def resource_version(text: str) -> int:
    """A resourceVersion as the integer it is on etcd storage (see
    docs/design.md: the one thing of it this module relies on)."""
    if not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise NotComparable(
            f"resourceVersion {text!r} is not a decimal etcd revision; "
            "kubernetes discovery cannot order views by it"
        )
    return int(text)


class NotComparable(Exception):
    """A resourceVersion that is not an etcd revision."""


class Gone(Exception):
    """410: the resourceVersion is too old to watch from; list again."""


# -- one collection, listed then watched ---------------------------------------

Lister = Callable[..., Awaitable[Any]]


class Stream:
    """The objects of one collection (by name) and the resourceVersion up to
    which they are known (``position``; None until the first list)."""

    def __init__(
        self,
        what: str,
        lister: Lister,
        namespace: str,
        selector: str,
        decode: Callable[[bytes], Any],
        changed: Callable[[], None],
        timing: Timing,
    ) -> None:
        self.what = what
        self.lister = lister
        self.namespace = namespace
        self.selector = selector
        self.decode = decode
        self.changed = changed
        self.timing = timing
        self.objects: dict[str, Any] = {}
        self.position: int | None = None
        self.lists = 0  # lists done (the first, then one per 410)
        self.failures = 0  # lists and watches that failed, not by 410

    async def run(self) -> None:
        """List, watch, relist on 410, reconnect after failures; until cancelled."""
        delay = self.timing.backoff_s
        relist = True
        while True:
            try:
                if relist:
                    await self._list()
                    relist = False
                await self._watch()
                delay = self.timing.backoff_s
            except Gone as e:
                log.info("kubernetes discovery: %s watch expired (%s); listing again", self.what, e)
                relist = True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # (the API server: down, refusing, or talking nonsense)
                self.failures += 1
                log.warning(
                    "kubernetes discovery: %s %s failed: %s; %d known kept, retrying in %.1fs",
                    self.what,
                    "list" if relist else "watch",
                    _describe(e),
                    len(self.objects),
                    delay,
                )
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.timing.max_backoff_s)

    async def _list(self) -> None:
        resp = await self.lister(
            self.namespace,
            label_selector=self.selector,
            _preload_content=False,
            _request_timeout=self.timing.request_timeout_s,
        )
        try:
            body = await resp.read()
            if resp.status != 200:
                status = _status_code(body, resp.status)
                if status == 410:
                    raise Gone(f"list: HTTP {resp.status}")
                raise k8s_client.ApiException(status=status, reason=_status_message(body))
        finally:
            resp.release()
        got = _list_decoder.decode(body)
        position = resource_version(got.metadata.resource_version)
        objects: dict[str, Any] = {}
        for raw in got.items or ():
            obj = self.decode(raw)
            objects[obj.metadata.name] = obj
        self.objects, self.position = objects, position  # (replaced at once)
        self.lists += 1
        self.changed()

    async def _watch(self) -> None:
        """One watch from ``position`` until the server ends it."""
        async with k8s_watch.Watch(return_type="object") as w:
            events = w.stream(
                self.lister,
                self.namespace,
                label_selector=self.selector,
                resource_version=str(self.position),
                allow_watch_bookmarks=True,
                timeout_seconds=self.timing.watch_timeout_s,
                _request_timeout=(
                    self.timing.request_timeout_s,
                    self.timing.watch_timeout_s + self.timing.request_timeout_s,
                ),
            )
            try:
                async for event in events:
                    self._apply(event["type"], event["raw_object"])
            except k8s_client.ApiException as e:
                if e.status == 410:
                    raise Gone(f"watch: {e.reason}") from None
                raise

    def _apply(self, kind: str, raw: dict[str, Any]) -> None:
        rv = resource_version(str((raw.get("metadata") or {}).get("resourceVersion", "")))
        if kind == "BOOKMARK":
            self.position = rv
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            obj = self.decode(msgspec.json.encode(raw))
            if kind == "DELETED":
                self.objects.pop(obj.metadata.name, None)
            else:
                self.objects[obj.metadata.name] = obj
            self.position = rv
        else:
            raise ValueError(f"unknown watch event type {kind!r}")
        self.changed()


def _status_code(body: bytes, default: int) -> int:
    try:
        code = msgspec.json.decode(body).get("code", default)
    except (msgspec.DecodeError, AttributeError):
        return default
    return code if isinstance(code, int) else default


def _status_message(body: bytes) -> str:
    try:
        return str(msgspec.json.decode(body).get("message", ""))
    except (msgspec.DecodeError, AttributeError):
        return body[:200].decode(errors="replace")


def _describe(e: BaseException) -> str:
    if isinstance(e, k8s_client.ApiException):
        return f"HTTP {e.status} {str(e.reason).strip()}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# -- where the API server is -----------------------------------------------------


def kubeconfig_paths(environ: Mapping[str, str]) -> list[str]:
    """The kubeconfig files a Kubernetes tool reads: those ``KUBECONFIG``
    names (a list separated by ``os.pathsep``), else ``$HOME/.kube/config``
    (``~`` is ``environ``'s HOME)."""
    home = environ.get("HOME", "")
    named = [p.strip() for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p.strip()]
    if not named:
        return [os.path.join(home, ".kube", "config")] if home else []
    return [home + p[1:] if home and (p == "~" or p.startswith("~/")) else p for p in named]


def in_a_pod(environ: Mapping[str, str], service_account_dir: str) -> str | None:
    """None in a pod, else why not (as the reference: in-cluster needs
    ``KUBERNETES_SERVICE_HOST`` and the service account's token)."""
    if not environ.get("KUBERNETES_SERVICE_HOST"):
        return "KUBERNETES_SERVICE_HOST is not set"
    if not os.path.isfile(os.path.join(service_account_dir, "token")):
        return f"no service account token at {os.path.join(service_account_dir, 'token')}"
    return None


async def load_client_configuration(
    cfg: Any,
    *,
    service_account_dir: str = SERVICE_ACCOUNT_DIR,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Fill ``cfg`` (a kubernetes_asyncio Configuration) as Kubernetes tools
    do and say from where (the API server's URL, never a credential).

    In a pod (``KUBERNETES_SERVICE_HOST`` set and the service account's token
    there) the in-cluster configuration wins.  Outside one, the kubeconfig
    (``KUBECONFIG``, else ``~/.kube/config``) through kubernetes_asyncio's
    loader: its current context's cluster (server, certificate-authority or
    insecure-skip-tls-verify) and user (token, client certificate, exec
    plugin: its token asked again once it expires).  The context's
    namespace is not read: the watched namespace is always
    ``scheduler.discovery.kubernetes.namespace``.  Neither there: an error
    saying both."""
    environ = os.environ if environ is None else environ
    not_in_pod = in_a_pod(environ, service_account_dir)
    if not_in_pod is None:
        loader = k8s_config.incluster_config.InClusterConfigLoader(
            token_filename=os.path.join(service_account_dir, "token"),
            cert_filename=os.path.join(service_account_dir, "ca.crt"),
            try_refresh_token=True,
            environ=dict(environ),
        )
        loader.load_and_set(cfg)
        return f"the in-cluster API server at {cfg.host} (service account {service_account_dir})"
    paths = kubeconfig_paths(environ)
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        where = ", ".join(paths) if paths else "none (KUBECONFIG and HOME unset)"
        raise ConfigUnavailable(
            f"not in a pod ({not_in_pod}) and no kubeconfig file: {where}; "
            "set KUBECONFIG to one that names the API server"
        )
    loader = await k8s_config.load_kube_config(
        config_file=os.pathsep.join(found), client_configuration=cfg, persist_config=False
    )
    user = getattr(loader, "_user", None)
    if user is not None and "exec" in user and hasattr(loader, "token"):
        # an exec plugin's token expires (EKS, GKE: minutes): before each
        # request, the plugin again once its expirationTimestamp has passed
        # (without one, each time; the watcher makes a few requests an hour)
        async def refresh(c: Any) -> None:
            await loader.load_from_exec_plugin()
            c.api_key["BearerToken"] = loader.token

        cfg.refresh_api_key_hook = refresh
    context = (loader.current_context or {}).get("name", "")
    return (
        f"the API server at {cfg.host} from kubeconfig {os.pathsep.join(found)} "
        f"(context {context!r}; not in a pod: {not_in_pod})"
    )


class ConfigUnavailable(Exception):
    """Neither in a pod nor a kubeconfig: nowhere to find the API server."""


# -- the watcher ---------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    #: first wait after a failed list or watch, doubled up to max_backoff_s
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    #: the server ends each watch after this (timeoutSeconds); it is opened again
    watch_timeout_s: int = 300
    #: connecting, and reading a list
    request_timeout_s: float = 10.0
    #: the view is written again after this even when nothing changed (a cell
    #: Redis lost is refilled; a write refused as stale is tried again)
    resync_s: float = 30.0


class SyncTarget(Protocol):
    """What the watcher calls of :class:`scheduler.client.aio.AsyncScheduler`."""

    def sync_discovered(
        self, positions: list[int], nodes: list[tuple[str, str, bool]]
    ) -> Awaitable[tuple[bool, int, int]]: ...


class KubernetesWatcher:
    """Watch the nodes' EndpointSlices (and pods of the selectors) and keep
    the cell's node list equal to them.  ``run()`` until ``stop()``; API and
    Redis failures are logged and retried, never raised.

    In a pod it reads the service account (``SERVICE_ACCOUNT_DIR``) and
    ``KUBERNETES_SERVICE_HOST`` / ``_PORT``; outside one, the kubeconfig
    named by ``KUBECONFIG`` (else ``~/.kube/config``), as
    :func:`load_client_configuration` says; ``environ`` stands for
    ``os.environ``.  ``api_url`` (with ``token``, ``ca_file``,
    ``verify_tls``) points it elsewhere, an API server double in the
    tests."""

    def __init__(
        self,
        settings: KubernetesSettings,
        sched: SyncTarget,
        *,
        api_url: str | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        verify_tls: bool = True,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
        environ: Mapping[str, str] | None = None,
        timing: Timing | None = None,
    ) -> None:
        check_settings(settings)
        self.settings = settings
        self.sched = sched
        self.api_url = api_url
        self.token = token
        self.ca_file = ca_file
        self.verify_tls = verify_tls
        self.service_account_dir = service_account_dir
        self.environ = environ
        #: where the API client's configuration came from (set by run())
        self.source = ""
        self.timing = timing or Timing()
        self.namespace = settings.namespace.strip()
        self.port = settings.port
        self.scheme = settings.scheme.strip() or "http"
        self.streams: list[Stream] = []
        self.slices: Stream | None = None
        self.ignore: Stream | None = None
        self.no_schedule: Stream | None = None
        #: what the last write sent (positions, view) and whether it was applied
        self.written: tuple[list[int], dict[str, tuple[str, bool]], bool] | None = None
        self.applied = 0
        self.stale = 0
        self.write_failures = 0
        self.view: dict[str, tuple[str, bool]] = {}
        self._started = False
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._done = asyncio.Event()

    # -- configuration ---------------------------------------------------------
    async def _configuration(self) -> Any:
        cfg = k8s_client.Configuration()
        if self.api_url:
            cfg.host = self.api_url.rstrip("/")
            if self.token:
                cfg.api_key = {"BearerToken": self.token}
                cfg.api_key_prefix = {"BearerToken": "Bearer"}
            if self.ca_file:
                cfg.ssl_ca_cert = self.ca_file
            cfg.verify_ssl = self.verify_tls
            self.source = f"the API server at {cfg.host} (given)"
            return cfg
        self.source = await load_client_configuration(
            cfg,
            service_account_dir=self.service_account_dir,
            environ=os.environ if self.environ is None else self.environ,
        )
        return cfg

    @property
    def target(self) -> str:
        return self.source or self.api_url or "the in-cluster API server"

    # -- running ---------------------------------------------------------------
    async def run(self) -> None:
        """Watch until :meth:`stop`; never raises for the API server or Redis."""
        self._started = True
        try:
            delay = self.timing.backoff_s
            while not self._stopping.is_set():
                try:
                    cfg = await self._configuration()
                    break
                except Exception as e:  # (not in a pod, or its service account unreadable)
                    log.error("kubernetes discovery cannot configure its API client: %s", e)
                    if await self._wait_stop(delay):
                        return
                    delay = min(delay * 2, self.timing.max_backoff_s)
            else:
                return
            async with k8s_client.ApiClient(cfg) as api:
                await self._run(api)
            if str(cfg.host).startswith("https:"):
                # (aiohttp closes TLS connections a moment after its session:
                # its documented wait, so none is left open when the loop ends)
                await asyncio.sleep(0.25)
        finally:
            self._done.set()

    async def _run(self, api: Any) -> None:
        s = self.settings
        discovery = k8s_client.DiscoveryV1Api(api)
        core = k8s_client.CoreV1Api(api)
        slices = msgspec.json.Decoder(EndpointSlice).decode
        pods = msgspec.json.Decoder(Pod).decode
        self.slices = Stream(
            "endpointslices",
            discovery.list_namespaced_endpoint_slice,
            self.namespace,
            f"{SERVICE_NAME_LABEL}={s.service_name.strip()}",
            slices,
            self._changed.set,
            self.timing,
        )
        self.streams = [self.slices]
        if s.ignore_pod_selector.strip():
            self.ignore = Stream(
                "pods (ignore_pod_selector)",
                core.list_namespaced_pod,
                self.namespace,
                s.ignore_pod_selector.strip(),
                pods,
                self._changed.set,
                self.timing,
            )
            self.streams.append(self.ignore)
        if s.no_schedule_pod_selector.strip():
            self.no_schedule = Stream(
                "pods (no_schedule_pod_selector)",
                core.list_namespaced_pod,
                self.namespace,
                s.no_schedule_pod_selector.strip(),
                pods,
                self._changed.set,
                self.timing,
            )
            self.streams.append(self.no_schedule)
        log.info(
            "kubernetes discovery: watching EndpointSlices of %s/%s (port %d) at %s",
            self.namespace,
            s.service_name.strip(),
            self.port,
            self.target,
        )
        tasks: list[asyncio.Task[Any]] = [asyncio.create_task(st.run()) for st in self.streams]
        tasks.append(asyncio.create_task(self._write_loop()))
        stopping: asyncio.Task[Any] = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    log.error("kubernetes discovery stopped: %r", t.exception())
        finally:
            for t in [stopping, *tasks]:
                t.cancel()
            await asyncio.gather(stopping, *tasks, return_exceptions=True)

    async def stop(self) -> None:
        """End :meth:`run` (and wait for it, if it runs)."""
        self._stopping.set()
        if self._started:
            await self._done.wait()

    async def _wait_stop(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        return True

    # -- writing ---------------------------------------------------------------
    def positions(self) -> list[int] | None:
        """Each stream's position (a stream without a selector: the slices'),
        or None until every stream has listed once."""
        if self.slices is None or any(st.position is None for st in self.streams):
            return None
        base = self.slices.position
        assert base is not None
        return [
            base,
            base if self.ignore is None else self.ignore.position or 0,
            base if self.no_schedule is None else self.no_schedule.position or 0,
        ]

    def compute(self) -> dict[str, tuple[str, bool]]:
        assert self.slices is not None
        active, lingering = nodes_from_slices(self.slices.objects.values(), self.port, self.scheme)
        return discovered_view(
            active,
            lingering,
            self.ignore.objects if self.ignore else (),
            self.no_schedule.objects if self.no_schedule else (),
        )

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last = -float("inf")
        delay = self.timing.backoff_s
        while True:
            due = last + self.timing.resync_s - loop.time()
            if due > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), due)
            self._changed.clear()
            positions = self.positions()
            if positions is None:
                last = loop.time()  # (nothing to write before every stream listed)
                continue
            view = self.compute()
            if loop.time() - last < self.timing.resync_s and self.written is not None:
                # (an applied view is not written again for a bookmark: only
                # once it changes, or at the resync; a refused one is tried
                # again when the watches have moved on)
                was_positions, was_view, was_applied = self.written
                if view == was_view and (was_applied or positions == was_positions):
                    continue
            nodes = [(i, e, ling) for i, (e, ling) in sorted(view.items())]
            try:
                applied, changed, removed = await self.sched.sync_discovered(positions, nodes)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # (Redis down, or a node Redis refuses)
                self.write_failures += 1
                log.warning(
                    "kubernetes discovery: writing %d nodes to Redis failed: %s; retrying in %.1fs",
                    len(nodes),
                    e,
                    delay,
                )
                self.written = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.timing.max_backoff_s)
                self._changed.set()
                continue
            delay = self.timing.backoff_s
            last = loop.time()
            self.written = (positions, view, applied)
            if applied:
                self.applied += 1
                if view != self.view or changed or removed:
                    log.info(
                        "kubernetes discovery: %d nodes (%d lingering); %d added or changed, "
                        "%d removed, at resourceVersions %s",
                        len(view),
                        sum(1 for _, ling in view.values() if ling),
                        changed,
                        removed,
                        positions,
                    )
                self.view = view
            else:
                self.stale += 1
                log.debug(
                    "kubernetes discovery: a replica wrote a fresher view; at %s this one waits",
                    positions,
                )
