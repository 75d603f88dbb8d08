"""Regenerate (or check) the Python stubs of ``scheduler.proto``.

    python -m scheduler.grpc.generate          # rewrite *_pb2.py, *_pb2.pyi, *_pb2_grpc.py
    python -m scheduler.grpc.generate --check  # exit 1 if the stubs do not match the .proto

Needs ``grpcio-tools`` (the ``dev`` extra).  protoc runs with the repository
root as include path, so the generated imports read
``from scheduler.grpc import scheduler_pb2``.  The check compares descriptors,
not text, so it holds across grpcio-tools versions.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROTO = "scheduler/grpc/scheduler.proto"


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # dev dependency, imported only here

    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"-I{include}", *args, PROTO])
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


def generate() -> None:
    _protoc([f"--python_out={ROOT}", f"--pyi_out={ROOT}", f"--grpc_python_out={ROOT}"])


def expected_descriptor() -> bytes:
    """The FileDescriptorProto protoc makes of the .proto, serialized."""
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        _protoc([f"--descriptor_set_out={out}"])
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = fds.file
    for msg in _all_messages(fd.message_type):
        for field in msg.field:
            field.ClearField("json_name")  # derived by protoc; not kept in the stubs
    data: bytes = fd.SerializeToString(deterministic=True)
    return data


def _all_messages(messages: Any) -> Iterator[Any]:
    for m in messages:
        yield m
        yield from _all_messages(m.nested_type)


def committed_descriptor() -> bytes:
    from google.protobuf import descriptor_pb2

    pb2 = importlib.import_module("scheduler.grpc.scheduler_pb2")
    fd = descriptor_pb2.FileDescriptorProto()
    pb2.DESCRIPTOR.CopyToProto(fd)
    data: bytes = fd.SerializeToString(deterministic=True)
    return data


def mismatches() -> list[str]:
    """What differs between the .proto and the committed stubs (empty = in sync)."""
    problems = []
    if expected_descriptor() != committed_descriptor():
        problems.append("scheduler_pb2.py does not match scheduler.proto")
    pb2 = importlib.import_module("scheduler.grpc.scheduler_pb2")
    grpc_mod = importlib.import_module("scheduler.grpc.scheduler_pb2_grpc")
    methods = [m.name for m in pb2.DESCRIPTOR.services_by_name["Scheduler"].methods]
    servicer = grpc_mod.SchedulerServicer
    missing = [m for m in methods if not hasattr(servicer, m)]
    if missing:
        problems.append(f"scheduler_pb2_grpc.py lacks {', '.join(missing)}")
    pyi = (HERE / "scheduler_pb2.pyi").read_text()
    missing = [name for name in pb2.DESCRIPTOR.message_types_by_name if f"class {name}(" not in pyi]
    if missing:
        problems.append(f"scheduler_pb2.pyi lacks {', '.join(missing)}")
    return problems


def main(argv: list[str]) -> int:
    if "--check" in argv:
        problems = mismatches()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run: python -m scheduler.grpc.generate", file=sys.stderr)
            return 1
        print("stubs match scheduler.proto")
        return 0
    generate()
    print(f"generated stubs in {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
