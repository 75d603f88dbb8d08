"""TLS for the gRPC port: server credentials read from PEM files and read
again whenever one of the files changes, without a restart.

gRPC asks :meth:`ReloadingCredentials.fetch` before every new connection's
handshake; it answers a new certificate configuration only when a file's
size, mtime or inode moved and the new files form a valid pair (checked
with the standard library's ``ssl``) whose certificate is inside its
validity window, so a rotation caught half-written, or to a certificate
that expired or is not valid yet, keeps the old certificate (one log line
per change of the files).  Errors name the file,
never its contents.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass

import grpc

log = logging.getLogger("scheduler.server.tls")

LOOPBACK_NAMES = ("localhost", "ip6-localhost")


class TlsError(Exception):
    """The TLS files cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    #: with it, clients must present a certificate this CA signed (mutual TLS)
    client_ca_file: str | None = None

    def paths(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file) + (
            (self.client_ca_file,) if self.client_ca_file else ()
        )


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise TlsError(f"grpc_tls.{key}: cannot read {path}: {e.strerror or e}") from None


def _check_pair(files: TlsFiles) -> None:
    """The files parse, and the key belongs to the certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(files.cert_file, files.key_file)
    except ssl.SSLError as e:
        raise TlsError(
            f"grpc_tls: {files.cert_file} and {files.key_file} are not a PEM "
            f"certificate and its private key ({e.reason or 'unreadable'})"
        ) from None
    except OSError as e:
        raise TlsError(
            f"grpc_tls: cannot read {files.cert_file} or {files.key_file}: {e.strerror or e}"
        ) from None
    if files.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=files.client_ca_file)
        except (ssl.SSLError, OSError):
            raise TlsError(
                f"grpc_tls.client_ca_file: {files.client_ca_file} holds no PEM certificate"
            ) from None


def _check_validity(cert_file: str, now: float | None = None) -> None:
    """The certificate (the chain's first) is inside its validity window: a
    rotated certificate that already expired, or is not valid yet, would fail
    every new handshake."""
    try:
        # (the standard library's own decoder, as its tests use it: the
        # package needs no X.509 dependency for two dates)
        decoded = ssl._ssl._test_decode_cert(cert_file)  # type: ignore[attr-defined]
        begins = ssl.cert_time_to_seconds(decoded["notBefore"])
        ends = ssl.cert_time_to_seconds(decoded["notAfter"])
    except (ssl.SSLError, OSError, KeyError, ValueError) as e:
        raise TlsError(
            f"grpc_tls.cert_file: {cert_file} cannot be read as a certificate ({e})"
        ) from None
    at = time.time() if now is None else now
    if at < begins:
        raise TlsError(
            f"grpc_tls.cert_file: {cert_file} is not valid before {decoded['notBefore']}"
        )
    if at >= ends:
        raise TlsError(f"grpc_tls.cert_file: {cert_file} expired on {decoded['notAfter']}")


def load_config(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    _check_pair(files)
    _check_validity(files.cert_file)
    cert = _read(files.cert_file, "cert_file")
    key = _read(files.key_file, "key_file")
    ca = _read(files.client_ca_file, "client_ca_file") if files.client_ca_file else None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def _stamp(paths: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((0, -1, 0))
    return tuple(out)


class ReloadingCredentials:
    """Server credentials that follow their files (see the module docstring)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = _stamp(files.paths())
        #: the files' stamp when they were last refused (logged once per change)
        self._refused: tuple[tuple[int, int, int], ...] | None = None
        self._initial = load_config(files)
        #: how many times new files were taken (for tests and logs)
        self.reloads = 0

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            stamp = _stamp(self.files.paths())
            if stamp == self._stamp:
                return None
            try:
                config = load_config(self.files)
            except TlsError as e:
                if stamp != self._refused:  # (one line per change, not per connection)
                    self._refused = stamp
                    log.warning(
                        "TLS files changed but cannot be used yet (%s); keeping the "
                        "previous certificate",
                        e,
                    )
                return None
            self._stamp = stamp
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.files.cert_file)
            return config

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial,
            self.fetch,
            require_client_authentication=self.files.client_ca_file is not None,
        )


def is_loopback(listen: str) -> bool:
    """Does ``host:port`` listen on a loopback address only?"""
    host = listen.rpartition(":")[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
