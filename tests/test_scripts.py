"""How the Lua reaches Redis: one function library (FCALL), or one script per
operation (EVALSHA) on a server without functions.  Both forms are built from
the same files; these tests hold them to the same answers."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from scheduler import (
    Limits,
    NoNodesAvailable,
    NotFound,
    Overcommit,
    Policy,
    Request,
    Scheduler,
)
from scheduler.store import lua_modules
from scheduler.store.scripts import EVAL, FUNCTION, _files, _Modules, _texts, library
from scheduler.testing.redis_server import RedisServer
from tests.helpers import fleet, hb

POLICY = Policy(limits=Limits(max_sandbox_count=4), overcommit=Overcommit(cpu=2.0))


def library_loaded(client: Any) -> bool:
    return bool(client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", library().name))


def test_the_library_loads_on_first_use_and_again_after_a_flush(make_scheduler: Any) -> None:
    s = make_scheduler(POLICY)
    assert s.scripts.mode == FUNCTION
    assert library_loaded(s.client)
    fleet(s, 2)
    s.client.execute_command("FUNCTION", "FLUSH")
    assert not library_loaded(s.client)
    assert s.schedule(Request.cold(1, 1)).node_id in ("n0", "n1")
    assert library_loaded(s.client)
    # a second client finds it loaded and only calls it
    other = Scheduler(s.client, cell="test")
    assert other.stats().reserved_total == 1
    assert other.scripts.mode == FUNCTION


def test_a_pipeline_loads_the_library_before_queueing(make_scheduler: Any) -> None:
    s = make_scheduler(POLICY)
    s.client.execute_command("FUNCTION", "FLUSH")
    fresh = Scheduler(s.client, cell="test")
    pipe = s.client.pipeline(transaction=False)
    for node_id in ("p1", "p2"):
        call = fresh.ops.heartbeat(hb(node_id))
        fresh.scripts[call.script](keys=call.keys, args=call.args, client=pipe)
    pipe.execute()
    assert sorted(n.node_id for n in fresh.nodes()) == ["p1", "p2"]


@pytest.fixture(scope="module")
def no_functions_server() -> Iterator[RedisServer]:
    """A real redis-server that knows neither FCALL nor FUNCTION, like Redis 6."""
    with RedisServer(
        extra_args=["--rename-command", "FCALL", "", "--rename-command", "FUNCTION", ""]
    ) as srv:
        yield srv


@pytest.mark.real_only
def test_a_server_without_functions_gets_the_scripts(no_functions_server: RedisServer) -> None:
    s = Scheduler.connect(no_functions_server.url, cell="old", policy=POLICY, overwrite_policy=True)
    try:
        assert s.scripts.mode == EVAL
        fleet(s, 2)
        p = s.schedule(Request.cold(1, 1))
        s.client.script_flush()  # NOSCRIPT is reloaded transparently
        assert s.assign("sb1", p.node_id, p.endpoint, p.reservation_id).reservation_id
        assert s.lookup("sb1").node_id == p.node_id
        sha = s.scripts.scripts["lookup"].sha
        assert s.client.script_exists(sha) == [True]
    finally:
        s.client.flushall()
        s.close()


@pytest.mark.real_only
def test_a_user_denied_functions_gets_the_scripts(redis_server: RedisServer) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    admin.execute_command(
        "ACL", "SETUSER", "nofn", "on", ">pw", "~*", "+@all", "-function", "-fcall", "-fcall_ro"
    )
    url = f"redis://nofn:pw@127.0.0.1:{redis_server.port}/0"
    s = Scheduler.connect(url, cell="acl", policy=POLICY, overwrite_policy=True)
    try:
        fleet(s, 2)
        assert s.schedule(Request.cold(1, 1)).node_id in ("n0", "n1")
        assert s.scripts.mode == EVAL
    finally:
        s.close()
        admin.execute_command("ACL", "DELUSER", "nofn")
        admin.flushdb()
        admin.close()


#: top-level locals the library must leave free: the main chunk holds one
#: module table per include and the exports set per call (base's keys), so a
#: new export costs none of it and a new include one
FREE_LOCALS = 150
#: locals each include's module function must leave free (what it binds from
#: the modules it names, its exports, its private top-level names)
FREE_MODULE_LOCALS = 100


def _loads_with(admin: redis.Redis, text: str, pads: int) -> bool:
    """Does the library load with `pads` more locals, live through all of it?"""
    nl = text.index("\n") + 1
    pad = "".join(f"local pad_{i} = {i}\n" for i in range(pads))
    try:
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", text[:nl] + pad + text[nl:])
    except redis.ResponseError as e:
        assert "more than 200 local variables" in str(e)
        return False
    admin.execute_command("FUNCTION", "DELETE", "headroom_check")
    return True


@pytest.mark.real_only
def test_the_library_leaves_room_below_luas_200_locals(redis_server: RedisServer) -> None:
    """Lua refuses a function of more than 200 locals ("main function has more
    than 200 local variables").  Each include is a module: a function of its
    own, run once at load, that binds what it uses from its modules' tables
    and returns its exports as its own (scheduler/store/lua_modules.py); the
    main chunk holds the module tables and the exports assigned per call.
    Prints each include's exports and its function's top-level locals, the
    main chunk's locals, and the headroom Redis measures: locals added at the
    top, live through every module, that the library still loads with."""
    includes, scripts = _files()
    mods = _Modules(includes)
    mods.find_mutable(_texts(includes, scripts))
    for name, (nkeys, text) in scripts.items():
        mods.order(text, f"lua/{name}-{nkeys}.lua")
    for name in sorted(mods.exports):
        names = mods.exports[name]
        text = includes[name]
        binds = sum(map(len, mods.binds(text, name).values()))
        top = lua_modules.analyse(text).top
        private = sum(len(loc.names) for loc in top if not set(loc.names) & set(names))
        used = binds + len(names) + private
        print(f"{name}: {len(names)} exports: {' '.join(names)}")
        print(f"  {name} function: {binds} bound + {len(names)} exports + {private} private")
        assert used <= 200 - FREE_MODULE_LOCALS, name
    shared = sorted(mods.mutable)
    top = len(shared) + sum(1 for names in mods.exports.values() if set(names) - mods.mutable)
    print(f"main chunk: {top} locals ({len(shared)} exports set per call: {' '.join(shared)})")
    lib = library()
    text = lib.text.replace(lib.name, "headroom_check")
    admin = redis.Redis.from_url(redis_server.url)
    try:
        low, high = 0, 200  # (the most that loads: in [low, high])
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if _loads_with(admin, text, mid) else (low, mid - 1)
        exports = sum(map(len, mods.exports.values()))
        print(f"main chunk: {exports} exports in all; headroom {low} locals")
        assert low >= FREE_LOCALS
        assert not _loads_with(admin, text, low + 1)
    finally:
        admin.close()


def _workload(s: Scheduler, seed: int) -> list[Any]:
    """A random mix of every kind of call; returns what each one answered."""
    rng = random.Random(seed)
    out: list[Any] = []
    nodes = [f"n{i}" for i in range(12)]
    running: dict[str, list[str]] = {n: [] for n in nodes}
    placed: list[tuple[str, str, str, str]] = []
    for n in nodes:
        out.append(s.heartbeat(hb(n, cpu=rng.choice([8, 16, 32]))))
    for step in range(300):
        op = rng.random()
        try:
            if op < 0.45:
                p = s.schedule(
                    Request.cold(rng.choice([1, 2, 4]), rng.choice([512, 2048])),
                    reservation_id=f"r{step}",
                )
                out.append(p)
                placed.append((p.node_id, p.endpoint, p.reservation_id, f"sb{step}"))
            elif op < 0.6 and placed:
                node_id, endpoint, rid, sb = placed.pop(rng.randrange(len(placed)))
                out.append(s.assign(sb, node_id, endpoint, rid))
                running[node_id].append(sb)
            elif op < 0.7 and placed:
                out.append(s.cancel(placed.pop()[2]))
            elif op < 0.9:
                n = rng.choice(nodes)
                if running[n] and rng.random() < 0.5:
                    running[n].pop(0)
                out.append(
                    s.heartbeat(
                        hb(n, cpu=16, roster=list(running[n]), sandbox_count=len(running[n]))
                    )
                )
            elif op < 0.95:
                out.append(s.explain(Request.cold(2, 1024)))
            else:
                s.advance_clock(rng.choice([1_000, 20_000]))
                out.append(sorted(s.nodes(), key=lambda v: v.node_id))
        except (NoNodesAvailable, NotFound) as e:
            out.append(str(e))
    out.append(s.stats())
    out.append(s.reservations())
    return out


@pytest.mark.real_only
@pytest.mark.parametrize("seed", [1, 2])
def test_functions_and_scripts_answer_alike(redis_client: Any, seed: int) -> None:
    a = Scheduler(redis_client, cell="as-functions")
    b = Scheduler(redis_client, cell="as-scripts")
    b.scripts.mode = EVAL
    for s in (a, b):
        s.sync_policy(POLICY, overwrite=True)
    # both cells' drill clocks frozen at the same instant
    frozen = [s.advance_clock(0, "freeze") for s in (a, b)]
    for s, t in zip((a, b), frozen, strict=True):
        s.advance_clock(max(frozen) + 1_000 - t)
    assert _workload(a, seed) == _workload(b, seed)
    assert a.scripts.mode == FUNCTION


def test_library_state_does_not_leak_between_cells(redis_client: Any) -> None:
    """The library's helpers are defined once per server; keys are bound per
    call, so interleaved calls for two cells never see each other's state."""
    x = Scheduler(redis_client, cell="x")
    y = Scheduler(redis_client, cell="y")
    x.sync_policy(Policy(limits=Limits(max_sandbox_count=1)), overwrite=True)
    y.sync_policy(Policy(limits=Limits(max_sandbox_count=2)), overwrite=True)
    fleet(x, 1)
    fleet(y, 1)
    assert x.schedule(Request.cold(1, 1)).node_id == "n0"
    assert y.schedule(Request.cold(1, 1)).node_id == "n0"
    with pytest.raises(NoNodesAvailable, match=r"at max_sandbox_count \(1\)"):
        x.schedule(Request.cold(1, 1))
    assert y.schedule(Request.cold(1, 1)).node_id == "n0"
    with pytest.raises(NoNodesAvailable, match=r"at max_sandbox_count \(2\)"):
        y.schedule(Request.cold(1, 1))
    assert (x.stats().pending, y.stats().pending) == (1, 2)


def test_script_errors_keep_their_code(make_scheduler: Any) -> None:
    s = make_scheduler(POLICY)
    with pytest.raises(redis.exceptions.ResponseError, match="BADARG"):
        s.scripts["schedule"](
            keys=s.ops.schedule(Request.cold(1, 1)).keys,
            args=["bogus", "0", "", "1", "1", "r", "0.5"],
        )


def test_a_fractional_count_from_another_writer_is_refused(make_scheduler: Any) -> None:
    """The client checks snapshot numbers; the script checks again the ones the
    placement index spells as whole numbers, for any other writer."""
    s = make_scheduler(POLICY)
    call = s.ops.heartbeat(hb("raw", allocated_cpu=2))
    args = list(call.args)
    args[args.index("allocated_cpu") + 1] = "1.5"
    with pytest.raises(
        redis.exceptions.ResponseError, match="BADARG snapshot.allocated_cpu must be a whole number"
    ):
        s.scripts["heartbeat"](keys=call.keys, args=args)
    assert not s.client.exists(s.keys.node("raw"))
    assert s.nodes() == []
