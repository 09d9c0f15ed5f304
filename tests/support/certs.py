"""Test certificates made with the openssl command (Debian's ``openssl`` package):
a CA, a server certificate for 127.0.0.1/localhost, client certificates it signs, and
a client certificate from another CA that the server must not trust."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    #: A second server certificate (another CN), to see a reload take effect.
    renewed_cert: Path
    renewed_key: Path
    client_cert: Path  # CN=sensor-1
    client_key: Path
    other_cert: Path  # CN=sensor-2
    other_key: Path
    stranger_cert: Path  # signed by a CA the server does not know
    stranger_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(
        ["openssl", *map(str, args)],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=30,
    )


def _key(directory: Path, name: str) -> Path:
    path = directory / f"{name}.key"
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path,
             cwd=directory)  # fmt: skip
    path.chmod(0o600)
    return path


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key = _key(directory, name)
    cert = directory / f"{name}.crt"
    _openssl("req", "-x509", "-new", "-key", key, "-out", cert, "-days", "30",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)  # fmt: skip
    return cert, key


def _signed(
    directory: Path, name: str, ca: tuple[Path, Path], extensions: str
) -> tuple[Path, Path]:
    key = _key(directory, name)
    csr = directory / f"{name}.csr"
    cert = directory / f"{name}.crt"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}", cwd=directory)
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", "30", "-extfile", ext, cwd=directory)  # fmt: skip
    return cert, key


SERVER_EXT = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
CLIENT_EXT = "extendedKeyUsage=clientAuth\n"


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca = _ca(directory, "ledge-test-ca")
    server = _signed(directory, "ledge-server", ca, SERVER_EXT)
    renewed = _signed(directory, "ledge-server-renewed", ca, SERVER_EXT)
    client = _signed(directory, "sensor-1", ca, CLIENT_EXT)
    other = _signed(directory, "sensor-2", ca, CLIENT_EXT)
    stranger_ca = _ca(directory, "stranger-ca")
    stranger = _signed(directory, "stranger", stranger_ca, CLIENT_EXT)
    return Certs(
        directory,
        ca[0],
        server[0],
        server[1],
        renewed[0],
        renewed[1],
        client[0],
        client[1],
        other[0],
        other[1],
        stranger[0],
        stranger[1],
    )
