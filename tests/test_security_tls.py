"""TLS listeners over real sockets: server certificates, the minimum version, client
certificates (optional, required, as the user name), reloads, and bad configs."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.certs import Certs
from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess
from tests.support.wait import wait_for


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ledge.toml"
    path.write_text(text)
    return path


def _tls_listener(certs: Certs, extra: str = "", kind: str = "tls") -> str:
    return (
        f'[[listeners]]\nport = 0\ntype = "{kind}"\ncertfile = "{certs.server_cert}"\n'
        f'keyfile = "{certs.server_key}"\n{extra}'
    )


@pytest.fixture
def tls_ledge(tmp_path: Path, certs: Certs) -> Iterator[LedgeProcess]:
    """A plain listener and a TLS listener with optional client certificates."""
    config = _config(
        tmp_path,
        "[[listeners]]\nport = 0\n"
        + _tls_listener(certs, f'cafile = "{certs.ca}"\n')
        + "[broker]\nconnect_timeout = 2\n",
    )
    proc = LedgeProcess(config=config, listen=False).start(listeners=2)
    yield proc
    assert proc.stop() == 0


def _handshake(
    port: int,
    certs: Certs,
    client: tuple[Path, Path] | None = None,
    maximum: ssl.TLSVersion | None = None,
) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    if maximum is not None:
        context.maximum_version = maximum
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        tls = context.wrap_socket(sock, server_hostname="127.0.0.1")
    except BaseException:
        sock.close()
        raise
    return tls


def _mqtt_works(tls: ssl.SSLSocket) -> None:
    """CONNECT (3.1.1) and read the CONNACK over an established TLS socket."""
    tls.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
    assert tls.recv(4) == b"\x20\x02\x00\x00"


def test_tls_listener_serves_paho_and_mosquitto_clients(
    tls_ledge: LedgeProcess, certs: Certs
) -> None:
    plain, secure = tls_ledge.ports
    sub = Paho(secure, "tls-sub", ca=str(certs.ca)).connect()
    sub.subscribe("tls/#", 1)
    Paho(plain, "plain-pub").connect().publish("tls/a", b"over tcp", 1)
    out = subprocess.run(
        ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(secure), "--cafile", str(certs.ca),
         "-t", "tls/b", "-m", "over tls", "-q", "1", "-V", "mqttv5"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = {m.topic: m.payload for m in sub.wait_messages(2)}
    assert got == {"tls/a": b"over tcp", "tls/b": b"over tls"}
    sub.disconnect()


def test_tls_minimum_version_is_enforced(tmp_path: Path, certs: Certs) -> None:
    config = _config(tmp_path, _tls_listener(certs, 'tls_version = "tlsv1.3"\n'))
    proc = LedgeProcess(config=config, listen=False).start()
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake(proc.port, certs, maximum=ssl.TLSVersion.TLSv1_2)
        with _handshake(proc.port, certs) as tls:
            assert tls.version() == "TLSv1.3"
            _mqtt_works(tls)
    finally:
        assert proc.stop() == 0


def test_tls_1_2_clients_are_served_by_default(tls_ledge: LedgeProcess, certs: Certs) -> None:
    with _handshake(tls_ledge.ports[1], certs, maximum=ssl.TLSVersion.TLSv1_2) as tls:
        assert tls.version() == "TLSv1.2"
        _mqtt_works(tls)


def _refused_handshake(port: int, certs: Certs, client: tuple[Path, Path] | None) -> bool:
    """Did the server refuse? (With TLS 1.3 a missing or untrusted client certificate is
    seen by the client only on its first read.)"""
    try:
        with _handshake(port, certs, client) as tls:
            tls.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            return tls.recv(4) == b""
    except (ssl.SSLError, ConnectionError):
        return True


def test_required_client_certificate_must_come_from_the_ca(tmp_path: Path, certs: Certs) -> None:
    config = _config(
        tmp_path,
        _tls_listener(certs, f'cafile = "{certs.ca}"\nrequire_certificate = true\n'),
    )
    proc = LedgeProcess(config=config, listen=False).start()
    try:
        assert _refused_handshake(proc.port, certs, None)
        assert _refused_handshake(proc.port, certs, (certs.stranger_cert, certs.stranger_key))
        with _handshake(proc.port, certs, (certs.client_cert, certs.client_key)) as tls:
            _mqtt_works(tls)
        proc.wait_log("TLS handshake with .* failed")
    finally:
        assert proc.stop() == 0


def test_certificate_common_name_is_the_user_name_for_the_acl(tmp_path: Path, certs: Certs) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user sensor-1\ntopic write sensors/sensor-1/#\ntopic read cmd/sensor-1\n")
    acl.chmod(0o600)
    config = _config(
        tmp_path,
        _tls_listener(
            certs,
            f'cafile = "{certs.ca}"\nrequire_certificate = true\n'
            f'use_identity_as_username = true\nacl_file = "{acl}"\n',
        )
        + "[[listeners]]\nport = 0\n",
    )
    proc = LedgeProcess(config=config, listen=False).start(listeners=2)
    try:
        secure, plain = proc.ports
        watcher = Paho(plain, "watcher").connect()
        watcher.subscribe("sensors/#")
        device = Paho(
            secure,
            "dev",
            ca=str(certs.ca),
            cert=(str(certs.client_cert), str(certs.client_key)),
            username="someone-else",  # ignored: the certificate says who this is
            password="x",
        ).connect()
        assert device.subscribe("cmd/sensor-2") == [0x87]
        info = device.client.publish("sensors/sensor-2/t", b"not mine", 1)
        info.wait_for_publish(5)
        device.publish("sensors/sensor-1/t", b"mine", 1)
        assert [m.topic for m in watcher.wait_messages(1)] == ["sensors/sensor-1/t"]
        proc.wait_log("client 'dev' connected")
        device.disconnect()
        watcher.disconnect()
    finally:
        assert proc.stop() == 0


def test_sighup_serves_a_renewed_certificate(tmp_path: Path, certs: Certs) -> None:
    cert = tmp_path / "server.crt"
    key = tmp_path / "server.key"
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    key.chmod(0o600)
    config = _config(
        tmp_path, f'[[listeners]]\nport = 0\ntype = "tls"\ncertfile = "{cert}"\nkeyfile = "{key}"\n'
    )
    proc = LedgeProcess(config=config, listen=False).start()

    def served_cn() -> str:
        with _handshake(proc.port, certs) as tls:
            cert: Any = tls.getpeercert()
            subject = dict(x[0] for x in cert["subject"])
            return str(subject["commonName"])

    try:
        assert served_cn() == "ledge-server"
        cert.write_bytes(certs.renewed_cert.read_bytes())
        key.write_bytes(certs.renewed_key.read_bytes())
        proc.signal(signal.SIGHUP)
        proc.wait_log("config reloaded", 20)
        assert served_cn() == "ledge-server-renewed"
    finally:
        assert proc.stop() == 0


def _check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        check=False,
    )


def test_check_config_names_missing_or_mismatched_tls_files(tmp_path: Path, certs: Certs) -> None:
    missing = _config(
        tmp_path,
        '[[listeners]]\nport = 1\n[[listeners]]\nport = 2\ntype = "websocket-tls"\n'
        f'certfile = "{tmp_path}/nope.crt"\nkeyfile = "{certs.server_key}"\n',
    )
    out = _check(missing)
    assert out.returncode == 2
    assert "listeners[1].certfile (line 6): " in out.stderr
    assert "No such file or directory" in out.stderr
    mismatched = _config(
        tmp_path,
        f'[[listeners]]\ntype = "tls"\ncertfile = "{certs.server_cert}"\n'
        f'keyfile = "{certs.client_key}"\n',
    )
    out = _check(mismatched)
    assert out.returncode == 2
    assert "listeners[0] (line 1): " in out.stderr and "certfile/keyfile" in out.stderr
    no_key = _config(tmp_path, '[[listeners]]\ntype = "tls"\n')
    assert "needs certfile and keyfile" in _check(no_key).stderr
    no_ca = _config(tmp_path, _tls_listener(certs, "require_certificate = true\n"))
    assert "require_certificate needs cafile" in _check(no_ca).stderr


def test_a_key_others_can_read_is_warned_about(tmp_path: Path, certs: Certs) -> None:
    key = tmp_path / "open.key"
    key.write_bytes(certs.server_key.read_bytes())
    key.chmod(0o644)
    config = _config(
        tmp_path,
        f'[[listeners]]\nport = 0\ntype = "tls"\ncertfile = "{certs.server_cert}"\n'
        f'keyfile = "{key}"\n',
    )
    out = _check(config)
    assert out.returncode == 0
    assert f"TLS key {key} can be read by its group or others (mode 0644)" in out.stderr
    proc = LedgeProcess(config=config, listen=False).start()
    try:
        proc.wait_log(rf"WARNING .*TLS key {key} can be read by its group or others")
    finally:
        assert proc.stop() == 0


def test_a_tls_port_that_never_sees_a_handshake_is_closed_at_the_deadline(
    tls_ledge: LedgeProcess,
) -> None:
    with socket.create_connection(("127.0.0.1", tls_ledge.ports[1]), timeout=5) as idle:
        idle.settimeout(6)
        assert idle.recv(1) == b""  # closed after connect_timeout (2 s), no handshake
    wait_for(lambda: "TLS handshake with" in tls_ledge.log, 5, "the failure to be logged")
