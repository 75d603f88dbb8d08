"""Lua scripts as package data, in an explicit registry per client.

Each ``lua/<name>-<nkeys>.lua`` may say ``-- @include <file>``; the line
brings in ``lua/includes/<file>.lua`` (BullMQ's convention).  Includes may
include others; each file is emitted once, dependencies first, as a module
(:mod:`scheduler.store.lua_modules`): a function run once at load that binds
what it uses from the tables of the modules it names and returns its
``-- @exports`` as its own table; each script's function binds the same way
what it uses.  One include
is written here rather than read: ``constants``, the Python tables as Lua
(:mod:`scheduler.store.lua_constants`).  A missing include, an include cycle, an
export not declared or a name used that no named include exports is an
:class:`IncludeError` naming the file, the line and the chain of includes.

The scripts reach Redis in one of two forms, built from the same files:

* **A function library** (Redis 7 ``FUNCTION LOAD``, called with ``FCALL``):
  every include once, then one ``redis.register_function`` per script whose
  body is the script file, with its :data:`FLAGS` (``no-writes`` for the
  reads).  Redis defines the helpers and constant tables once, when the
  library loads, instead of on every call as it does for a
  script sent by ``EVALSHA``; that was about 30 us of every call.  The
  library and function names carry a hash of the library text, so replicas
  of different versions sharing one Redis each call their own code.
* **One script per operation** (``EVALSHA`` through redis-py's ``Script``,
  reloaded on NOSCRIPT), for a server without functions (Redis < 7).

Includes therefore never read ``KEYS`` / ``ARGV`` at load time: ``bind_call``
(includes/base.lua) binds them on entry and returns the call's context, which
every script names ``ctx`` (includes/ctx.lua) and passes to what reads or
writes per-call state.  The registry picks the form on its first call
(``FCALL``; on "Function not found" it loads the library, and a server that
knows no ``FCALL`` / ``FUNCTION``, or a user whose ACL denies them, gets the
scripts), and loads the library
again whenever the server lost it (``FUNCTION FLUSH``, a restart without
persistence).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis

from scheduler.store import lua_modules
from scheduler.store.cluster import is_cluster_client
from scheduler.store.wire import ScriptWire, WireDown, usable

_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.M)
SCRIPT_NAME = re.compile(r"^(?P<name>[a-z_]+)-(?P<nkeys>\d+)\.lua$")
#: Errors that mean "this server has no functions": fall back to EVALSHA.
_NO_FUNCTIONS = ("unknown command", "unknown subcommand")

FUNCTION = "function"
EVAL = "eval"
#: The name of the call's context in every script (includes/ctx.lua): the
#: value ``bind_call`` returns.
CTX = "ctx"

#: Functions registered with flags: the read-only ones carry ``no-writes``, so
#: Redis runs them while it refuses writes (OOM at maxmemory, ``CLIENT PAUSE
#: WRITE``, a replica mid-failover); a write inside one is an error.  LookupNode,
#: GetNode and the list calls are these.  (The EVALSHA form has no flags: a
#: Redis without functions knows no shebang, and runs scripts as before.)
FLAGS: dict[str, tuple[str, ...]] = {
    name: ("no-writes",)
    for name in (
        "lookup",
        "nodes_view",
        "observed",
        "peer_list",
        "peer_members",
        "reservations",
        "stats",
    )
}


@dataclass(frozen=True)
class Library:
    name: str
    text: str
    #: script name -> function name
    functions: dict[str, str]


class IncludeError(Exception):
    """An include that does not exist, or includes that include each other."""


def generated_includes() -> dict[str, str]:
    """The includes written here, not read from lua/includes/."""
    from scheduler.store import lua_constants  # (it reads the tables the client modules define)

    return {lua_constants.NAME: lua_constants.render()}


@cache
def _files() -> tuple[dict[str, str], dict[str, tuple[int, str]]]:
    """(include name -> text, script name -> (number of KEYS, text))."""
    root = resources.files("scheduler.lua")
    includes = {
        f.name[:-4]: f.read_text() for f in (root / "includes").iterdir() if f.name.endswith(".lua")
    }
    includes.update(generated_includes())
    scripts: dict[str, tuple[int, str]] = {}
    for entry in root.iterdir():
        m = SCRIPT_NAME.match(entry.name)
        if m:
            scripts[m.group("name")] = (int(m.group("nkeys")), entry.read_text())
    return includes, scripts


def _include_path(name: str) -> str:
    return f"lua/includes/{name}.lua"


def _order(
    text: str,
    includes: dict[str, str],
    out: list[str],
    where: str = "a script",
    chain: tuple[tuple[str, int], ...] = (),
    chains: dict[str, tuple[tuple[str, int], ...]] | None = None,
) -> list[str]:
    """Append the includes ``text`` (the file ``where``) needs to ``out``,
    dependencies first, once each.  ``chain``: the (file, line) includes that
    led here; ``chains`` gets the first chain that led to each include."""
    for m in _INCLUDE.finditer(text):
        name = m.group(1)
        here = (*chain, (where, text.count("\n", 0, m.start()) + 1))
        path = _include_path(name)
        steps = " -> ".join(f"{f} line {n}" for f, n in here)
        if path in (f for f, _ in here):
            raise IncludeError(f"{where} line {here[-1][1]}: include cycle: {steps} -> {path}")
        if name not in includes:
            raise IncludeError(
                f"{where} line {here[-1][1]}: includes {name!r}, which is not "
                f"in lua/includes/ (chain: {steps})"
            )
        if name not in out:
            if chains is not None:
                chains.setdefault(name, here)
            _order(includes[name], includes, out, path, here, chains)
            if name not in out:
                out.append(name)
    return out


def _script_path(name: str, nkeys: int) -> str:
    return f"lua/{name}-{nkeys}.lua"


def _strip(text: str) -> str:
    return _INCLUDE.sub("", text)


def _steps(chain: tuple[tuple[str, int], ...]) -> str:
    return " -> ".join(f"{f} line {n}" for f, n in chain)


def _modular(includes: dict[str, str]) -> bool:
    """Do these includes declare exports?  (A revision from before modules,
    built by ``bench versus``, declares none: it is inlined flat, as then.)"""
    return any(
        lua_modules.exports(text) is not None
        for name, text in includes.items()
        if name not in generated_includes()
    )


class _Modules:
    """The includes of one build as modules (see :mod:`scheduler.store.lua_modules`):
    each one's exports, checked, and its block."""

    def __init__(self, includes: dict[str, str]) -> None:
        self.includes = includes
        self.chains: dict[str, tuple[tuple[str, int], ...]] = {}
        self.exports: dict[str, list[str]] = {}
        self.owner: dict[str, str] = {}  # exported name -> include
        self.checked: set[str] = set()
        #: record layouts (`-- @layout`): NAME -> its fields, by position
        self.layouts: dict[str, list[str]] = {}
        #: the layouts of field names: NAME -> its fields as Lua strings
        self.lists: dict[str, list[str]] = {}
        for name, text in includes.items():
            try:
                found = lua_modules.layouts(text, _include_path(name))
                self.lists.update(lua_modules.field_lists(text, _include_path(name)))
            except lua_modules.ExportError as e:
                raise IncludeError(str(e)) from None
            for layout in found:
                if layout in self.layouts:
                    raise IncludeError(
                        f"{_include_path(name)}: layout {layout} is declared by another include too"
                    )
            self.layouts.update(found)
        #: exports assigned after their include loaded: kept as locals of the
        #: main chunk (a copy bound in another module would go stale)
        self.mutable: set[str] = set()

    def find_mutable(self, texts: Sequence[tuple[str | None, str]]) -> None:
        """Mark the exports that (include name or None for a script, text)
        assign after their include's own top level: in a function, or from
        another file."""
        homes: dict[str, str] = {}
        for name, text in self.includes.items():
            for n in lua_modules.exports(text) or ():
                homes.setdefault(n, name)
        for own, text in texts:
            try:
                assigned = lua_modules.analyse(text).assigned
            except lua_modules.LuaSyntaxError:
                continue  # (reported with its file and line by check())
            for a in assigned:
                home = homes.get(a.name)
                if home is None:
                    continue
                if (home == own and a.in_function) or (home != own and a.free):
                    self.mutable.add(a.name)

    def named(
        self, text: str, where: str, keep: Sequence[str] = (), source: str | None = None
    ) -> str:
        """``text`` with its layout fields resolved to positions, the field
        lists it unpacks spelled out, and the layouts it then no longer reads
        dropped (but for ``keep``: an include's exports; ``source``: the
        file as written, when ``text`` is its body with exports hoisted)."""
        try:
            own = lua_modules.layouts(source or text, where)
            known = {**self.layouts, **own}
            lists = {**self.lists, **lua_modules.field_lists(source or text, where)}
            out = lua_modules.substitute(text, known, where, lists)
        except lua_modules.ExportError as e:
            raise IncludeError(str(e)) from None
        return lua_modules.drop_folded(out, frozenset(keep)) if own else out

    def order(self, text: str, where: str) -> list[str]:
        """The includes file ``where`` needs, dependencies first; each checked
        the first time it is reached."""
        needed = _order(text, self.includes, [], where, (), self.chains)
        for name in needed:
            if name not in self.exports:
                self._declare(name)
        for name in needed:
            if name not in self.checked:
                self.checked.add(name)
                self.check(self.includes[name], _include_path(name), self.chains[name], name)
        return needed

    def _declare(self, name: str) -> None:
        path = _include_path(name)
        names = lua_modules.exports(self.includes[name])
        if names is None:
            raise IncludeError(
                f"{path}: declares no exports (a header line `-- @exports name ...`; "
                f"chain: {_steps(self.chains[name])})"
            )
        for n in names:
            if n.startswith(MODULE_PREFIX):
                raise IncludeError(
                    f"{path}: exports {n!r}: names starting {MODULE_PREFIX} are the "
                    f"loader's (chain: {_steps(self.chains[name])})"
                )
            other = self.owner.get(n)
            if other is not None and other != name:
                raise IncludeError(
                    f"{path}: exports {n!r}, which {_include_path(other)} exports too "
                    f"(chain: {_steps(self.chains[name])})"
                )
            self.owner[n] = name
        self.exports[name] = names

    def visible(self, text: str) -> set[str]:
        """The exports of the includes ``text`` names, and of those they name."""
        seen: set[str] = set()
        todo = _INCLUDE.findall(text)
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += _INCLUDE.findall(self.includes[name])
        return {n for name in seen for n in self.exports[name]}

    def check(
        self,
        text: str,
        where: str,
        chain: tuple[tuple[str, int], ...],
        own: str | None = None,
        script: bool = False,
    ) -> None:
        """Every name ``text`` uses and does not declare is a global or an
        export of what it includes (a script also sees its ``ctx``)."""
        try:
            free = lua_modules.analyse(text).free
        except lua_modules.LuaSyntaxError as e:
            raise IncludeError(f"{where} {e}") from None
        allowed = self.visible(text) | lua_modules.GLOBALS
        if own is not None:
            allowed |= set(self.exports[own])  # (hoisted: in scope from its start)
        if script:
            allowed.add(CTX)
        for name, line in free.items():
            if name not in allowed:
                home = self.owner.get(name)
                why = (
                    f"an export of {_include_path(home)}, which it does not include"
                    if home is not None
                    else "which no include it names exports"
                )
                steps = f" (chain: {_steps(chain)})" if chain else ""
                raise IncludeError(f"{where} line {line}: uses {name!r}, {why}{steps}")

    def binds(self, text: str, own: str | None = None) -> dict[str, list[str]]:
        """The exports of the includes ``text`` names (directly or through
        them) that it mentions and reads from their modules' tables: include
        -> names.  (Every mention, not only the free ones: a name bound and
        shadowed costs a local, one missed would be a nil global.)"""
        mentioned = lua_modules.analyse(text).mentioned
        out: dict[str, list[str]] = {}
        for n in sorted(self.visible(text) & mentioned):
            home = self.owner[n]
            if n not in self.mutable and home != own:
                out.setdefault(home, []).append(n)
        return dict(sorted(out.items()))

    def imports(self, text: str, own: str | None = None) -> str:
        """The statements that bind :meth:`binds`' names, one per module, or ""."""
        return "".join(
            f"local {', '.join(names)} = {', '.join(f'{module_table(home)}.{n}' for n in names)}\n"
            for home, names in self.binds(text, own).items()
        )

    def block(self, name: str) -> str:
        """The include as a module: its body in a function of its own, run
        once, that binds what it imports, declares its exports and returns
        them as its module's table; exports assigned after load are declared
        before it, in the main chunk."""
        path = _include_path(name)
        text = _strip(self.includes[name])
        try:
            body = lua_modules.hoisted(text, self.exports[name], path)
        except lua_modules.ExportError as e:
            raise IncludeError(f"{e} (chain: {_steps(self.chains[name])})") from None
        body = lua_modules.strip_exports(self.named(body, path, self.exports[name], text))
        shared = [n for n in self.exports[name] if n in self.mutable]
        table = [n for n in self.exports[name] if n not in self.mutable]
        head = f"local {', '.join(shared)}\n" if shared else ""
        own = f"local {', '.join(table)}\n" if table else ""
        inner = f"{self.imports(self.includes[name], name)}{own}{body}\n"
        if not table:
            return f"{head}do (function() -- {path}\n{inner}end)() end\n"
        fields = ", ".join(f"{n} = {n}" for n in table)
        return (
            f"{head}local {module_table(name)} = (function() -- {path}\n"
            f"{inner}return {{ {fields} }}\nend)()\n"
        )


