"""``ledge`` command line: run the gateway, check a config, print the version."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway import __version__
from gateway.config import Config, ConfigError, Overrides, load_config, parse_listen

EXIT_OK = 0
EXIT_CONFIG = 2


def _listen_arg(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    run.add_argument(
        "--listen",
        type=_listen_arg,
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="listen here instead of the configured listeners (repeatable; port 0 = any free)",
    )
    run.add_argument("--data-dir", type=Path, metavar="DIR", help="directory for persistent state")
    run.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default: the config's log.level, info)",
    )

    check = commands.add_parser(
        "check-config",
        help="validate a config file without starting",
        description="Validate FILE. Exit 0 when it is usable; otherwise print each problem "
        "with its key path and line and exit 2.",
    )
    check.add_argument("file", type=Path, metavar="FILE")
    return parser


def _load(path: Path | None) -> Config:
    return Config() if path is None else load_config(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    if args.command == "check-config":
        try:
            config = load_config(args.file)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return EXIT_CONFIG
        from gateway.app import build_authenticator

        try:
            build_authenticator(config)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return EXIT_CONFIG
        listeners = ", ".join(f"{lc.host}:{lc.port}" for lc in config.listeners)
        print(f"{args.file}: OK ({len(config.listeners)} listener(s): {listeners})")
        return EXIT_OK
    # run
    try:
        config = _load(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    config = Overrides(tuple(args.listen), args.data_dir, args.log_level).apply(config)
    from gateway.app import run_forever, setup_logging

    setup_logging(config.log.level)
    try:
        return run_forever(config, args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # pragma: no cover - signal handlers normally catch it
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
