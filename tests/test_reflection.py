"""gRPC reflection: grpc's own reflection client lists the services and
resolves the scheduler's methods (what ``grpcurl ADDR list`` and
``describe`` ask); ``grpc_reflection: false`` and ``--no-reflection`` turn it off."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from scheduler.testing.replicas import ServeProcess, ThreadedReplica

Make = Callable[..., ThreadedReplica]
SERVICES = {
    "scheduler.v1.Scheduler",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}


def listed(address: str) -> set[str]:
    with grpc.insecure_channel(address) as ch:
        return set(ProtoReflectionDescriptorDatabase(ch).get_services())


def test_reflection_lists_the_services_and_describes_schedule(make_replica: Make) -> None:
    r = make_replica()
    assert r.replica is not None
    address = f"127.0.0.1:{r.replica.port}"
    assert listed(address) == SERVICES
    with grpc.insecure_channel(address) as ch:
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(ch))
        service = pool.FindServiceByName("scheduler.v1.Scheduler")
        schedule = service.methods_by_name["Schedule"]
        assert schedule.input_type.full_name == "scheduler.v1.ScheduleRequest"
        assert "hint" in schedule.input_type.fields_by_name
        assert {"Heartbeat", "RecordAssignment", "LookupNode"} <= set(service.methods_by_name)


def unimplemented(address: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        with pytest.raises(grpc.RpcError) as e:
            next(replies)
        code: grpc.StatusCode = e.value.code()
        return code


def test_reflection_off_by_config(make_replica: Make) -> None:
    r = make_replica(grpc_reflection=False)
    assert r.replica is not None
    assert unimplemented(f"127.0.0.1:{r.replica.port}") == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.slow
def test_reflection_flag_of_serve(processes: list[ServeProcess]) -> None:
    on = ServeProcess({"scheduler": {"grpc_reflection": False}}, None, extra_args=("--reflection",))
    off = ServeProcess({"scheduler": {}}, None, extra_args=("--no-reflection",))
    processes += [on, off]
    on.wait_serving()
    off.wait_serving()
    assert listed(on.address) == SERVICES
    assert unimplemented(off.address) == grpc.StatusCode.UNIMPLEMENTED
