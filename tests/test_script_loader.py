"""The script loader fails clearly: an include that does not exist or
includes that include each other name the file, the line and the chain of
includes that led there (not a bare KeyError or a RecursionError).  And
includes are modules: each one a block of its own, only its exports hoisted,
a name used only if an include it names exports it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduler.store.lua_modules import analyse
from scheduler.store.scripts import IncludeError, build_library


def test_an_include_cycle_names_the_chain() -> None:
    includes = {
        "a": "local A = 1\n-- @include b\n-- @exports A\n",
        "b": "\n\n-- @include a\nlocal B = 2\n-- @exports B\n",
    }
    scripts = {"op": (5, "-- header\n-- @include a\nreturn 1\n")}
    with pytest.raises(IncludeError) as e:
        build_library(includes, scripts)
    assert str(e.value) == (
        "lua/includes/b.lua line 3: include cycle: lua/op-5.lua line 2 -> "
        "lua/includes/a.lua line 2 -> lua/includes/b.lua line 3 -> lua/includes/a.lua"
    )


def test_an_include_of_itself_is_a_cycle() -> None:
    with pytest.raises(
        IncludeError,
        match=r"^lua/includes/a\.lua line 1: include cycle: "
        r"lua/op-2\.lua line 1 -> lua/includes/a\.lua line 1 "
        r"-> lua/includes/a\.lua$",
    ):
        build_library({"a": "-- @include a\n-- @exports\n"}, {"op": (2, "-- @include a\n")})


def test_a_missing_include_names_file_line_and_chain() -> None:
    includes = {"a": "local A = 1\n\n-- @include nope\n-- @exports A\n"}
    scripts = {"op": (5, "-- @include a\nreturn 1\n")}
    with pytest.raises(IncludeError) as e:
        build_library(includes, scripts)
    assert str(e.value) == (
        "lua/includes/a.lua line 3: includes 'nope', which is not in lua/includes/ "
        "(chain: lua/op-5.lua line 1 -> lua/includes/a.lua line 3)"
    )


def test_a_script_including_what_does_not_exist() -> None:
    with pytest.raises(IncludeError, match=r"^lua/op-5\.lua line 4: includes 'gone', "):
        build_library({}, {"op": (5, "\n\n\n-- @include gone\n")})


def test_shared_includes_load_once_dependencies_first() -> None:
    includes = {
        "a": "-- @exports A\nlocal A = 1\n",
        "b": "-- @exports B\n-- @include a\nlocal B = A\n",
        "c": "-- @exports C\n-- @include a\n-- @include b\nlocal C = B\n",
    }
    lib = build_library(includes, {"op": (1, "-- @include c\n-- @include b\nreturn C\n")})
    body = lib.text
    assert body.count(" A = 1") == body.count(" B = A") == body.count(" C = B") == 1
    assert body.index(" A = 1") < body.index(" B = A") < body.index(" C = B")


# -- modules ----------------------------------------------------------------
def _lib(includes: dict[str, str], script: str = "-- @include a\nreturn 1\n") -> str:
    return build_library(includes, {"op": (1, script)}).text


def test_each_include_is_a_function_returning_its_exports_as_a_table() -> None:
    text = _lib(
        {
            "a": "-- @exports f N\nlocal N = 2\nlocal helper = 3\n"
            "local function f(x) return x * N + helper end\n",
        },
        "-- @include a\nreturn f(1)\n",
    )
    body = text[text.index("\n") + 1 : text.index("redis.register_function(")]
    lines = body.splitlines()
    assert lines[:2] == ["local MOD_a = (function() -- lua/includes/a.lua", "local f, N"]
    assert "\n N = 2\n" in body and "\n function f(x)" in body  # (assigns its own)
    assert "local helper = 3" in body  # private: a local of its function
    assert "return { f = f, N = N }\nend)()\n" in body
    # the script's function binds what it uses, once, from the module's table
    assert "do (function()\nlocal f = MOD_a.f\n" in body


def test_the_main_chunk_holds_only_module_tables_and_exports_set_per_call() -> None:
    """An export assigned after load (in a function of its own include, or by
    another file) stays a local of the main chunk: a copy would go stale."""
    includes = {
        "a": "-- @exports K f C\nlocal K\nlocal C = 1\nlocal function f(k) K = k end\n",
        "b": "-- @exports g\n-- @include a\nlocal function g() C = 2 return K end\n",
    }
    text = _lib(includes, "-- @include b\nreturn g()\n")
    top = [line for line in text.splitlines() if line.startswith("local ")]
    assert top[:2] == ["local K, C", "local MOD_a = (function() -- lua/includes/a.lua"]
    # (b binds nothing from a's table: K and C are the main chunk's)
    assert "local MOD_b = (function() -- lua/includes/b.lua\nlocal g\n" in text
    assert "MOD_a.K" not in text and "MOD_a.C" not in text


@pytest.mark.real_only
def test_modules_load_and_answer_in_redis(redis_client: Any) -> None:
    """The built library runs: a script reads an export a function of its
    include set at call time (kept in the main chunk), functions forward-declared
    inside one include call each other, and each module binds what it uses."""
    includes = {
        "a": "-- @exports ARGV bind_call twice\nlocal ARGV\n"
        "local function bind_call(keys, args) ARGV = args return {} end\n"
        "local function twice(x) return 2 * x end\n",
        "b": "-- @exports total b_later\n-- @include a\n"
        "local function total(x) return b_later(x) + tonumber(ARGV[1]) end\n"
        "local function b_later(x) return twice(x) end\n",
    }
    lib = build_library(includes, {"op": (0, "-- @include b\nreturn total(tonumber(ARGV[2]))\n")})
    text = lib.text
    redis_client.execute_command("FUNCTION", "LOAD", "REPLACE", text)
    try:
        assert redis_client.execute_command("FCALL", lib.functions["op"], 0, 5, 20) == 45
        assert redis_client.execute_command("FCALL", lib.functions["op"], 0, 7, 1) == 9
    finally:
        redis_client.execute_command("FUNCTION", "DELETE", lib.name)


def test_a_private_name_is_not_visible_to_another_include() -> None:
    includes = {
        "a": "-- @exports A\nlocal A = 1\nlocal hidden = 2\n",
        "b": "-- @exports B\n-- @include a\n\nlocal B = A + hidden\n",
    }
    with pytest.raises(IncludeError) as e:
        _lib(includes, "-- @include b\nreturn B\n")
    assert str(e.value) == (
        "lua/includes/b.lua line 4: uses 'hidden', which no include it names exports "
        "(chain: lua/op-1.lua line 1)"
    )


def test_an_export_of_an_include_not_named_is_refused() -> None:
    includes = {
        "a": "-- @exports A\nlocal A = 1\n",
        "b": "-- @exports B\nlocal B = A\n",
    }
    with pytest.raises(IncludeError) as e:
        _lib(includes, "-- @include a\n-- @include b\nreturn B\n")
    assert str(e.value) == (
        "lua/includes/b.lua line 2: uses 'A', an export of lua/includes/a.lua, which it "
        "does not include (chain: lua/op-1.lua line 2)"
    )


def test_what_an_include_names_it_sees_through_them() -> None:
    includes = {
        "a": "-- @exports A\nlocal A = 1\n",
        "b": "-- @exports B\n-- @include a\nlocal B = A\n",
        "c": "-- @exports C\n-- @include b\nlocal C = A + B\n",
    }
    assert " C = A + B" in _lib(includes, "-- @include c\nreturn C\n")


def test_a_script_uses_only_what_its_includes_export() -> None:
    includes = {"a": "-- @exports A\nlocal A = 1\nlocal B = 2\n"}
    with pytest.raises(IncludeError, match=r"^lua/op-1\.lua line 3: uses 'B', which no include"):
        _lib(includes, "-- @include a\nlocal x = A\nreturn x + B\n")
    with pytest.raises(IncludeError, match=r"^lua/op-1\.lua line 1: uses 'nope', "):
        _lib(includes, "return nope(string.len(KEYS[1]))\n")


def test_an_export_must_be_declared_at_the_top_level() -> None:
    includes = {"a": "-- @exports A G\nlocal A = 1\ndo local G = 2 end\n"}
    with pytest.raises(IncludeError) as e:
        _lib(includes)
    assert str(e.value) == (
        "lua/includes/a.lua: exports G, which it does not declare with a top-level local "
        "(chain: lua/op-1.lua line 1)"
    )


def test_one_local_statement_may_not_mix_exported_and_private() -> None:
    with pytest.raises(IncludeError, match=r"^lua/includes/a\.lua line 3: one local statement "):
        _lib({"a": "-- @exports A\n\nlocal A, b = 1, 2\n"})


def test_two_includes_may_not_export_one_name() -> None:
    includes = {"a": "-- @exports X\nlocal X = 1\n", "b": "-- @exports X\nlocal X = 2\n"}
    with pytest.raises(IncludeError, match=r"^lua/includes/b\.lua: exports 'X', which "):
        _lib(includes, "-- @include a\n-- @include b\nreturn X\n")


def test_an_include_without_exports_is_refused_beside_modules() -> None:
    includes = {"a": "-- @exports A\nlocal A = 1\n", "b": "local B = 2\n"}
    with pytest.raises(IncludeError, match=r"^lua/includes/b\.lua: declares no exports"):
        _lib(includes, "-- @include a\n-- @include b\nreturn A\n")


def test_a_revision_before_modules_is_inlined_flat() -> None:
    """(``bench versus`` builds older revisions' includes, which declare no exports.)"""
    text = _lib({"a": "local A = 1\n"}, "-- @include a\nreturn A\n")
    assert "local A = 1\n" in text and "do -- lua/includes/a.lua" not in text


def test_scopes_the_checker_reads() -> None:
    """Parameters, for variables, locals, methods, table keys and fields are
    not free names; what is used and not declared in scope is."""
    free = analyse(
        "local t = { a = 1, [k] = 2 }\n"
        "local function f(x, ...) return x + t.a + select('#', ...) end\n"
        "for i, v in ipairs(t) do f(i, v) end\n"
        "for j = 1, 3 do local y = j end\n"
        "function t:m() return self.a + y end\n"
        "local s = [[ not a name ]] .. 'nor this' -- nor this\n"
        "repeat local z = 1 until z\n"
    ).free
    assert sorted(free) == ["ipairs", "k", "select", "y"]


def test_assignments_the_checker_reads() -> None:
    """Assignments to free or top-level names, with where they run; not to a
    local of a block or function, nor to a field, nor a table key."""
    names = analyse(
        "local A, B\n"
        "A = 1\n"
        "local function f(x) local c; c, B = 1, 2; x = 3; t.u, G = 4, 5 end\n"
        "function H() return { A = 1 } end\n"
        "local y = z, w\n"
        "if q then r[1], S = 1, 2 end\n"
        "return A, B\n"
    )
    got = [(a.name, a.line, a.in_function, a.free) for a in names.assigned]
    assert got == [
        ("A", 2, False, False),
        ("B", 3, True, False),
        ("G", 3, True, True),
        ("H", 4, False, True),
        ("S", 6, False, True),
    ]


# -- record layouts --------------------------------------------------------
def test_a_layout_field_is_its_position_in_the_built_text() -> None:
    includes = {
        "a": "-- @exports R S\n-- @layout R\nlocal R = { 'x', 'y',\n  'z' }\n"
        "-- @layout S\nlocal S = { R.z, R.x }\n",
    }
    text = _lib(includes, "-- @include a\nlocal v = {}\nreturn v[R.y] .. v[#R + S.x]\n")
    assert "return v[2] .. v[#R + 2]" in text
    assert " S = { 3, 1 }" in text  # (S holds positions in R, named by R's fields)


def test_a_field_a_layout_does_not_hold_is_refused() -> None:
    includes = {"a": "-- @exports R\n-- @layout R\nlocal R = { 'x', 'y' }\n"}
    with pytest.raises(IncludeError, match=r"^lua/op-1\.lua line 3: R has no field 'w'$"):
        _lib(includes, "-- @include a\nlocal v = {}\nreturn v[R.w]\n")


def test_a_layout_must_be_a_list_of_names() -> None:
    with pytest.raises(IncludeError, match=r"^lua/includes/a\.lua line 3: layout R holds '7'"):
        _lib({"a": "-- @exports R\n-- @layout R\nlocal R = { 'x', 7 }\n"})
    with pytest.raises(IncludeError, match=r"^lua/includes/a\.lua line 2: @layout R must precede"):
        _lib({"a": "-- @exports R\n-- @layout R\nlocal Q = { 'x' }\nlocal R = {}\n"})


def test_a_layout_inside_a_block_is_refused() -> None:
    """The loader resolves only top-level layouts; one declared inside a
    block would read every field as nil at run time, silently."""
    script = (
        "-- @include a\nif ARGV[1] then\n  -- @layout L\n  local L = { 'x' }\n"
        "  local v = redis.call('HMGET', KEYS[1], unpack(L))\n  return v[L.x]\nend\n"
    )
    with pytest.raises(IncludeError, match=r"^lua/op-1\.lua line 3: @layout inside a block"):
        _lib({"a": "-- @exports K\nlocal K = 1\n"}, script)


def test_no_lua_file_reads_a_record_by_number() -> None:
    """Records read with a layout are read by name: no ``prev[17]`` or
    ``v[o + 5]``, and no layout indexed by a number."""
    from scheduler.store.lua_modules import layouts
    from scheduler.store.scripts import _files

    includes, scripts = _files()
    known = {n for name, t in includes.items() for n in layouts(t, name)}
    assert {"PREV", "HB_NODE_AT", "NODE_FIELDS", "RES_READ"} <= known
    texts = {**includes, **{name: t for name, (_, t) in scripts.items()}}
    for name, text in texts.items():
        code = "\n".join(line.split("--")[0] for line in text.splitlines())
        assert not re.findall(r"\bprev\[\d", code), name
        assert not re.findall(r"\[o \+ \d", code), name
        for layout in known:
            assert not re.findall(rf"\b{layout}\[\d", code), (name, layout)


#: the files whose HMGET replies are read by name (issue 27): every include
#: that reads a record, and every script (none is left out)
BY_NAME_INCLUDES = [
    *("index_bucket", "index_moves", "index_pick", "stages", "common"),
    *("nodes", "peers", "cpu_config", "snapshot"),
    *("schedule", "locality"),
    *("heartbeat", "heartbeat_steady", "bindings"),
]
NOT_YET_SCRIPTS: list[str] = []
#: `v = redis.call('HMGET', ...)`, `prev = prev or ...`, `f(id, redis.call(...))`;
#: not `a, b = unpack(redis.call('HMGET', ...))`: named locals
_HMGET = re.compile(r"\b(\w+) = (?:\1 or )?(?:(?!unpack\()\w+\()?redis\.call\('HMGET'")


def _code(text: str) -> str:
    return "\n".join(line.split("--")[0] for line in text.splitlines())


def test_hmget_replies_are_read_by_name_in_the_converted_files() -> None:
    """In the files converted, what an HMGET answers is read through a layout
    (``r[RES_READ.state]``), never by position (``r[1]``, ``v[o + 5]``): the
    loader resolves the names to the same positions."""
    from scheduler.store.scripts import _files

    includes, scripts = _files()
    texts = {f"lua/includes/{n}.lua": includes[n] for n in BY_NAME_INCLUDES}
    texts |= {f"lua/{n}-{k}.lua": t for n, (k, t) in scripts.items() if n not in NOT_YET_SCRIPTS}
    replies = 0
    for where, text in texts.items():
        code = _code(text)
        for var in set(_HMGET.findall(code)):
            replies += 1
            positional = re.findall(rf"\b{var}\[(\d+|\w+ *[-+] *\d+)\]", code)
            assert not positional, f"{where}: {var}[{positional[0]}], not read by name"
            assert re.search(rf"\b{var}\[[A-Z_]+\.\w+\]", code), f"{where}: {var} by no layout"
    assert replies >= 15  # (the check sees the reads it is about)


def test_unpack_of_a_field_list_is_folded_and_its_layout_dropped() -> None:
    """``redis.call('HMGET', k, unpack(L))`` is built as the fields spelled out
    (no unpack at run time); a script's layout it then no longer reads goes
    (no table made per call); an unpack that is not a call's last argument
    (one value) stays as written."""
    includes = {"a": "-- @exports K\nlocal K = 1\n"}
    script = (
        "-- @include a\n-- @layout L\nlocal L = { 'x', 'y' }\n"
        "local v = redis.call('HMGET', KEYS[1], unpack(L))\nreturn v[L.y]\n"
    )
    text = _lib(includes, script)
    assert "local v = redis.call('HMGET', KEYS[1], 'x', 'y')\nreturn v[2]\n" in text
    assert "local L" not in text and "unpack" not in text
    kept = script.replace("unpack(L))", "unpack(L), 'z')")
    assert "unpack(L), 'z')" in _lib(includes, kept) and "local L = {" in _lib(includes, kept)


def test_the_ctx_constructor_fills_its_layout_in_order() -> None:
    """ctx is an array read by name (the layout CTX): each slot of the
    constructor names the field it fills, in the layout's order."""
    from scheduler.store.lua_modules import layouts
    from scheduler.store.scripts import _files

    text = _files()[0]["ctx"]
    fields = layouts(text, "ctx")["CTX"]
    body = text[text.index("local function new_ctx()") :]
    slots = re.findall(r"^    [^-\n]+, -- ctx\[CTX\.(\w+)\]", body, re.M)
    assert slots == fields


def test_only_server_ms_reads_a_time_reply() -> None:
    """TIME answers seconds and microseconds; one function (server_ms,
    lua/includes/base.lua) turns them into ms, and no other Lua line calls
    TIME or reads its fields."""
    from scheduler.store.scripts import _files

    includes, scripts = _files()
    texts = {f"lua/includes/{n}.lua": t for n, t in includes.items()}
    texts |= {f"lua/{n}-{k}.lua": t for n, (k, t) in scripts.items()}
    calls = {where: _code(t).count("'TIME'") for where, t in texts.items()}
    assert {where: n for where, n in calls.items() if n} == {"lua/includes/base.lua": 1}
    base = _code(includes["base"])
    body = base[base.index("local function server_ms()") :]
    assert body.index("'TIME'") < body.index("\nend")


#: the longest line a Lua file may have (the Python files' limit, pyproject.toml)
LUA_LINE = 100


def test_no_lua_line_is_longer_than_the_python_limit() -> None:
    """Every line of lua/ (scripts and includes, comments too) fits in
    LUA_LINE characters, as ruff holds the Python files to."""
    from importlib import resources

    root = resources.files("scheduler.lua")
    files = {f"lua/{f.name}": f for f in root.iterdir() if f.name.endswith(".lua")}
    includes = root / "includes"
    files |= {f"lua/includes/{f.name}": f for f in includes.iterdir() if f.name.endswith(".lua")}
    assert len(files) > 40  # (the check sees the files it is about)
    long = [
        f"{where}:{i}: {len(line)} characters"
        for where, f in sorted(files.items())
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if len(line) > LUA_LINE
    ]
    assert not long, "\n".join(long)


def test_the_token_cache_changes_no_built_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """sources() and build_library() tokenise each distinct text once
    (lua_modules.token_cache); what they build is the same text as without
    it, and nothing is kept once they return."""
    from scheduler.store import lua_modules
    from scheduler.store.scripts import _files, _sources

    read: list[str] = []
    plain = lua_modules._tokens

    def counted(text: str) -> tuple[lua_modules.Token, ...]:
        read.append(text)
        return plain(text)

    monkeypatch.setattr(lua_modules, "_tokens", counted)

    def build() -> tuple[dict[str, tuple[int, str]], str]:
        read.clear()
        lua_modules.analyse.cache_clear()
        lua_modules._layouts.cache_clear()
        with lua_modules.token_cache():
            scripts = _sources()
        return scripts, build_library(*_files()).text

    cached = build()
    # (once per text in each of the two builds)
    assert len(read) <= 2 * len(set(read))
    assert lua_modules._TOKENS.get() is None
    monkeypatch.setattr(lua_modules, "CACHE_TOKENS", False)
    assert build() == cached
    assert len(read) > 2 * len(set(read))
