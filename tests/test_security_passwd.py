"""Password files: Mosquitto's format both ways, ``ledge passwd``, logins over real
sockets with the per-address slowdown, and no secret in any log line."""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.broker.auth import parse_hash, parse_password_file
from tests.support.clients import Paho
from tests.support.procs import LedgeProcess, MosquittoProcess, port_open
from tests.support.raw import Raw
from tests.support.wait import wait_for

#: Made by Debian's mosquitto_passwd 2.0.11 (``-b``, and ``-H sha512`` for ``$6$``).
MOSQUITTO_VECTORS = [
    (
        "s3cret",
        "$7$101$8ucC42ZsV9k7l8gP$Ie4lLCCWjjaWaKlsxvti4pCZD0eiUscUzFyw0lI/weNFhpf2WarT6YBHKZ"
        "W6fr3XWthCMJQhlU/wzVWdKj9tUg==",
    ),
    (
        "pässwörd",
        "$6$iG3zwgrwAUTLO6W3$/vMbBAAt3XPC+DDn5UiPGqYjn+NEmwMya2SbbhEQykwMQF9cBAV5rt2AkIiQwhNy"
        "RK0hNdWSx1VO9qKC0XZv5g==",
    ),
]


def ledge_passwd(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "passwd", *map(str, args)],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("password", "encoded"), MOSQUITTO_VECTORS, ids=["$7$", "$6$"])
def test_mosquitto_hashes_verify(password: str, encoded: str) -> None:
    hashed = parse_hash(encoded)
    assert hashed.verify(password.encode())
    assert not hashed.verify(password.encode() + b"x")
    assert hashed.encode() == encoded  # read and written back unchanged


@pytest.mark.parametrize("algorithm", ["sha512-pbkdf2", "sha512"])
def test_a_file_made_by_mosquitto_passwd_is_read_as_is(tmp_path: Path, algorithm: str) -> None:
    path = tmp_path / "pw"
    for i, user in enumerate(["alice", "bob", "ünïcode"]):
        flags = ["-c"] if i == 0 else []
        subprocess.run(
            ["mosquitto_passwd", "-H", algorithm, *flags, "-b", str(path), user, f"pw-{user}"],
            check=True,
            timeout=30,
        )
    users = parse_password_file(path.read_text(encoding="utf-8"))
    assert set(users) == {"alice", "bob", "ünïcode"}
    for user, hashed in users.items():
        assert hashed.verify(f"pw-{user}".encode())
        assert not hashed.verify(b"pw-nobody")


def test_ledge_passwd_adds_changes_and_deletes_users(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    assert ledge_passwd("-c", "-b", path, "alice", "one").returncode == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ledge_passwd(path, "bob", "--password-stdin", stdin="two\n").returncode == 0
    text = path.read_text()
    path.write_text("# sensors\n" + text)  # a comment the tool must keep
    assert ledge_passwd("-b", path, "alice", "three").returncode == 0
    users = parse_password_file(path.read_text())
    assert users["alice"].verify(b"three") and not users["alice"].verify(b"one")
    assert users["bob"].verify(b"two")
    assert path.read_text().splitlines()[0] == "# sensors"
    assert ledge_passwd("-D", path, "alice").returncode == 0
    assert set(parse_password_file(path.read_text())) == {"bob"}
    missing = ledge_passwd("-D", path, "alice")
    assert missing.returncode == 1 and "not in" in missing.stderr
    # Each line is "user:$7$iterations$salt$hash", as mosquitto_passwd writes.
    (line,) = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    assert line.startswith("bob:$7$10000$")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-b", "{pw}", "a:b", "x"], "cannot contain ':'"),
        (["-b", "{pw}", "alice"], "-b needs the password"),
        (["{pw}", "alice", "x"], "needs -b"),
        (["-b", "{missing}", "alice", "x"], "does not exist"),
        (["-b", "{pw}", "alice", ""], "the password is empty"),
    ],
)
def test_ledge_passwd_refuses_with_a_reason(tmp_path: Path, args: list[str], message: str) -> None:
    pw = tmp_path / "pw"
    assert ledge_passwd("-c", "-b", pw, "seed", "x").returncode == 0
    before = pw.read_text()
    paths = {"pw": str(pw), "missing": str(tmp_path / "nope")}
    out = ledge_passwd(*(a.format(**paths) for a in args))
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert pw.read_text() == before


