"""The runtime package imports nothing that only tests or benchmarks need.

Every runtime module (scheduler.*, schedctl's scheduler.cli.*, the Lua
package) is imported in a fresh interpreter; none of tests.*, bench.*,
scheduler.testing.*, hypothesis or pytest may come along.  scheduler.testing
(the oracle, the Redis launcher, the replica harness) is what the tests and
the benchmarks share: it may import the runtime, never the other way round.
"""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import scheduler.cli

import scheduler

FORBIDDEN = ("tests", "bench", "scheduler.testing", "hypothesis", "pytest", "_pytest")

PROBE = r"""
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def runtime_modules() -> list[str]:
    names = ["scheduler", "scheduler.cli", "scheduler.lua", "scheduler.lua.includes"]
    # (schedctl and the Lua files are mapped into the package from cli/ and lua/)
    for package in (scheduler, scheduler.cli):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith("scheduler.testing") or info.name.endswith("generate"):
                continue  # the shared test kit; the stub generator (needs grpcio-tools)
            names.append(info.name)
    return sorted(set(names))


def test_runtime_modules_import_no_test_or_benchmark_code() -> None:
    names = runtime_modules()
    assert {
        "scheduler.client.sync",
        "scheduler.server.service",
        "scheduler.ops.simulate",
        "scheduler.ops.simnode",
        "scheduler.cli.main",
        "scheduler.lua",
    } <= set(names)
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *names],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = json.loads(run.stdout)
    leaked = [
        m for m in loaded if m.split(".")[0] in FORBIDDEN or m.startswith("scheduler.testing")
    ]
    assert leaked == []


def test_the_scheduler_package_holds_no_test_of_its_own() -> None:
    # the oracle lives in the test kit now; the runtime ranks with replies.rank_key
    assert "scheduler.model" not in runtime_modules()


#: the layers of scheduler/, lowest first; a module may import its own layer
#: and the layers before it, never one after (server and ops share a rank:
#: neither imports the other)
LAYERS = {"domain": 0, "version": 0, "store": 1, "client": 2, "server": 3, "ops": 3}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "scheduler" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


def _imports(path: Path, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_each_layer_imports_only_the_layers_before_it() -> None:
    root = Path(scheduler.__file__).parent
    wrong = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).with_suffix("")
        name = ".".join(("scheduler", *relative.parts)).removesuffix(".__init__")
        layer = _layer(name)
        if layer is None:
            continue
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for target in _imports(path, package):
            other = _layer(target)
            if other is not None and other != layer and LAYERS[other] >= LAYERS[layer]:
                wrong.append(f"{name} imports {target} ({layer} -> {other})")
    assert wrong == []
    # every module of the package sits in a layer (or is the public face,
    # the wire, or the test kit)
    loose = sorted(p.name for p in root.glob("*.py") if p.stem not in ("__init__", "version"))
    assert loose == []