def module_table(include: str) -> str:
    """The main chunk's local that holds an include's exports (those never
    assigned after load): a module's table, read once, when the library or
    script loads, by each module or script that uses them."""
    return f"{MODULE_PREFIX}{include}"


#: (an export may not start with it: see module_table)
MODULE_PREFIX = "MOD_"


def _texts(
    includes: dict[str, str], scripts: dict[str, tuple[int, str]]
) -> list[tuple[str | None, str]]:
    """(include name or None for a script, text) of every file of a build."""
    return [*includes.items(), *((None, text) for _, text in scripts.values())]


@cache
def sources() -> dict[str, tuple[int, str]]:
    """name -> (number of KEYS, standalone script for EVAL)."""
    with lua_modules.token_cache():
        return _sources()


def _sources() -> dict[str, tuple[int, str]]:
    includes, scripts = _files()
    out: dict[str, tuple[int, str]] = {}
    modular = _modular(includes)
    # which exports are assigned after load: the same for every script (the
    # analysis of every file, done once, as the blocks below are built once)
    mutable: set[str] = set()
    if modular:
        found = _Modules(includes)
        found.find_mutable(_texts(includes, scripts))
        mutable = found.mutable
    # an include's block is the same text in every script that names it: built
    # once (building one per script was most of a replica's start-up time)
    blocks: dict[str, str] = {}
    for name, (nkeys, text) in scripts.items():
        parts = ["local KEYS_IN, ARGV_IN = KEYS, ARGV\n"]
        where = _script_path(name, nkeys)
        if modular:
            mods = _Modules(includes)
            mods.mutable = mutable
            order = mods.order(text, where)
            mods.check(text, where, (), script=True)
            for inc in order:
                if inc not in blocks:
                    blocks[inc] = mods.block(inc)
                parts.append(blocks[inc])
            # (the body in a function of its own, as in the library; it
            # binds what the body uses, and bind_call, which it calls)
            parts += [
                "return (function()\n",
                mods.imports(f"{text}\nbind_call()"),
                f"local {CTX} = bind_call(KEYS_IN, ARGV_IN)\n",
                _strip(mods.named(text, where)),
                "\nend)()\n",
            ]
        else:
            order = _order(text, includes, [], where)
            parts += [_strip(includes[inc]) for inc in order]
            parts += [
                f"local {CTX} = bind_call(KEYS_IN, ARGV_IN)\nreturn (function()\n",
                _strip(text),
                "\nend)()\n",
            ]
        out[name] = (nkeys, "".join(parts))
    return out


