"""``ledge`` command line: run the gateway, check a config, manage a password file,
look at (and judge the health of) a running gateway, print the version."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway import __version__
from gateway.app.config import Config, Overrides, config_changes, load_config, parse_listen
from gateway.app.runtime import RUNTIME_ENV, ConfigError, build_authenticator, file_warnings
from gateway.cli import ble, bridge, firewall, health, status, update

EXIT_OK = 0
EXIT_CONFIG = 2


def _listen_arg(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_override_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        type=_listen_arg,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="listen here instead of the configured listeners (repeatable; port 0 = any free)",
    )
    parser.add_argument(
        "--data-dir", type=Path, metavar="DIR", help="directory for persistent state"
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default: the config's log.level, info)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledge",
        description="Ledge edge gateway: an MQTT 3.1.1/5.0 broker with sensor drivers "
        "and a cloud bridge, for Raspberry Pi-class hardware.",
    )
    parser.add_argument("--version", action="version", version=f"ledge {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="start the gateway",
        description="Start the gateway. Without --config it runs on the embedded default "
        "config: one listener on 127.0.0.1:1883 that allows anonymous clients. "
        "Flags override the file. SIGTERM/SIGINT stop it cleanly; SIGHUP reloads the file.",
    )
    run.add_argument("-c", "--config", type=Path, metavar="FILE", help="TOML config file")
    _add_override_flags(run)

    check = commands.add_parser(
        "check-config",
        help="validate a config file without starting",
        description="Validate FILE. Exit 0 when it is usable; otherwise print each problem "
        "with its key path and line and exit 2.",
    )
    check.add_argument("file", type=Path, metavar="FILE")
    check.add_argument(
        "--against",
        type=Path,
        metavar="OLD",
        help="also compare FILE with the config OLD and say on the last line whether a "
        "running gateway takes every change on SIGHUP ('reload'), needs a restart "
        "('restart') or nothing changed ('unchanged')",
    )
    _add_override_flags(check)
    # Used by a running gateway on SIGHUP: print the validated config as JSON.
    check.add_argument("--print-runtime", action="store_true", help=argparse.SUPPRESS)
    bridge.add_parser(commands)
    status.add_parser(commands)
    health.add_parser(commands)
    ble.add_parser(commands)
    firewall.add_parser(commands)
    update.add_parser(commands)

    from gateway.cli import passwd

    passwd.add_parser(commands)
    return parser


def _validated(path: Path | None, args: argparse.Namespace) -> tuple[Config, Overrides]:
    config = Config() if path is None else load_config(path)
    overrides = Overrides(tuple(args.listen), args.data_dir, args.log_level)
    config = overrides.apply(config)
    build_authenticator(config.auth.allow_anonymous, config.auth.password_file)
    return config, overrides


def _verdict(old_path: Path, new: Config, overrides: Overrides) -> str:
    """What a running gateway on ``old_path`` needs to take ``new``: one line starting
    with ``unchanged``, ``reload`` or ``restart``."""
    try:
        old = overrides.apply(load_config(old_path))
    except ConfigError as exc:
        # Not a config this version accepts (or none at all): nothing to compare with.
        first = str(exc).splitlines()[0]
        return f"restart: {old_path} cannot be compared ({first})"
    changes = config_changes(old, new)
    if not changes:
        return f"unchanged: no option differs from {old_path}"
    restart = [c.path for c in changes if not c.reloadable]
    reload = [c.path for c in changes if c.reloadable]
    if restart:
        also = f"; reloadable: {', '.join(reload)}" if reload else ""
        return f"restart: needed for {', '.join(restart)}{also}"
    return f"reload: SIGHUP applies every change: {', '.join(reload)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    if args.command == "bridge":
        return bridge.main(args)
    if args.command == "status":
        return status.main(args)
    if args.command == "health":
        return health.main(args)
    if args.command == "ble":
        return ble.main(args)
    if args.command == "firewall":
        return firewall.main(args)
    if args.command == "update":
        return update.main(args)
    if args.command == "passwd":
        from gateway.cli import passwd

        return passwd.run(args)
    path: Path | None = args.file if args.command == "check-config" else args.config
    try:
        config, overrides = _validated(path, args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    runtime = config.to_runtime(path, overrides)
    if args.command == "check-config":
        if args.print_runtime:
            print(runtime.to_json())
        else:
            listeners = ", ".join(
                f"{lc.host}:{lc.port}" + ("" if lc.type == "tcp" else f" {lc.type}")
                for lc in config.listeners
            )
            print(f"{args.file}: OK ({len(config.listeners)} listener(s): {listeners})")
            for warning in file_warnings(runtime):
                print(f"{args.file}: warning: {warning}", file=sys.stderr)
            if args.against is not None:
                print(_verdict(args.against, config, overrides))
        return EXIT_OK
    # run: become the gateway process, leaving the validator's memory behind.
    sys.stdout.flush()
    sys.stderr.flush()
    env = dict(os.environ)
    env[RUNTIME_ENV] = runtime.to_json()
    # The original arguments ride along so ps and pkill still show them.
    os.execve(sys.executable, [sys.executable, "-m", "gateway.app", *sys.argv[1:]], env)
    return EXIT_OK  # pragma: no cover - execve does not return


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
