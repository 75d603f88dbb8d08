"""Lua includes as modules: what each one exports, and what each one uses.

An include declares its exports in header lines ``-- @exports name ...``
(several such lines add up).  Every exported name must be declared by a
``local`` statement (or ``local function``) at the include's top level.  The
script loader (:mod:`scheduler.store.scripts`) makes each include a module: its
text in a function of its own, run once when the library (or an EVAL script)
loads, which

* binds, as its first locals, the exports it mentions of the includes it
  names (``local fail, fmt = MOD_base.fail, MOD_base.fmt``),
* declares its own exports next, and drops the ``local`` of their
  declarations (so a function may call an exported one defined below it),
* returns them as its module's table (``return { f = f, N = N }``), which
  the main chunk keeps as ``local MOD_<include>``.

A function defined in the module reads what it uses as upvalues of the
module's function: the same instruction (GETUPVAL) as an upvalue of the main
chunk, so nothing costs more per call.  The exports assigned after their
include loaded (``KEYS``, ``BASE`` ...: set per call by ``bind_call``; found by
:attr:`Names.assigned`) stay locals of the main chunk, declared before the
module, since a copy bound in another module would go stale.  So the main
chunk holds one table per include and those few exports, and Lua's limit of
200 locals per function bounds each module's own names (what it binds, its
exports, its private top-level locals), not the sum of all.

:func:`analyse` reads a file's names with a small Lua lexer and a scope
walk: the names it uses that it does not declare (free names), and its
top-level ``local`` statements.  The loader checks that every free name is a
Lua or Redis global or an export of an include the file names (directly, or
through the includes those name).  The scope walk is conservative where Lua
is subtle: the branches of one ``if`` share a scope, a ``local`` is in scope
from its own statement on, and a ``repeat`` block's locals stay in scope after
its ``until``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache

EXPORTS = re.compile(r"^-- @exports((?:[ \t]+\w+)*)[ \t]*$", re.M)

#: Names Redis's Lua 5.1 defines: the base library, its modules, Redis's own.
GLOBALS = frozenset(
    [
        "assert",
        "error",
        "ipairs",
        "next",
        "pairs",
        "pcall",
        "print",
        "rawequal",
        "rawget",
        "rawset",
        "select",
        "setmetatable",
        "getmetatable",
        "tonumber",
        "tostring",
        "type",
        "unpack",
        "xpcall",
        "loadstring",
        "string",
        "table",
        "math",
        "os",
        "coroutine",
        "_G",
        "_VERSION",
        "bit",
        "cjson",
        "cmsgpack",
        "struct",
        "redis",
        "KEYS",
        "ARGV",
    ]
)

_KEYWORDS = frozenset(
    [
        "and",
        "break",
        "do",
        "else",
        "elseif",
        "end",
        "false",
        "for",
        "function",
        "if",
        "in",
        "local",
        "nil",
        "not",
        "or",
        "repeat",
        "return",
        "then",
        "true",
        "until",
        "while",
    ]
)

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>--(?:\[(?P<ceq>=*)\[[\s\S]*?\](?P=ceq)\]|[^\n]*))
  | (?P<long>\[(?P<leq>=*)\[[\s\S]*?\](?P=leq)\])
  | (?P<string>'(?:\\[\s\S]|[^'\\\n])*'|"(?:\\[\s\S]|[^"\\\n])*")
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>\.\.\.|\.\.|==|~=|<=|>=|[-+*/%^\#<>=(){}\[\];:,.])
    """,
    re.X,
)


class LuaSyntaxError(Exception):
    """Text the lexer or the scope walk cannot read."""


@dataclass(frozen=True)
class Token:
    kind: str  # "name", "keyword", "op" or "value"
    text: str
    start: int  # offset in the file
    line: int


