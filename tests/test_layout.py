"""The runtime package imports nothing that only tests or benchmarks need.

Every runtime module (scheduler.*, schedctl's scheduler.cli.*, the Lua
package) is imported in a fresh interpreter; none of tests.*, bench.*,
scheduler.testing.*, hypothesis or pytest may come along.  scheduler.testing
(the oracle, the Redis launcher, the replica harness) is what the tests and
the benchmarks share: it may import the runtime, never the other way round.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

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