def test_ledge_passwd_keeps_a_line_it_cannot_read_and_warns(tmp_path: Path) -> None:
    """The bad line stays for its owner to fix (the gateway skips it); setting that
    user again replaces it."""
    pw = tmp_path / "pw"
    pw.write_text("alice:plaintext\n")
    out = ledge_passwd("-b", pw, "bob", "x")
    assert out.returncode == 0, out.stderr
    assert "line 1: user 'alice'" in out.stderr
    lines = pw.read_text().splitlines()
    assert lines[0] == "alice:plaintext" and set(parse_password_file(pw.read_text())) == {"bob"}
    assert ledge_passwd("-b", pw, "alice", "fixed").returncode == 0
    assert set(parse_password_file(pw.read_text())) == {"alice", "bob"}


@pytest.mark.skipif(not MosquittoProcess.available(), reason="Debian mosquitto")
def test_mosquitto_accepts_a_file_written_by_ledge_passwd(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    assert ledge_passwd("-c", "-b", pw, "alice", "wonderland").returncode == 0
    # Run as root, mosquitto switches to its own user, which could not read a 0600
    # file of ours; "user" keeps it as whoever runs the test (ignored when not root).
    user = pwd.getpwuid(os.getuid()).pw_name
    broker = MosquittoProcess(tmp_path, f"password_file {pw}\nuser {user}\n").start()
    try:

        def pub(password: str) -> int:
            return subprocess.run(
                [
                    "mosquitto_pub",
                    "-p",
                    str(broker.port),
                    "-t",
                    "t",
                    "-m",
                    "m",
                    "-V",
                    "mqttv5",
                    "-u",
                    "alice",
                    "-P",
                    password,
                ],
                check=False,
                capture_output=True,
                timeout=30,
            ).returncode

        assert pub("wonderland") == 0
        assert pub("looking-glass") != 0
    finally:
        broker.stop()


# --------------------------------------------------------------------------- over sockets


@pytest.fixture
def secured(tmp_path: Path) -> LedgeProcess:
    pw = tmp_path / "pw"
    assert ledge_passwd("-c", "-b", "-I", "1000", pw, "alice", "Secret-Pa55-XYZ").returncode == 0
    config = tmp_path / "ledge.toml"
    config.write_text(
        f'[auth]\nallow_anonymous = false\npassword_file = "{pw}"\nfailed_login_delay = 1.0\n'
        f'failed_login_delay_max = 2.0\n[log]\nlevel = "debug"\n'
    )
    return LedgeProcess(config=config)


def test_password_logins_anonymous_refusal_and_failed_login_slowdown(
    secured: LedgeProcess,
) -> None:
    """Right password: 0x00. None: 0x87 (anonymous not allowed). Wrong: 0x86, answered
    only after the address's delay, which doubles (1 s, then 2 s); another source
    address starts again from the base delay. (Lower bounds are exact; the upper ones
    leave most of a second for a loaded machine.)"""
    proc = secured.start()
    try:
        ok = Raw(proc.port)
        assert ok.connect("a", username="alice", password=b"Secret-Pa55-XYZ").reason_code == 0
        ok.close()
        anon = Raw(proc.port)
        assert anon.connect("anon").reason_code == 0x87
        anon.close()
        delays = []
        for _ in range(2):
            bad = Raw(proc.port)
            start = time.monotonic()
            assert bad.connect("b", username="alice", password=b"guess").reason_code == 0x86
            delays.append(time.monotonic() - start)
            bad.close()
        assert 0.95 <= delays[0] < 1.9 and delays[1] >= 1.95, delays
        # 127.0.0.2 is another source address on the same loopback.
        other = Raw(proc.port, host="127.0.0.1", source="127.0.0.2")
        start = time.monotonic()
        assert other.connect("c", username="nobody", password=b"x").reason_code == 0x86
        assert time.monotonic() - start < 1.9  # its first failure: the base delay only
        other.close()
        v311 = Raw(proc.port, version=4, source="127.0.0.3")
        assert v311.connect("d", username="alice", password=b"nope").reason_code == 4
        v311.close()
    finally:
        assert proc.stop() == 0


def test_passwords_and_hashes_never_reach_the_log(secured: LedgeProcess, tmp_path: Path) -> None:
    proc = secured.start()
    try:
        for password in (b"Secret-Pa55-XYZ", b"Wrong-Pa55-QRS"):
            c = Raw(proc.port, source="127.0.0.4")
            c.connect("leak", username="alice", password=password)
            c.close()
        proc.wait_log("refus", 10)
    finally:
        assert proc.stop() == 0
    digest = (tmp_path / "pw").read_text().split("$")[-1].strip()
    log = proc.log
    assert "client 'leak' connected" in log  # the debug log ran
    for secret in ("Secret-Pa55-XYZ", "Wrong-Pa55-QRS", digest, digest[:16]):
        assert secret not in log


def test_a_password_file_others_can_read_is_warned_about(secured: LedgeProcess) -> None:
    pw = Path(secured.cmd[secured.cmd.index("--config") + 1]).parent / "pw"
    os.chmod(pw, 0o644)
    proc = secured.start()
    try:
        proc.wait_log(r"password file .*pw can be read by its group or others \(mode 0644\)")
        wait_for(lambda: port_open(proc.port), 5, "listening")
    finally:
        assert proc.stop() == 0


def test_a_bad_password_file_line_is_skipped_and_logged_with_its_line(tmp_path: Path) -> None:
    """Mosquitto's 09-pwfile-parse-invalid, over sockets: the gateway starts, names the
    bad line (never its hash) and serves every other user of the file; the bad line's
    user cannot log in. Before, one bad line refused the whole file."""
    pw = tmp_path / "pw"
    assert ledge_passwd("-c", "-b", "-I", "1000", pw, "alice", "Secret-Pa55-XYZ").returncode == 0
    good = pw.read_text()
    pw.write_text("bob:$6$njERlZMi/7DzNB9E\n" + good + ":$6$c2FsdA==$aGFzaA==\n")
    config = tmp_path / "ledge.toml"
    config.write_text(
        f'[auth]\nallow_anonymous = false\npassword_file = "{pw}"\nfailed_login_delay = 0\n'
    )
    proc = LedgeProcess(config=config).start()
    try:
        proc.wait_log(r"password file .* line 1: user 'bob'.*line skipped", 5)
        proc.wait_log(r"password file .* line 3: expected user:hash.*line skipped", 5)
        ok = Raw(proc.port)
        assert ok.connect("a", username="alice", password=b"Secret-Pa55-XYZ").reason_code == 0
        ok.close()
        bob = Raw(proc.port)
        assert bob.connect("b", username="bob", password=b"anything").reason_code == 0x86
        bob.close()
    finally:
        assert proc.stop() == 0
    assert "njERlZMi" not in proc.log and "aGFzaA" not in proc.log


#: From Mosquitto's 09-pwfile-parse-invalid: user "empty", the hash of the empty password.
EMPTY_PASSWORD_LINE = (
    "empty:$6$o+53eGXtmlfHeYrg$FY7X9DNQ4uU1j0NiPmGOOSU05ZSzhqNmNhXIof/0nLpVb1zDhcRHdaC72E3Y"
    "ryH7dtTiG/r6jH6C8J+30cZBgA==\n"
)


@pytest.mark.parametrize("version", [4, 5])
def test_an_empty_password_is_no_password(tmp_path: Path, version: int) -> None:
    """A zero-length password counts as none, as in Mosquitto: even a file line whose
    hash is of the empty string lets no one in."""
    pw = tmp_path / "pw"
    pw.write_text(EMPTY_PASSWORD_LINE)
    config = tmp_path / "ledge.toml"
    config.write_text(
        f'[auth]\nallow_anonymous = false\npassword_file = "{pw}"\nfailed_login_delay = 0\n'
    )
    proc = LedgeProcess(config=config).start()
    try:
        for password in (b"", b"test", None):
            c = Raw(proc.port, version=version)
            code = c.connect("e", username="empty", password=password).reason_code
            assert code == (0x86 if version == 5 else 4), (password, code)
            c.close()
    finally:
        assert proc.stop() == 0


# --------------------------------------------------------------------------- SIGHUP


def _sighup(proc: LedgeProcess) -> None:
    """Send SIGHUP and wait until the reload is applied."""
    before = proc.log.count("config reloaded")
    proc.signal(signal.SIGHUP)
    wait_for(lambda: proc.log.count("config reloaded") > before, 20, "the reload")


def _auth_gateway(tmp_path: Path, acl: str | None = None) -> tuple[LedgeProcess, Path]:
    pw = tmp_path / "pw"
    for i, user in enumerate(["alice", "bob", "carol"]):
        flags = ["-c"] if i == 0 else []
        assert ledge_passwd(*flags, "-b", "-I", "1000", pw, user, f"pw-{user}").returncode == 0
    config = tmp_path / "ledge.toml"
    text = f'[auth]\nallow_anonymous = false\npassword_file = "{pw}"\n'
    if acl is not None:
        (tmp_path / "acl").write_text(acl)
        (tmp_path / "acl").chmod(0o600)
        text += f'acl_file = "{tmp_path / "acl"}"\n'
    config.write_text(text)
    return LedgeProcess(config=config).start(), pw


def test_sighup_disconnects_clients_whose_user_was_removed(tmp_path: Path) -> None:
    """MQTT 5.0: DISCONNECT 0x98 (administrative action); 3.1.1: the connection closes.
    A user still in the file stays connected, and a removed one cannot log in again."""
    proc, pw = _auth_gateway(tmp_path)
    try:
        alice = Paho(proc.port, "alice-5", 5, username="alice", password="pw-alice").connect()
        bob = Paho(proc.port, "bob-311", 4, username="bob", password="pw-bob").connect()
        carol = Paho(proc.port, "carol", 5, username="carol", password="pw-carol").connect()
        assert [str(c.connack) for c in (alice, bob, carol)] == ["Success"] * 3
        carol.subscribe("still/here", 1)
        assert ledge_passwd("-D", pw, "alice").returncode == 0
        assert ledge_passwd("-D", pw, "bob").returncode == 0
        _sighup(proc)
        wait_for(lambda: alice.disconnects, 5, "DISCONNECT at alice")
        assert alice.disconnects == [0x98]
        wait_for(lambda: bob.disconnects, 5, "bob's connection to close")
        assert bob.disconnects[0] != 0  # not a disconnect bob asked for
        proc.wait_log(r"'alice-5'.*user 'alice' is no longer in the password file")
        carol.publish("still/here", b"yes", 1)
        assert [m.payload for m in carol.wait_messages(1)] == [b"yes"]
        assert carol.disconnects == []
        again = Paho(proc.port, "alice-again", 5, username="alice", password="pw-alice")
        assert again.connect().connack.value == 0x86
        for client in (again, alice, bob):
            client.close()
        carol.disconnect()
    finally:
        assert proc.stop() == 0


def test_sighup_with_a_tightened_acl_stops_deliveries_at_once(tmp_path: Path) -> None:
    """A subscription made under the old ACL receives only what the new ACL lets its
    client read, from the reload on, without reconnecting."""
    acl = "user alice\ntopic read sensors/#\nuser carol\ntopic write sensors/#\n"
    proc, _pw = _auth_gateway(tmp_path, acl)
    try:
        alice = Paho(proc.port, "alice", 5, username="alice", password="pw-alice").connect()
        assert alice.subscribe("sensors/#", 1) == [1]
        carol = Paho(proc.port, "carol", 5, username="carol", password="pw-carol").connect()
        carol.publish("sensors/secret/a", b"1", 1)
        carol.publish("sensors/public/a", b"2", 1)
        alice.wait_messages(2)
        (tmp_path / "acl").write_text(
            "user alice\ntopic read sensors/public/#\nuser carol\ntopic write sensors/#\n"
        )
        _sighup(proc)
        carol.publish("sensors/secret/b", b"3", 1, refused=0x10)  # no one may read it now
        carol.publish("sensors/public/b", b"4", 1)
        got = alice.wait_messages(3)
        assert [(m.topic, m.payload) for m in got] == [
            ("sensors/secret/a", b"1"),
            ("sensors/public/a", b"2"),
            ("sensors/public/b", b"4"),
        ]
        assert alice.disconnects == []
        alice.disconnect()
        carol.disconnect()
    finally:
        assert proc.stop() == 0