#: the tokens of each text read within token_cache(), or None outside it
_TOKENS: ContextVar[dict[str, tuple[Token, ...]] | None] = ContextVar("lua_tokens", default=None)
#: whether token_cache() keeps anything (a test turns it off to compare builds)
CACHE_TOKENS = True


@contextmanager
def token_cache() -> Iterator[None]:
    """Within it each distinct text is tokenised once: one build reads the
    same texts several times (the analysis, the layouts, the substitution
    and the layouts dropped, per script).  The cache goes when the outermost
    one ends: nothing grows from build to build."""
    if _TOKENS.get() is not None or not CACHE_TOKENS:
        yield
        return
    reset = _TOKENS.set({})
    try:
        yield
    finally:
        _TOKENS.reset(reset)


def tokens(text: str) -> tuple[Token, ...]:
    """The file's tokens, without spaces and comments (kept within
    token_cache(): a tuple, shared, never changed)."""
    kept = _TOKENS.get()
    if kept is None:
        return _tokens(text)
    got = kept.get(text)
    if got is None:
        got = kept[text] = _tokens(text)
    return got


def _tokens(text: str) -> tuple[Token, ...]:
    out: list[Token] = []
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise LuaSyntaxError(f"line {line}: cannot read {text[pos : pos + 20]!r}")
        kind = m.lastgroup
        if kind in ("ceq", "leq"):  # (inner groups: the outer one matched)
            kind = "comment" if m.group("comment") else "long"
        s = m.group()
        if kind == "name":
            out.append(Token("keyword" if s in _KEYWORDS else "name", s, pos, line))
        elif kind == "op":
            out.append(Token("op", s, pos, line))
        elif kind in ("long", "string", "number"):
            out.append(Token("value", s, pos, line))
        line += s.count("\n")
        pos = m.end()
    return tuple(out)


@dataclass(frozen=True)
class Local:
    """A ``local`` statement at the file's top level."""

    start: int  # offset of its ``local`` keyword
    line: int
    names: tuple[str, ...]
    #: offset past its last name when it assigns nothing (``local a, b``)
    bare_end: int | None = None


@dataclass(frozen=True)
class Assignment:
    """An assignment to a name that is free or a top-level local of the file
    (``x = 1``, ``a, x = f()``, ``function x() end``); not to a local of a
    function or block, nor to a field."""

    name: str
    line: int
    #: inside a function body: it runs at call time, not when the file loads
    in_function: bool
    #: the name is not declared in the file (else: one of its top-level locals)
    free: bool


@dataclass
class Names:
    #: names used and not declared in scope -> the first line using each
    free: dict[str, int] = field(default_factory=dict)
    #: the top-level local statements, in order
    top: list[Local] = field(default_factory=list)
    #: every name used anywhere (declared in scope or not): what the loader
    #: binds from the modules a file names, a superset of `free`
    mentioned: set[str] = field(default_factory=set)
    #: assignments to free or top-level names, in order
    assigned: list[Assignment] = field(default_factory=list)


_BLOCKS = {"function", "do", "if", "repeat"}
_OPEN = {"(": ")", "[": "]", "{": "}"}


