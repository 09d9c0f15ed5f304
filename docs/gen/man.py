"""``ledge(1)`` and ``ledge.toml(5)`` in roff, from the same sources as the manual's
reference pages: the argparse parsers and the config walk (``docs.gen.config``)."""

from __future__ import annotations

import argparse
import re

from docs.gen import cli, config
from gateway import __version__

#: The date in the pages' header: fixed, so the files change only with what they say.
SOURCE = f"Ledge {__version__}"


def esc(text: str) -> str:
    """Plain text as roff: backslashes, hyphens, and a control character at a line's start."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def _para(text: str) -> str:
    return esc(re.sub(r"\s*\n\s*", " ", text.strip()))


def _synopsis(path: tuple[str, ...], parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    return re.sub(r"\s+", " ", usage)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                names += " " + (action.metavar or action.dest.upper())  # type: ignore[operator]
        else:
            names = str(action.metavar or action.dest)
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog}
        out += [".TP", f".B {esc(names)}", _para(help_text) if help_text else ""]
    return out


def ledge_1() -> str:
    parsers = list(cli.commands())
    top = parsers[0][1]
    out = [
        f'.TH LEDGE 1 "" "{SOURCE}" "Ledge manual"',
        ".SH NAME",
        "ledge \\- edge gateway: MQTT broker, sensor drivers, firmware and cloud bridges",
        ".SH SYNOPSIS",
    ]
    for path, parser in parsers[1:]:
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            out += [".PP", f".B {esc(_synopsis(path, parser))}"]
    out += [".PP", ".B ledge \\-\\-version"]
    out += [".SH DESCRIPTION", _para(top.description or "")]
    out += [
        ".PP",
        "With no configuration the gateway listens on 127.0.0.1:1883 and allows anonymous",
        "clients. The configuration file is described in",
        ".BR ledge.toml (5).",
        ".SH COMMANDS",
    ]
    for path, parser in parsers[1:]:
        out += [f".SS {esc(' '.join(path))}", _para(parser.description or "")]
        out += _options(parser)
    out += [
        ".SH SIGNALS",
        ".TP",
        ".B SIGTERM, SIGINT",
        "Stop cleanly: MQTT 5.0 clients receive DISCONNECT 0x8B; the exit status is 0.",
        ".TP",
        ".B SIGHUP",
        "Read the configuration file again and apply every option marked reload; the log",
        "names what changed and what needs a restart. A broken file is reported and the",
        "running configuration kept.",
        ".SH EXIT STATUS",
        "0 on success; 2 for a configuration that cannot be used (each problem is printed",
        "with its key path and line).",
        ".SH FILES",
        ".TP",
        ".I /etc/ledge/ledge.toml",
        "The configuration of the SD-card image and the fleet role.",
        ".TP",
        ".I /var/lib/ledge",
        "The image's data_dir: the store, ledge.db, and the BLE encryption counters.",
        ".SH SEE ALSO",
        ".BR ledge.toml (5),",
        ".BR mosquitto_passwd (1),",
        ".BR mosquitto_sub (1)",
    ]
    return "\n".join(line for line in out if line != "") + "\n"


def ledge_toml_5() -> str:
    out = [
        f'.TH LEDGE.TOML 5 "" "{SOURCE}" "Ledge manual"',
        ".SH NAME",
        "ledge.toml \\- configuration file of the Ledge gateway",
        ".SH DESCRIPTION",
        "One TOML file, validated on load;",
        ".B ledge check\\-config",
        ".I FILE",
        "validates it without starting. Every option has a default, so an empty file is",
        "the embedded default: one listener on 127.0.0.1:1883 that allows anonymous",
        "clients. Options marked",
        ".B reload: yes",
        "are applied by SIGHUP",
        "(systemctl reload ledge); the others need a restart. Sizes are in bytes, times",
        "in seconds.",
    ]
    for table in config.tables():
        out += [f".SH {esc(table.header or 'TOP LEVEL')}"]
        if table.description:
            out += [_para(table.description)]
        for opt in table.options:
            facts = [opt.kind.replace(" \\| ", " | ")]
            if opt.required:
                facts.append("required")
            elif opt.default:
                facts.append(f"default {opt.default}")
            else:
                facts.append("unset by default")
            if opt.bounds:
                facts.append(opt.bounds)
            facts.append("reload: yes" if opt.reload else "reload: no")
            out += [".TP", f".B {esc(opt.name)}", esc("; ".join(facts) + ".")]
            if opt.description:
                out += [".br", _para(opt.description)]
    out += [
        ".SH FILES",
        ".I /etc/ledge/ledge.toml",
        ".SH SEE ALSO",
        ".BR ledge (1),",
        ".BR mosquitto.conf (5)",
    ]
    return "\n".join(line for line in out if line != "") + "\n"
