"""The script loader fails clearly: an include that does not exist or
includes that include each other name the file, the line and the chain of
includes that led there (not a bare KeyError or a RecursionError)."""

from __future__ import annotations

import pytest

from scheduler.scripts import IncludeError, build_library


def test_an_include_cycle_names_the_chain() -> None:
    includes = {"a": "local A = 1\n-- @include b\n", "b": "\n\n-- @include a\nlocal B = 2\n"}
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
        build_library({"a": "-- @include a\n"}, {"op": (2, "-- @include a\n")})


def test_a_missing_include_names_file_line_and_chain() -> None:
    includes = {"a": "local A = 1\n\n-- @include nope\n"}
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
        "a": "local A = 1\n",
        "b": "-- @include a\nlocal B = A\n",
        "c": "-- @include a\n-- @include b\nlocal C = B\n",
    }
    lib = build_library(includes, {"op": (1, "-- @include c\n-- @include b\nreturn C\n")})
    body = lib.text
    assert body.count("local A = 1") == body.count("local B = A") == body.count("local C = B") == 1
    assert body.index("local A = 1") < body.index("local B = A") < body.index("local C = B")