@cache
def analyse(text: str) -> Names:
    """The free names and the top-level locals of one Lua file."""
    toks = tokens(text)
    out = Names()
    # frames: (opener, names declared in it); brackets declare nothing
    stack: list[tuple[str, set[str]]] = [("chunk", set())]
    pending: set[str] = set()  # a for's names, declared in its `do`

    def top_level() -> bool:
        return len(stack) == 1

    def declare(name: str) -> None:
        for opener, names in reversed(stack):
            if opener not in _OPEN:
                names.add(name)
                return

    def use(tok: Token) -> None:
        out.mentioned.add(tok.text)
        if any(tok.text in names for _, names in stack):
            return
        out.free.setdefault(tok.text, tok.line)

    def assign(tok: Token) -> None:
        if any(tok.text in names for _, names in stack[1:]):
            return  # (a local of a block or function)
        out.assigned.append(
            Assignment(
                tok.text,
                tok.line,
                any(opener == "function" for opener, _ in stack),
                tok.text not in stack[0][1],
            )
        )

    def text_at(j: int) -> str:
        return toks[j].text if j < len(toks) else ""

    def target(i: int) -> bool:
        """Is the name at toks[i] (at statement level) assigned: followed by
        `=`, or by `, target, ... =`?"""
        j = i + 1
        while text_at(j) == ",":
            if j + 1 >= len(toks) or toks[j + 1].kind != "name":
                return False
            j += 2
            while text_at(j) in (".", "["):  # (a field: a.b, t[k])
                if text_at(j) == ".":
                    j += 2
                    continue
                depth = 0
                while j < len(toks):
                    depth += {"[": 1, "]": -1}.get(toks[j].text, 0)
                    j += 1
                    if depth == 0:
                        break
        return text_at(j) == "="

    def pop(closer: str, line: int) -> None:
        if len(stack) == 1:
            raise LuaSyntaxError(f"line {line}: {closer!r} closes nothing")
        opener = stack.pop()[0]
        wanted = _OPEN.get(opener) or ("until" if opener == "repeat" else "end")
        if wanted != closer:
            raise LuaSyntaxError(f"line {line}: {closer!r} closes {opener!r}")

    def params(i: int) -> int:
        """Declare the parameter list at toks[i] ("("), return the index after it."""
        if toks[i].text != "(":
            raise LuaSyntaxError(f"line {toks[i].line}: a function without parameters")
        i += 1
        while toks[i].text != ")":
            if toks[i].kind == "name":
                declare(toks[i].text)
            i += 1
        return i + 1

    i = 0
    while i < len(toks):
        t = toks[i]
        prev = toks[i - 1].text if i else ""
        if t.kind == "keyword":
            if t.text == "local":
                at_top = top_level()
                if toks[i + 1].text == "function":
                    name = toks[i + 2].text
                    declare(name)
                    if at_top:
                        out.top.append(Local(t.start, t.line, (name,)))
                    stack.append(("function", set()))
                    i = params(i + 3)
                    continue
                names = [toks[i + 1].text]
                j = i + 2
                while j + 1 < len(toks) and toks[j].text == ",":
                    names.append(toks[j + 1].text)
                    j += 2
                for name in names:
                    declare(name)
                if at_top:
                    last = toks[j - 1]
                    bare = (
                        None
                        if j < len(toks) and toks[j].text == "="
                        else last.start + len(last.text)
                    )
                    out.top.append(Local(t.start, t.line, tuple(names), bare))
                i = j
                continue
            if t.text == "function":
                j = i + 1
                method = False
                if toks[j].kind == "name":  # function a.b:c(...): `a` is a use
                    use(toks[j])
                    if toks[j + 1].text == "(":  # function a(...): assigns `a`
                        assign(toks[j])
                    j += 1
                    while toks[j].text in (".", ":"):
                        method = method or toks[j].text == ":"
                        j += 2
                stack.append(("function", {"self"} if method else set()))
                i = params(j)
                continue
            if t.text == "for":
                j = i + 1
                while toks[j].text not in ("=", "in"):
                    if toks[j].kind == "name":
                        pending.add(toks[j].text)
                    j += 1
                i = j
                continue
            if t.text == "do":
                stack.append(("do", pending))
                pending = set()
            elif t.text in ("if", "repeat"):
                stack.append((t.text, set()))
            elif t.text == "end":
                pop(t.text, t.line)
            elif t.text == "until":  # (its condition sees the block's locals)
                inner = stack[-1][1]
                pop(t.text, t.line)
                stack[-1][1].update(inner)
        elif t.kind == "op":
            if t.text in _OPEN:
                stack.append((t.text, set()))
            elif t.text in (")", "]", "}"):
                pop(t.text, t.line)
        elif t.kind == "name":
            nxt = toks[i + 1].text if i + 1 < len(toks) else ""
            key = nxt == "=" and stack[-1][0] == "{"
            if prev not in (".", ":") and not key:
                use(t)
                if stack[-1][0] not in _OPEN and nxt in ("=", ",") and target(i):
                    assign(t)
        i += 1
    if len(stack) != 1:
        raise LuaSyntaxError(f"{stack[-1][0]!r} is not closed at the end of the file")
    return out


