"""Topic rules: which local topics go up, which remote topics come down, and as what. Pure.

A rule's ``filter`` is relative. Locally it selects ``local_prefix + filter``,
remotely ``remote_prefix + filter``; a topic crossing the bridge loses one prefix
and gains the other (Mosquitto's ``topic`` line works the same way):

    filter "sensors/#", local_prefix "ledge/gw1/", remote_prefix "site1/gw1/"
    ledge/gw1/sensors/t  --out-->  site1/gw1/sensors/t

So a prefix pair adds (``""`` -> ``"site1/"``), replaces (``"a/"`` -> ``"b/"``) or
strips (``"ledge/"`` -> ``""``) a leading part. The first rule that matches wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.bridge.settings import RuleSettings
from gateway.mqtt.topics import filter_error, matches, topic_name_error


@dataclass(frozen=True, slots=True)
class Mapped:
    """Where a message goes across the bridge and how."""

    index: int  # of the rule, from 0
    topic: str
    qos: int
    retain: bool


def _cross(
    rule: RuleSettings, topic: str, from_prefix: str, to_prefix: str
) -> tuple[str | None, str]:
    """``(mapped topic, "")`` or ``(None, why not)``."""
    if not topic.startswith(from_prefix):
        return None, f"does not start with the prefix {from_prefix!r}"
    rest = topic[len(from_prefix) :]
    if not matches(rule.filter, rest):
        if not from_prefix:
            return None, f"does not match the filter {rule.filter!r}"
        return None, (
            f"does not match the filter {rule.filter!r} once the prefix {from_prefix!r} "
            f"is taken off (leaving {rest!r})"
        )
    mapped = to_prefix + rest
    error = topic_name_error(mapped)
    if error:
        return None, f"would become {mapped!r}: {error}"
    return mapped, ""


def map_out(rules: Sequence[RuleSettings], topic: str, qos: int, retain: bool) -> Mapped | None:
    """The remote topic, QoS and retain flag for a local message, or None."""
    for i, rule in enumerate(rules):
        if not rule.outbound:
            continue
        mapped, _ = _cross(rule, topic, rule.local_prefix, rule.remote_prefix)
        if mapped is not None:
            return Mapped(i, mapped, min(qos, rule.qos), retain and rule.retain == "keep")
    return None


def map_in(rules: Sequence[RuleSettings], topic: str, qos: int, retain: bool) -> Mapped | None:
    """The local topic, QoS and retain flag for a message from the remote, or None."""
    for i, rule in enumerate(rules):
        if not rule.inbound:
            continue
        mapped, _ = _cross(rule, topic, rule.remote_prefix, rule.local_prefix)
        if mapped is not None:
            return Mapped(i, mapped, min(qos, rule.qos), retain and rule.retain == "keep")
    return None


def explain(rules: Sequence[RuleSettings], topic: str, outbound: bool = True) -> list[str]:
    """One line per rule saying whether and how it maps ``topic`` (for ``ledge bridge test``)."""
    lines: list[str] = []
    decided = False
    for i, rule in enumerate(rules):
        head = f"rule {i + 1} ({rule.direction} {rule.filter!r}"
        if rule.local_prefix or rule.remote_prefix:
            head += f", local {rule.local_prefix!r} <-> remote {rule.remote_prefix!r}"
        head += ")"
        if decided:
            lines.append(f"{head}: not consulted, an earlier rule matched")
            continue
        if outbound and not rule.outbound:
            lines.append(f"{head}: no, it only brings remote topics in")
            continue
        if not outbound and not rule.inbound:
            lines.append(f"{head}: no, it only sends local topics out")
            continue
        if outbound:
            mapped, why = _cross(rule, topic, rule.local_prefix, rule.remote_prefix)
        else:
            mapped, why = _cross(rule, topic, rule.remote_prefix, rule.local_prefix)
        if mapped is None:
            lines.append(f"{head}: no, {topic!r} {why}")
            continue
        decided = True
        where = "remote" if outbound else "local"
        retain = "kept" if rule.retain == "keep" else "stripped"
        lines.append(
            f"{head}: yes -> {where} topic {mapped!r}, QoS at most {rule.qos}, retain {retain}"
        )
    return lines


def rule_errors(rule: RuleSettings) -> list[str]:
    """What is wrong with a rule (config validation), as ``field: problem`` texts."""
    problems: list[str] = []
    error = filter_error(rule.filter)
    if error:
        problems.append(f"filter: {error}")
    elif rule.filter.startswith("$share/"):
        problems.append("filter: shared subscriptions cannot be bridged")
    for name in ("local_prefix", "remote_prefix"):
        prefix: str = getattr(rule, name)
        if "+" in prefix or "#" in prefix or "\x00" in prefix:
            problems.append(f"{name}: must not contain wildcards or U+0000")
    if rule.direction not in ("out", "in", "both"):
        problems.append("direction: must be 'out', 'in' or 'both'")
    return problems
