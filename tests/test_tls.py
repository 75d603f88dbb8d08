"""TLS and mutual TLS on the gRPC port, with certificates made by a test CA:
a TLS client is served, a plaintext one refused, mTLS refuses a client
without a certificate of the configured CA, and a rotated certificate is
taken without a restart.  Plaintext on a non-loopback address warns."""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from scheduler.cli.main import main

from scheduler.grpc import scheduler_pb2 as pb
from scheduler.grpc import scheduler_pb2_grpc as pb_grpc
from scheduler.server.config import ConfigError, Overrides, load
from scheduler.server.tls import TlsError, TlsFiles, is_loopback, load_config
from scheduler.store import embedded
from scheduler.testing.replicas import ThreadedReplica, settings_for
from tests.certs import Authority, Pair

pytestmark = pytest.mark.fake_only  # the transport is under test, not the store


@dataclass
class Pki:
    dir: Path
    ca: Authority
    ca_file: Path
    cert_file: Path
    key_file: Path

    def channel(
        self,
        port: int,
        root: bytes | None = None,
        client: Pair | None = None,
    ) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(
            root or self.ca.pem, client.key if client else None, client.cert if client else None
        )
        return grpc.secure_channel(f"127.0.0.1:{port}", creds)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = Authority()
    cert, key = ca.issue("replica", server=True).write(tmp_path, "server")
    return Pki(tmp_path, ca, ca.write(tmp_path), cert, key)


@pytest.fixture
def serve(redis_client: Any) -> Iterator[Callable[..., ThreadedReplica]]:
    server = redis_client.connection_pool.connection_kwargs["server"]
    opened: list[ThreadedReplica] = []

    def start(files: TlsFiles | None, listen: str = "127.0.0.1:0") -> ThreadedReplica:
        import fakeredis

        settings = replace(settings_for(), grpc_tls=files, grpc_listen=listen)
        r = ThreadedReplica(settings, lambda: fakeredis.FakeAsyncRedis(server=server))
        opened.append(r.__enter__())
        return r

    yield start
    for r in reversed(opened):
        r.__exit__()


def port_of(r: ThreadedReplica) -> int:
    assert r.replica is not None
    return r.replica.port