@cache
def library() -> Library:
    """Every script as one function library (see the module docstring)."""
    return build_library(*_files())


def build_library(includes: dict[str, str], scripts: dict[str, tuple[int, str]]) -> Library:
    """The function library of these files (include name -> text, script name
    -> (number of KEYS, text)); ``bench versus`` builds another revision's."""
    with lua_modules.token_cache():
        return _build_library(includes, scripts)


def _build_library(includes: dict[str, str], scripts: dict[str, tuple[int, str]]) -> Library:
    includes = {**generated_includes(), **includes}
    needed: list[str] = []
    heads: dict[str, str] = {}  # script name -> what its function binds
    if _modular(includes):
        mods = _Modules(includes)
        mods.find_mutable(_texts(includes, scripts))
        for name, (nkeys, text) in sorted(scripts.items()):
            where = _script_path(name, nkeys)
            needed += [inc for inc in mods.order(text, where) if inc not in needed]
            mods.check(text, where, (), script=True)
        body = "".join(mods.block(inc) for inc in needed)
        # (what each script's function binds: what its body uses, and bind_call)
        heads = {name: mods.imports(f"{text}\nbind_call()") for name, (_, text) in scripts.items()}
        scripts = {
            name: (nkeys, mods.named(text, _script_path(name, nkeys)))
            for name, (nkeys, text) in scripts.items()
        }
    else:
        for name, (nkeys, text) in sorted(scripts.items()):
            _order(text, includes, needed, _script_path(name, nkeys))
        body = "".join(lua_modules.strip_exports(_strip(includes[inc])) for inc in needed)
    bodies = {name: _strip(text) for name, (_, text) in sorted(scripts.items())}
    digest = hashlib.sha1(
        (body + "".join(heads.get(n, "") + t for n, t in bodies.items())).encode()
    ).hexdigest()[:12]
    lib = f"sched_{digest}"
    functions = {name: f"{lib}_{name}" for name in bodies}
    parts = [f"#!lua name={lib}\n", body]
    for name, text in bodies.items():
        flags = ", ".join(f"'{f}'" for f in FLAGS.get(name, ()))
        register = (
            f"redis.register_function({{function_name = '{functions[name]}', "
            f"flags = {{{flags}}}, callback = function(keys, args)\n"
            f"local {CTX} = bind_call(keys, args)\n{text}\nend}})\n"
        )
        if name in heads:  # (its own function binds the exports it uses)
            register = f"do (function()\n{heads[name]}{register}end)() end\n"
        parts.append(register)
    return Library(lib, "".join(parts), functions)


