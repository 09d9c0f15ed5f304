"""The config reference: every option of ``gateway.app.config.Config``, walked table by table.

Types, defaults, bounds and the reload mark come from the declarations (``option()``,
through the pydantic models made from them); each option's description is the comment
above it in ``ledge.example.toml``, which a test already holds to the declarations.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.app.config import Config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "ledge.example.toml"

#: Comment lines that end a description when read upwards: the reload note, another
#: option's line (set or commented out), a banner.
_STOP = re.compile(r"^# ?(reload: |[a-z_0-9]+ = |-{8})")


@dataclass(frozen=True)
class Option:
    name: str
    kind: str
    default: str
    bounds: str
    reload: bool
    required: bool
    description: str


@dataclass(frozen=True)
class Table:
    path: str  # dotted: "bridges.rules"
    header: str  # as written in TOML: "[[bridges.rules]]"
    description: str
    options: list[Option]


def _models(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field holds and how: ``"table"``, ``"array"`` (a list of tables) or
    ``"map"`` (tables by name)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "table"
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            model, how = _models(arg)
            if model is not None:
                return model, how
    if origin in (list, tuple) and args:
        model, _ = _models(args[0])
        if model is not None:
            return model, "array"
    if origin is dict and len(args) == 2:
        model, _ = _models(args[1])
        if model is not None:
            return model, "map"
    return None, ""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names)
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default(info: FieldInfo) -> tuple[str, bool]:
    """The default as TOML (``""`` when unset) and whether the option is required."""
    if info.is_required():
        return "", True
    factory = info.default_factory
    value = factory() if factory is not None else info.default  # type: ignore[call-arg]
    if value is None or value is PydanticUndefined:
        return "", False
    return _toml_value(value), False


def _bounds(info: FieldInfo) -> str:
    said = []
    for meta in info.metadata:
        for attr, word in (
            ("ge", "at least"),
            ("gt", "above"),
            ("le", "at most"),
            ("lt", "below"),
            ("min_length", "length at least"),
            ("max_length", "length at most"),
        ):
            value = getattr(meta, attr, None)
            if value is not None:
                said.append(f"{word} {_toml_value(value)}")
    return ", ".join(said)


def _section(text: str, header: str) -> str | None:
    """The example file's text of one table (its header commented out or not)."""
    for written in (header, "# " + header):
        start = text.find("\n" + written + "\n")
        if start >= 0:
            rest = text[start + len(written) + 2 :]
            nxt = re.search(r"^\[", rest, re.M)
            return rest[: nxt.start()] if nxt else rest
    return None


def _banner(text: str, header: str) -> str:
    """The comment block above a table's header: what the table is for."""
    for written in (header, "# " + header):
        start = text.find("\n" + written + "\n")
        if start >= 0:
            lines = text[:start].splitlines()
            block: list[str] = []
            for line in reversed(lines):
                if not line.startswith("#") or _STOP.match(line):
                    break
                block.append(line)
            return _prose(reversed(block))
    return ""


def _prose(lines: typing.Iterable[str]) -> str:
    out = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines]
    return "\n".join(out).strip()


def _description(section: str | None, name: str) -> str:
    if section is None:
        return ""
    m = re.search(rf"^#? ?{re.escape(name)} = ", section, re.M)
    if m is None:
        return ""
    above = section[: m.start()].splitlines()
    block: list[str] = []
    for line in reversed(above):
        if not line.startswith("#"):
            if not block and re.match(r"^[a-z_0-9]+ = ", line):
                continue  # an option before it, set, sharing its description
            break
        if _STOP.match(line):
            if block or line.startswith("# ----"):
                break
            # This option's own reload note, or the line of an option before it that
            # shares its description ("certfile" and "keyfile").
            continue
        block.append(line)
    return _prose(reversed(block))


def _position(section: str, name: str) -> int:
    m = re.search(rf"^#? ?{re.escape(name)} = ", section, re.M)
    return m.start() if m else len(section)


def tables() -> list[Table]:
    """Every table of the config, in the order of the model, with its options."""
    text = EXAMPLE.read_text()
    found: list[Table] = []

    def walk(model: type[BaseModel], path: str, header: str, about: str) -> None:
        section = _section(text, header) if header else text[: text.index("\n[")]
        options: list[Option] = []
        nested: list[tuple[type[BaseModel], str, str, str]] = []
        for name, info in model.model_fields.items():
            inner, how = _models(info.annotation)
            reload = bool((info.json_schema_extra or {}).get("reload"))  # type: ignore[union-attr]
            if inner is not None:
                sub = f"{path}.{name}" if path else name
                written = {
                    "table": f"[{sub}]",
                    "array": f"[[{sub}]]",
                    "map": f"[{sub}.NAME]",
                }[how]
                nested.append((inner, sub, written, _description(section, name)))
                continue
            default, required = _default(info)
            options.append(
                Option(
                    name=name,
                    kind=_type_name(info.annotation),
                    default=default,
                    bounds=_bounds(info),
                    reload=reload,
                    required=required,
                    description=_description(section, name),
                )
            )
        if section is not None:
            place = {o.name: _position(section, o.name) for o in options}
            options.sort(key=lambda o: place[o.name])
        if options:
            found.append(Table(path or "(top level)", header, about, options))
        for inner, sub, written, said in nested:
            walk(inner, sub, written, said or _banner(text, written))

    walk(Config, "", "", "")
    return found


def _md_text(text: str) -> str:
    """Example-file prose as Markdown: ``<`` is not a tag, ``*`` is no emphasis."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*")


def markdown() -> str:
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m docs.gen` from the option() declarations and",
        "     ledge.example.toml: do not edit; change those and run it again. -->",
        "",
        "One TOML file, validated on load (`ledge check-config FILE` validates without",
        "starting). Every option has a default, so an empty file is the embedded default:",
        "one listener on 127.0.0.1:1883 that allows anonymous clients. Options marked",
        "*reload* are applied by SIGHUP (`systemctl reload ledge`); the others need a",
        "restart. Sizes are in bytes, times in seconds. `ledge.example.toml` in the",
        "repository shows every option at its default, with these descriptions.",
        "",
    ]
    for table in tables():
        title = table.header or "Top level"
        out += [f"## `{title}`", ""]
        if table.description:
            out += [_md_text(table.description), ""]
        for opt in table.options:
            facts = [f"*{opt.kind}*"]
            if opt.required:
                facts.append("required")
            elif opt.default:
                facts.append(f"default `{opt.default}`")
            else:
                facts.append("unset by default")
            if opt.bounds:
                facts.append(opt.bounds)
            facts.append("reload: **yes**" if opt.reload else "reload: no (restart)")
            out += [f"### `{table.path}.{opt.name}`" if table.header else f"### `{opt.name}`"]
            out += ["", " · ".join(facts), ""]
            if opt.description:
                out += [_md_text(opt.description), ""]
    return "\n".join(out).rstrip() + "\n"
