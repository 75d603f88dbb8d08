"""Secrets stay secret: no Redis password in logs, schedctl output, error
messages, gRPC statuses or metrics.  (Key material: tests/test_tls.py.)"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
import redis
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler import Scheduler
from scheduler.domain.errors import SchedulerError
from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.config import ConfigError, load
from scheduler.store.redact import redact
from scheduler.testing.redis_server import RedisServer, free_port
from scheduler.testing.replicas import ServeProcess
from tests.helpers import endpoint_md, hb_request

SECRET = "S3cr3t-Pa55word"


def urls(port: int) -> list[str]:
    return [
        f"redis://app:{SECRET}@127.0.0.1:{port}/0",
        f"redis://:{SECRET}@127.0.0.1:{port}",
        f"rediss://app:{SECRET}@127.0.0.1:{port}/0",
        f"redis://127.0.0.1:{port}/0?password={SECRET}",
        f"app:{SECRET}@127.0.0.1:{port}",
        f"http://app:{SECRET}@127.0.0.1:{port}",
        f"redis://app:{SECRET}@127.0.0.1:x/0",
        f"redis://app:{SECRET}@[::1:{port}/0",
    ]


@pytest.mark.parametrize(
    "text",
    [
        f"redis://app:{SECRET}@h:1/0",
        f"redis+sentinel://app:{SECRET}@a:1,b:2/m",
        f"redis://h:1/0?password={SECRET}&db=2",
        f"app:{SECRET}@h:1",
        f"error at redis://:{SECRET}@h:1 and rediss://u:{SECRET}@k:2/0",
    ],
)
def test_redact(text: str) -> None:
    out = redact(text)
    assert SECRET not in out
    assert out.count("***") == text.count(SECRET)


@pytest.mark.parametrize(
    "command",
    [["nodes"], ["policy", "show"], ["bindings", "lookup", "s"], ["reservations", "--json"]],
    ids=" ".join,
)
def test_schedctl_never_prints_a_password(command: list[str]) -> None:
    for url in urls(free_port()):
        result = CliRunner().invoke(main, [*command, "--redis", url])
        assert result.exit_code in (1, 2), (url, result.output, result.exception)
        assert isinstance(result.exception, SystemExit), repr(result.exception)
        assert SECRET not in result.output, result.output
        assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
        # (with --json, stdout holds the same error as one JSON document)
        if "--json" in command:
            assert json.loads(result.stdout) == {"error": result.stderr[7:].rstrip("\n")}
        else:
            assert result.stdout == ""


def test_config_errors_and_library_errors_never_show_a_password() -> None:
    for url in urls(free_port()):
        try:
            load(None, env={"SCHEDULER_REDIS_ADDR": url})
        except ConfigError as e:
            assert SECRET not in str(e)
        try:
            Scheduler.connect(url, cell="x").ping()
        except SchedulerError as e:
            assert SECRET not in str(e)
        else:
            raise AssertionError(f"{redact(url)} answered")


@pytest.fixture
def app_user(redis_server: RedisServer) -> Iterator[str]:
    admin = redis.Redis.from_url(redis_server.url)
    admin.flushall()
    admin.execute_command("ACL", "SETUSER", "app", "on", f">{SECRET}", "~*", "+@all")
    yield f"redis://app:{SECRET}@127.0.0.1:{redis_server.port}/0"
    admin.execute_command("ACL", "DELUSER", "app")
    admin.flushall()
    admin.close()


@pytest.mark.real_only
@pytest.mark.slow
def test_a_replica_logs_and_exports_no_password(
    app_user: str,
    redis_server: RedisServer,
) -> None:
    replica = ServeProcess({"log_format": "json"}, app_user).wait_serving()
    try:
        with grpc.insecure_channel(replica.address) as ch:
            stub = pb_grpc.SchedulerStub(ch)
            stub.Heartbeat(hb_request("n1"), metadata=endpoint_md("n1.local:5000"))
            metrics = (
                urllib.request.urlopen(
                    f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=5
                )
                .read()
                .decode()
            )
            assert "agentenv_scheduler_rpc_duration_seconds" in metrics
            assert SECRET not in metrics
            # Redis goes away: the status the caller gets names Redis, not its password
            admin = redis.Redis.from_url(redis_server.url)
            admin.execute_command("ACL", "SETUSER", "app", "off")
            admin.execute_command("CLIENT", "KILL", "USER", "app")
            admin.close()
            with pytest.raises(grpc.RpcError) as e:
                stub.ListNodes(pb.ListNodesRequest(), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "redis://***@127.0.0.1" in e.value.details()
            assert SECRET not in e.value.details()
    finally:
        replica.terminate()
    log = replica.log()
    assert "redis://***@127.0.0.1" in log  # the target is logged, masked
    assert SECRET not in log


# -- passwords of any characters (hypothesis) ---------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from scheduler.store.connection import describe_target, parse_address  # noqa: E402

#: what unencoded passwords hold (base64 has / and +; people type # ? @ % :)
_SPECIAL = "/#?@%:+="
_PASSWORDS = st.text(
    alphabet=st.sampled_from("abcXYZ019" + _SPECIAL), min_size=6, max_size=24
).filter(lambda pw: any(c in pw for c in _SPECIAL))
_SPACED = st.text(
    alphabet=st.sampled_from("abcXYZ019 " + _SPECIAL), min_size=6, max_size=24
).filter(lambda pw: " " in pw.strip())


def addresses(pw: str) -> list[str]:
    return [
        f"redis://app:{pw}@127.0.0.1:6379/0",
        f"redis://:{pw}@10.0.0.5:6379",
        f"rediss://app:{pw}@redis.internal:6380/1",
        f"app:{pw}@127.0.0.1:6379",
        f"redis+sentinel://app:{pw}@h1:26379,h2:26379/mymaster",
    ]


def in_messages(address: str) -> list[str]:
    return [
        address,
        f"Redis at {address} is unreachable: Connection refused",
        f"Error: cannot prepare cell 'default': Redis at {address} did not answer within 2s",
    ]


@settings(max_examples=300, deadline=None)
@given(_PASSWORDS)
def test_a_password_of_any_url_character_is_masked_by_shape(pw: str) -> None:
    """Never seen before (not noted): the shape alone masks it, inside a URL
    or a message.  Before, a '/', '#', '?' or '@' in it printed it in clear."""
    for address in addresses(pw):
        # (a schemeless host:port form is masked as a whole address, which is
        # how it is shown: describe_target; only URLs are found inside text)
        url = address.startswith(("redis://", "rediss://", "redis+"))
        for text in in_messages(address) if url else [address]:
            out = redact(text)
            assert pw not in out, (text, out)
            assert "***" in out
    out = redact(f"Redis at redis://127.0.0.1:6379/0?password={pw} is unreachable")
    assert pw not in out and out.endswith(" is unreachable"), out


@settings(max_examples=200, deadline=None)
@given(st.one_of(_PASSWORDS, _SPACED))
def test_a_password_of_an_address_given_is_masked_whatever_it_holds(pw: str) -> None:
    """An address this process was given (parsed, or shown): its password is
    masked wherever it appears, spaces and all, also in redis-py's own
    messages that quote the address in pieces."""
    for address in addresses(pw):
        try:
            parse_address(address)
        except SchedulerError as e:  # (a form the parser refuses: its error masks it too)
            assert pw not in str(e)
        assert pw not in describe_target(address)
        for text in in_messages(address):
            assert pw not in redact(text), text
        assert pw not in redact(f"AUTH failed for app with password {pw}; retrying")