def list_nodes(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        pb_grpc.SchedulerStub(channel).ListNodes(pb.ListNodesRequest(), timeout=5)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def test_tls_client_served_plaintext_refused(
    pki: Pki,
    serve: Callable[..., ThreadedReplica],
) -> None:
    r = serve(TlsFiles(str(pki.cert_file), str(pki.key_file)))
    port = port_of(r)
    assert list_nodes(pki.channel(port)) == grpc.StatusCode.OK
    assert list_nodes(grpc.insecure_channel(f"127.0.0.1:{port}")) == grpc.StatusCode.UNAVAILABLE
    # a client that trusts another CA does not talk to it either
    assert list_nodes(pki.channel(port, root=Authority("other").pem)) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_of_the_ca(
    pki: Pki, serve: Callable[..., ThreadedReplica]
) -> None:
    r = serve(TlsFiles(str(pki.cert_file), str(pki.key_file), str(pki.ca_file)))
    port = port_of(r)
    assert list_nodes(pki.channel(port)) == grpc.StatusCode.UNAVAILABLE  # no certificate
    stranger = Authority("stranger").issue("gateway", server=False)
    assert list_nodes(pki.channel(port, client=stranger)) == grpc.StatusCode.UNAVAILABLE
    ours = pki.ca.issue("gateway", server=False)
    assert list_nodes(pki.channel(port, client=ours)) == grpc.StatusCode.OK
    assert list_nodes(grpc.insecure_channel(f"127.0.0.1:{port}")) == grpc.StatusCode.UNAVAILABLE


def _bump(*paths: Path) -> None:
    """Make sure a rewrite moves the mtime even on a coarse clock."""
    later = time.time() + 5
    for p in paths:
        os.utime(p, (later, later))


def test_a_rotated_certificate_is_taken_without_a_restart(
    pki: Pki,
    serve: Callable[..., ThreadedReplica],
    caplog: pytest.LogCaptureFixture,
) -> None:
    r = serve(TlsFiles(str(pki.cert_file), str(pki.key_file)))
    port = port_of(r)
    assert list_nodes(pki.channel(port)) == grpc.StatusCode.OK
    # half a rotation (a key that does not parse): the old certificate stays
    secret = b"-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYMATERIAL\n-----END PRIVATE KEY-----\n"
    pki.key_file.write_bytes(secret)
    _bump(pki.key_file)
    with caplog.at_level(logging.WARNING, logger="scheduler.server.tls"):
        assert list_nodes(pki.channel(port)) == grpc.StatusCode.OK
    assert any("keeping the previous certificate" in m for m in caplog.messages)
    assert not any("TOPSECRET" in m for m in caplog.messages)
    # the whole rotation, to a certificate of a new CA
    new_ca = Authority("next")
    new_ca.issue("replica", server=True).write(pki.dir, "server")
    _bump(pki.cert_file, pki.key_file)
    assert list_nodes(pki.channel(port, root=new_ca.pem)) == grpc.StatusCode.OK
    assert list_nodes(pki.channel(port)) == grpc.StatusCode.UNAVAILABLE  # the old one is gone
    assert r.replica is not None and r.replica.tls is not None and r.replica.tls.reloads == 1


@pytest.mark.parametrize(
    ("begins", "ends", "why"),
    [
        (-dt.timedelta(days=2), -dt.timedelta(days=1), "expired on"),
        (dt.timedelta(days=1), dt.timedelta(days=2), "is not valid before"),
    ],
)
def test_a_rotated_certificate_outside_its_validity_is_not_loaded(
    pki: Pki,
    serve: Callable[..., ThreadedReplica],
    caplog: pytest.LogCaptureFixture,
    begins: dt.timedelta,
    ends: dt.timedelta,
    why: str,
) -> None:
    """Before, an expired certificate (a matching pair) was hot-loaded and
    every new connection failed until it was replaced."""
    r = serve(TlsFiles(str(pki.cert_file), str(pki.key_file)))
    port = port_of(r)
    pki.ca.issue("replica", server=True, begins=begins, ends=ends).write(pki.dir, "server")
    _bump(pki.cert_file, pki.key_file)
    with caplog.at_level(logging.WARNING, logger="scheduler.server.tls"):
        for _ in range(3):  # new connections, each asking for the certificate
            assert list_nodes(pki.channel(port)) == grpc.StatusCode.OK
    refused = [m for m in caplog.messages if "keeping the previous certificate" in m]
    assert len(refused) == 1 and why in refused[0], caplog.messages
    assert r.replica is not None and r.replica.tls is not None and r.replica.tls.reloads == 0
    # at start, such a certificate is refused with the file's name
    with pytest.raises(TlsError, match=f"grpc_tls.cert_file: {pki.cert_file} {why}"):
        load_config(TlsFiles(str(pki.cert_file), str(pki.key_file)))


def test_plaintext_off_loopback_warns(
    serve: Callable[..., ThreadedReplica], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="scheduler.server.replica"):
        serve(None, "127.0.0.1:0")
    assert not [m for m in caplog.messages if "plaintext" in m]
    with caplog.at_level(logging.WARNING, logger="scheduler.server.replica"):
        serve(None, "0.0.0.0:0")
    [warning] = [m for m in caplog.messages if "plaintext" in m]
    assert warning.startswith("gRPC on 0.0.0.0:0 is plaintext and not loopback-only")


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("127.8.0.1:1", True),
        ("[::1]:1", True),
        ("localhost:1", True),
        ("0.0.0.0:1", False),
        ("[::]:1", False),
        ("10.0.0.1:1", False),
        ("node.example:1", False),
    ],
)
def test_is_loopback(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


def test_config_and_flags(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"scheduler": {"grpc_tls": {"cert_file": "a.crt", "key_file": "a.key"}}}')
    s = load(path, env={})
    assert s.grpc_tls == TlsFiles("a.crt", "a.key", None)
    s = load(path, env={}, flags=Overrides(grpc_tls_client_ca="ca.crt", grpc_tls_cert="b.crt"))
    assert s.grpc_tls == TlsFiles("b.crt", "a.key", "ca.crt")
    assert load(None, env={}).grpc_tls is None
    path.write_text('{"scheduler": {"grpc_tls": {"cert_file": "a.crt"}}}')
    with pytest.raises(ConfigError, match=r"scheduler.grpc_tls.key_file: is required"):
        load(path, env={})
    path.write_text('{"scheduler": {"grpc_tls": {"cert": "a.crt"}}}')
    with pytest.raises(ConfigError, match=r"unknown key 'scheduler.grpc_tls.cert'"):
        load(path, env={})


def test_bad_files_name_the_file_never_the_key(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(TlsError, match=r"cannot read .*missing.crt"):
        load_config(TlsFiles(str(tmp_path / "missing.crt"), str(pki.key_file)))
    secret = tmp_path / "bad.key"
    secret.write_text(
        "-----BEGIN PRIVATE KEY-----\nTOPSECRETKEYMATERIAL\n-----END PRIVATE KEY-----\n"
    )
    with pytest.raises(TlsError) as e:
        load_config(TlsFiles(str(pki.cert_file), str(secret)))
    assert str(secret) in str(e.value) and "TOPSECRET" not in str(e.value)
    other = Authority().issue("x", server=True)
    _, wrong_key = other.write(tmp_path, "other")
    with pytest.raises(TlsError, match="not a PEM certificate and its private key"):
        load_config(TlsFiles(str(pki.cert_file), str(wrong_key)))
    # schedctl serve says so in one line and exits 1
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "",
            "--grpc-tls-cert",
            str(pki.cert_file),
            "--grpc-tls-key",
            str(secret),
        ],
        env={"SCHEDULER_REDIS_ADDR": None},
    )
    assert result.exit_code == 1
    assert str(secret) in result.output and "TOPSECRET" not in result.output
    assert embedded.WARNING in result.output  # (it got as far as listening)
