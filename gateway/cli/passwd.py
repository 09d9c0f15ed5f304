"""``ledge passwd``: add, change and delete users of a password file.

The file format is mosquitto_passwd's (``user:$7$iterations$salt$hash``), so a file
written here works with Mosquitto and a Mosquitto file works here. Hashes are
PBKDF2-HMAC-SHA512 with ``DEFAULT_ITERATIONS`` (see ``gateway.broker.auth``).

The file is replaced atomically (a new file beside it, fsynced, renamed over it) with
mode 0600; comments, blank lines and the other users' lines are kept as they were.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import tempfile
from pathlib import Path

from gateway.broker.auth import (
    DEFAULT_ITERATIONS,
    PasswordFileError,
    hash_password,
    parse_password_file,
)

EXIT_OK = 0
EXIT_ERROR = 1


class PasswdError(Exception):
    """Something the user must fix; the message says what."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "passwd",
        help="add, change or delete a user of a password file",
        description="Add or change USER in the password FILE (asking for the password "
        "twice, without echo), or delete it with -D. The file format is mosquitto_passwd's: "
        "the files work with both.",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument("-c", dest="create", action="store_true", help="create FILE (replaces it)")
    what.add_argument("-D", dest="delete", action="store_true", help="delete USER from FILE")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "-b",
        dest="batch",
        action="store_true",
        help="take the password from the command line (visible to other users: prefer "
        "--password-stdin)",
    )
    how.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    parser.add_argument(
        "-I",
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        metavar="N",
        help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS:,})",
    )
    parser.add_argument("file", type=Path, metavar="FILE")
    parser.add_argument("user", metavar="USER")
    parser.add_argument("password", nargs="?", metavar="PASSWORD", help="with -b only")


def run(args: argparse.Namespace) -> int:
    try:
        _run(args)
    except PasswdError as exc:
        print(f"ledge passwd: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _run(args: argparse.Namespace) -> None:
    user: str = args.user
    _check_user(user)
    if args.password is not None and not args.batch:
        raise PasswdError("a PASSWORD argument needs -b")
    if args.iterations < 1:
        raise PasswdError("--iterations must be at least 1")
    path: Path = args.file
    lines = [] if args.create else _read(path)
    if args.delete:
        kept = [line for line in lines if _user_of(line) != user]
        if len(kept) == len(lines):
            raise PasswdError(f"user {user!r} is not in {path}")
        _write(path, kept)
        return
    password = _password(args)
    entry = f"{user}:{hash_password(password, args.iterations).encode()}"
    replaced = False
    out = []
    for line in lines:
        if _user_of(line) == user:
            if not replaced:
                out.append(entry)
            replaced = True
        else:
            out.append(line)
    if not replaced:
        out.append(entry)
    _write(path, out)


def _check_user(user: str) -> None:
    if not user:
        raise PasswdError("the user name is empty")
    if ":" in user:
        raise PasswdError("a user name cannot contain ':'")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in user):
        raise PasswdError("a user name cannot contain control characters")
    if user != user.strip() or user.startswith("#"):
        raise PasswdError("a user name cannot start with '#' or blanks, or end with blanks")
    if len(user.encode("utf-8")) > 65_535:
        raise PasswdError("the user name is longer than MQTT allows (65,535 bytes)")


def _read(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PasswdError(f"{path} does not exist (create it with -c)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PasswdError(f"cannot read {path}: {exc}") from None
    skipped: list[PasswordFileError] = []
    parse_password_file(text, skipped)
    for problem in skipped:
        # Kept as they are (a user set again replaces its own line); the gateway skips them.
        print(f"ledge passwd: warning: {path} {problem}", file=sys.stderr)
    return text.splitlines()


def _user_of(line: str) -> str | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    return stripped.partition(":")[0]


def _password(args: argparse.Namespace) -> str:
    if args.batch:
        if args.password is None:
            raise PasswdError("-b needs the password after USER")
        password: str = args.password
    elif args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Reenter password: ") != password:
            raise PasswdError("the passwords do not match")
    if not password:
        raise PasswdError("the password is empty")
    if len(password.encode("utf-8")) > 65_535:
        raise PasswdError("the password is longer than MQTT allows (65,535 bytes)")
    return password


def _write(path: Path, lines: list[str]) -> None:
    """Replace ``path`` atomically with ``lines``, mode 0600."""
    directory = path.parent
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.")  # mode 0600
    except OSError as exc:
        raise PasswdError(f"cannot write in {directory}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join(line + "\n" for line in lines))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise PasswdError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)