def exports(text: str) -> list[str] | None:
    """The names the file's ``-- @exports`` lines declare; None without any."""
    found = EXPORTS.findall(text)
    if not found:
        return None
    return [name for names in found for name in names.split()]


def strip_exports(text: str) -> str:
    return EXPORTS.sub("", text)


def hoisted(text: str, names: list[str], where: str) -> str:
    """The include's text with the ``local`` of its exported declarations
    dropped; an exported name without a top-level declaration, or a statement
    declaring exported and private names together, is an error naming
    ``where`` and the line."""
    wanted = set(names)
    declared: set[str] = set()
    cuts: list[tuple[int, int]] = []
    for loc in analyse(text).top:
        mine = wanted.intersection(loc.names)
        if not mine:
            continue
        if len(mine) != len(loc.names):
            private = ", ".join(n for n in loc.names if n not in wanted)
            raise ExportError(
                f"{where} line {loc.line}: one local statement declares exported "
                f"and private names ({private} not exported): split it"
            )
        declared |= mine
        # (`local a = ...` becomes `a = ...`; a bare `local a, b` goes: hoisted)
        cuts.append((loc.start, loc.bare_end or loc.start + len("local")))
    missing = [n for n in names if n not in declared]
    if missing:
        raise ExportError(
            f"{where}: exports {', '.join(missing)}, which it does not declare "
            "with a top-level local"
        )
    for start, end in reversed(cuts):
        text = text[:start] + text[end:]
    return text


class ExportError(Exception):
    """An include's exports that do not match what it declares or uses."""


LAYOUT = re.compile(r"^-- @layout (\w+)[ \t]*$", re.M)
#: a layout declared inside a block: the loader would not see it, and its
#: names would read as nil at run time (LAYOUT.field of a plain table)
NESTED_LAYOUT = re.compile(r"^[ \t]+-- @layout\b", re.M)


def layouts(text: str, where: str) -> dict[str, list[str]]:
    """The record layouts the file declares: a ``-- @layout NAME`` line, then
    ``local NAME = { ... }``, a list whose entries are field names (strings)
    or ``OTHER.field`` (a position in layout OTHER, named by that field).
    NAME -> its fields in order.  (Cached, one answer per file: a caller
    copies it, never changes it.)"""
    return _layouts(text, where)[0]


