"""A Redis permission lost while a replica serves: the RPC fails INTERNAL with
one line naming the refused command, and the replica logs that line once, no
traceback.  (In its own module, after the benchmarks' forks: an in-process
gRPC server makes a later fork() unsafe.)"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import redis

from scheduler import Policy
from scheduler.client.sync import async_client
from scheduler.store.acl import COMMANDS, setuser
from scheduler.testing.redis_server import RedisServer
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.helpers import endpoint_md, hb_request

pytestmark = pytest.mark.real_only


@pytest.fixture
def user_url(redis_server: RedisServer) -> Iterator[str]:
    admin = redis.Redis.from_url(redis_server.url)
    admin.flushall()
    args = setuser("sched-rt", "pw")
    admin.execute_command(*args[: args.index("-@all") + 1], *(f"+{c}" for c in COMMANDS))
    yield f"redis://sched-rt:pw@127.0.0.1:{redis_server.port}/0"
    admin.execute_command("ACL", "DELUSER", "sched-rt")
    admin.flushall()
    admin.close()


def test_a_permission_lost_at_run_time_is_one_log_line(
    user_url: str, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    with ThreadedReplica(
        settings_for(Policy(), cell="acl"), lambda: async_client(user_url), user_url
    ) as r:
        r.stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1.local:5000"))
        admin.execute_command("ACL", "SETUSER", "sched-rt", "-hmget")
        with caplog.at_level("ERROR"), pytest.raises(grpc.RpcError) as e:
            r.stub.Heartbeat(hb_request("n1", cpu=2), metadata=endpoint_md("n1.local:5000"))
    admin.close()
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert e.value.details().startswith("Redis refused the command 'hmget' in a script")
    errors = [rec for rec in caplog.records if rec.levelname == "ERROR"]
    assert [rec.getMessage() for rec in errors] == [f"Heartbeat failed: {e.value.details()}"]
    assert all(rec.exc_info is None for rec in errors)