def _no_functions(e: redis.exceptions.ResponseError) -> bool:
    """The server has no functions, or this user may not use them (ACL)."""
    text = str(e).lower()
    if isinstance(e, redis.exceptions.NoPermissionError):
        return "'fcall'" in text or "'function" in text
    return any(s in text for s in _NO_FUNCTIONS)


def _missing(e: redis.exceptions.ResponseError) -> bool:
    return "function not found" in str(e).lower()


def _after_load_error(e: redis.exceptions.ResponseError) -> str:
    """The mode a failed FUNCTION LOAD leaves: loaded by someone else, or no
    functions here; anything else is raised."""
    if "already exists" in str(e).lower():
        return FUNCTION
    if _no_functions(e):
        return EVAL
    raise e


def _targets(client: Any) -> list[dict[str, Any]]:
    """Where the library must be loaded: the one server, or every primary of a
    Redis Cluster one by one (any of them may serve a cell's slot, now or after
    a slot move or a failover; one that has it already says so, harmlessly).
    A primary that appears later gets it at its first "Function not found"."""
    if is_cluster_client(client):
        return [{"target_nodes": node} for node in client.get_primaries()]
    return [{}]


class _Registry:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.library = library()
        #: FUNCTION or EVAL once known; None until the first call decides
        self.mode: str | None = None
        self.scripts: dict[str, Any] = {}
        self.nkeys: dict[str, int] = {}
        #: why an ACL made this registry fall back to EVALSHA, if one did
        self.refused: str | None = None
        for name, (nkeys, text) in sources().items():
            self.scripts[name] = client.register_script(text)
            self.nkeys[name] = nkeys

    def _command(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        return ["FCALL", self.library.functions[name], len(keys), *keys, *args]

    def _load_failed(self, e: redis.exceptions.ResponseError) -> None:
        self.mode = _after_load_error(e)
        if isinstance(e, redis.exceptions.NoPermissionError):
            self.refused = str(e)

    def _evalsha_refused(self, e: redis.exceptions.NoPermissionError) -> Exception:
        """An EVALSHA refusal names the refusal that led to it, if any."""
        if self.refused is None:
            return e
        return redis.exceptions.NoPermissionError(f"{self.refused}; then {e}")

    def _answered(self, e: redis.exceptions.ResponseError) -> bool:
        """Did the function itself answer error `e`?  False when it says the
        server lacks the library (load it, retry once) or functions altogether."""
        if _missing(e) or _no_functions(e):
            return False
        self.mode = FUNCTION  # the function ran and answered an error
        return True


class ScriptRegistry(_Registry):
    """The scripts of one synchronous client."""

    def _load(self) -> None:
        for target in _targets(self.client):
            try:
                self.client.execute_command("FUNCTION", "LOAD", self.library.text, **target)
                self.mode = FUNCTION
            except redis.exceptions.ResponseError as e:
                self._load_failed(e)

    def call(self, name: str, keys: Sequence[Any], args: Sequence[Any], client: Any = None) -> Any:
        """Run script `name`; with `client` (a pipeline) only queue it."""
        if self.mode is None and client is not None:
            self._load()  # a pipeline cannot recover from "Function not found"
        if self.mode == EVAL:
            try:
                return self.scripts[name](keys=keys, args=args, client=client or self.client)
            except redis.exceptions.NoPermissionError as e:
                raise self._evalsha_refused(e) from None
        if client is not None:
            return client.execute_command(*self._command(name, keys, args))
        try:
            reply = self.client.execute_command(*self._command(name, keys, args))
        except redis.exceptions.ResponseError as e:
            if self._answered(e):
                raise
        else:
            self.mode = FUNCTION
            return reply
        self._load()  # the server lost the library (or never had it): load, retry once
        if self.mode == EVAL:
            try:
                return self.scripts[name](keys=keys, args=args, client=self.client)
            except redis.exceptions.NoPermissionError as e:
                raise self._evalsha_refused(e) from None
        return self.client.execute_command(*self._command(name, keys, args))

    def call_acked(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], replicas: int, timeout_ms: int
    ) -> tuple[Any, int]:
        """Run script `name`, then ``WAIT replicas timeout_ms`` on the same
        connection: (its reply, how many Redis replicas acknowledged it)."""
        if self.mode is None:
            self._load()
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            self.call(name, keys, args, pipe)
            pipe.execute_command("WAIT", replicas, timeout_ms)
            reply, acked = pipe.execute(raise_on_error=False)
            if (
                isinstance(reply, redis.exceptions.ResponseError)
                and attempt == 1
                and self.mode == FUNCTION
                and not self._answered(reply)
            ):
                self._load()  # the server lost the library: load it, send again
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):  # WAIT refused (an ACL without +wait)
                raise acked
            return reply, int(acked)
        raise AssertionError("unreachable")

    def __getitem__(self, name: str) -> Any:
        def run(keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None) -> Any:
            return self.call(name, keys, args, client)

        return run