@cache
def _layouts(text: str, where: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(layouts, field_lists)."""
    out: dict[str, list[str]] = {}
    spelled: dict[str, list[str]] = {}
    nested = NESTED_LAYOUT.search(text)
    if nested:
        line = text.count("\n", 0, nested.start()) + 1
        raise ExportError(
            f"{where} line {line}: @layout inside a block; declare it at the file's top level"
        )
    toks = tokens(text)
    for m in LAYOUT.finditer(text):
        name, line = m.group(1), text.count("\n", 0, m.start()) + 1
        i = next((k for k, t in enumerate(toks) if t.start > m.start()), len(toks))
        head = [t.text for t in toks[i : i + 4]]
        if head != ["local", name, "=", "{"]:
            raise ExportError(
                f"{where} line {line}: @layout {name} must precede `local {name} = {{`"
            )
        fields: list[str] = []
        i += 4
        while toks[i].text != "}":
            t = toks[i]
            if t.kind == "value" and t.text[0] in "'\"":
                fields.append(t.text[1:-1])
                spelled.setdefault(name, []).append(t.text)
                i += 1
            elif t.kind == "name" and toks[i + 1].text == "." and toks[i + 2].kind == "name":
                fields.append(toks[i + 2].text)
                i += 3
            else:
                raise ExportError(
                    f"{where} line {t.line}: layout {name} holds {t.text!r}, "
                    "not a field name or a LAYOUT.field"
                )
            if toks[i].text == ",":
                i += 1
        if len(set(fields)) != len(fields):
            raise ExportError(f"{where} line {line}: layout {name} names a field twice")
        out[name] = fields
        if len(spelled.get(name, ())) != len(fields):
            spelled.pop(name, None)  # (it holds positions in another layout)
    return out, spelled


def field_lists(text: str, where: str) -> dict[str, list[str]]:
    """The file's layouts of field names (not of positions in another
    layout): NAME -> its fields as Lua strings, in order: what
    ``unpack(NAME)`` folds into (:func:`substitute`)."""
    return _layouts(text, where)[1]


def substitute(
    text: str,
    known: dict[str, list[str]],
    where: str,
    lists: dict[str, list[str]] | None = None,
) -> str:
    """The text with every ``LAYOUT.field`` of a known layout replaced by the
    field's position (1-based): a name in the source, a number at run time.
    A field the layout does not hold is an error naming ``where`` and the line.
    And ``, unpack(NAME))`` of a layout in ``lists`` (the last argument of a
    call: ``redis.call('HMGET', key, unpack(NAME))``) becomes its fields
    spelled out, ``, 'a', 'b')``: the same call, without unpack's."""
    toks = tokens(text)
    spans: list[tuple[int, int, str]] = []
    for i, t in enumerate(toks[:-4]):
        if (
            lists
            and i
            and t.text == "unpack"
            and toks[i - 1].text == ","
            and toks[i + 1].text == "("
            and toks[i + 2].text in lists
            and toks[i + 3].text == ")"
            and toks[i + 4].text == ")"
        ):
            close = toks[i + 3]
            spans.append((t.start, close.start + 1, ", ".join(lists[toks[i + 2].text])))
    for i, t in enumerate(toks[:-2]):
        if t.kind != "name" or t.text not in known or toks[i + 1].text != ".":
            continue
        if i and toks[i - 1].text in (".", ":"):
            continue
        field = toks[i + 2]
        fields = known[t.text]
        if field.kind != "name" or field.text not in fields:
            raise ExportError(f"{where} line {t.line}: {t.text} has no field {field.text!r}")
        spans.append((t.start, field.start + len(field.text), str(fields.index(field.text) + 1)))
    for start, end, number in sorted(spans, reverse=True):
        text = text[:start] + number + text[end:]
    return text


def drop_folded(text: str, keep: frozenset[str] = frozenset()) -> str:
    """The (substituted) text without the declaration of each layout it no
    longer reads (every ``NAME.field`` became a number, every ``unpack(NAME)``
    its fields), but for those in ``keep`` (exports): a script's layout costs
    no table per call.  Lines stay where they were."""
    toks = tokens(text)
    count: dict[str, int] = {}
    for t in toks:
        if t.kind == "name":
            count[t.text] = count.get(t.text, 0) + 1
    cuts: list[tuple[int, int]] = []
    for m in LAYOUT.finditer(text):
        name = m.group(1)
        if name in keep or count.get(name) != 1:
            continue
        i = next((k for k, t in enumerate(toks) if t.start > m.start()), len(toks))
        if [t.text for t in toks[i : i + 4]] != ["local", name, "=", "{"]:
            continue
        depth, j = 0, i + 3
        while j < len(toks):
            depth += {"{": 1, "}": -1}.get(toks[j].text, 0)
            if depth == 0:
                break
            j += 1
        cuts.append((toks[i].start, toks[j].start + 1))
    for start, end in reversed(cuts):
        text = text[:start] + "\n" * text.count("\n", start, end) + text[end:]
    return text