class AsyncScriptRegistry(_Registry):
    """The scripts of one asyncio client.  Once the library is known to be
    loaded, FCALLs go through a lean connection (:mod:`scheduler.store.wire`) where
    the client is one plain Redis, and through redis-py when it cannot carry
    them."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.wire = ScriptWire(client) if usable(client) else None

    async def close(self) -> None:
        if self.wire is not None:
            await self.wire.close()

    async def _fcall(self, command: list[Any]) -> Any:
        if self.wire is not None and self.mode == FUNCTION:
            try:
                return await self.wire.call(command)
            except WireDown:
                pass  # not connected, or lost with the call: redis-py sends it
        return await self.client.execute_command(*command)

    async def _load(self) -> None:
        if is_cluster_client(self.client):
            await self.client.initialize()  # (knows no primaries before its first call)
        for target in _targets(self.client):
            try:
                await self.client.execute_command("FUNCTION", "LOAD", self.library.text, **target)
                self.mode = FUNCTION
            except redis.exceptions.ResponseError as e:
                self._load_failed(e)

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return await self._call(name, keys, args)
        except redis.exceptions.NoPermissionError as e:
            if self.mode != EVAL:
                raise
            raise self._evalsha_refused(e) from None

    async def _call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        if self.mode == EVAL:
            return await self.scripts[name](keys=keys, args=args)
        try:
            reply = await self._fcall(self._command(name, keys, args))
        except redis.exceptions.ResponseError as e:
            if self._answered(e):
                raise
        else:
            self.mode = FUNCTION
            return reply
        await self._load()  # the server lost the library (or never had it): load, retry once
        if self.mode == EVAL:
            return await self.scripts[name](keys=keys, args=args)
        return await self.client.execute_command(*self._command(name, keys, args))

    async def call_acked(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], replicas: int, timeout_ms: int
    ) -> tuple[Any, int]:
        """Run script `name`, then ``WAIT replicas timeout_ms`` on the same
        connection: (its reply, how many Redis replicas acknowledged it)."""
        if self.mode is None:
            await self._load()
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            if self.mode == EVAL:
                await self.scripts[name](keys=keys, args=args, client=pipe)
            else:
                pipe.execute_command(*self._command(name, keys, args))
            pipe.execute_command("WAIT", replicas, timeout_ms)
            reply, acked = await pipe.execute(raise_on_error=False)
            if (
                isinstance(reply, redis.exceptions.ResponseError)
                and attempt == 1
                and self.mode == FUNCTION
                and not self._answered(reply)
            ):
                await self._load()  # the server lost the library: load it, send again
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):  # WAIT refused (an ACL without +wait)
                raise acked
            return reply, int(acked)
        raise AssertionError("unreachable")

    def __getitem__(self, name: str) -> Any:
        def run(keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
            return self.call(name, keys, args)

        return run
