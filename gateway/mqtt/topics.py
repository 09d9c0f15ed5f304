"""Topic names and topic filters (MQTT 5.0 section 4.7, 4.8.2)."""

from __future__ import annotations

from typing import Final

SHARE_PREFIX: Final = "$share/"


def topic_name_error(topic: str) -> str | None:
    """Why ``topic`` cannot be a PUBLISH topic name, or None when it can."""
    if not topic:
        return "topic name is empty"  # MQTT-4.7.3-1
    if "+" in topic or "#" in topic:
        return "topic name contains a wildcard"  # MQTT-3.3.2-2
    if "\x00" in topic:
        return "topic name contains U+0000"
    if len(topic.encode("utf-8")) > 65_535:
        return "topic name longer than 65,535 bytes"
    return None


def filter_error(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid (non-shared) topic filter, or None."""
    if not topic_filter:
        return "topic filter is empty"  # MQTT-4.7.3-1
    if "\x00" in topic_filter:
        return "topic filter contains U+0000"
    if "+" not in topic_filter and "#" not in topic_filter:
        return None
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            if level != "#":
                return "'#' must occupy a whole level"  # MQTT-4.7.1-1
            if i != last:
                return "'#' must be the last level"
        elif "+" in level and level != "+":
            return "'+' must occupy a whole level"  # MQTT-4.7.1-2
    return None


def parse_shared(topic_filter: str) -> tuple[str, str] | None:
    """``(share_name, filter)`` for ``$share/{ShareName}/{filter}``, else None.

    Raises ValueError for a malformed shared subscription (MQTT-4.8.2-1, -2).
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    rest = topic_filter[len(SHARE_PREFIX) :]
    name, sep, inner = rest.partition("/")
    if not sep or not name:
        raise ValueError("shared subscription needs $share/{ShareName}/{filter}")
    if "+" in name or "#" in name:
        raise ValueError("share name must not contain wildcards")
    if not inner:
        raise ValueError("shared subscription has an empty topic filter")
    error = filter_error(inner)
    if error:
        raise ValueError(error)
    return name, inner


def has_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


def matches(topic_filter: str, topic: str) -> bool:
    """Does ``topic_filter`` match ``topic``? The one-function oracle for every tree.

    A filter starting with a wildcard does not match a topic starting with '$'
    (MQTT-4.7.2-1). '#' also matches the parent level ("a/#" matches "a").
    """
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


def subsumes(general: str, specific: str) -> bool:
    """Does every topic matched by filter ``specific`` also match filter ``general``?"""
    g_levels = general.split("/")
    s_levels = specific.split("/")
    if s_levels[0].startswith("$") and g_levels[0] in ("+", "#"):
        return False
    for i, g in enumerate(g_levels):
        if g == "#":
            return True
        if i >= len(s_levels):
            return False
        s = s_levels[i]
        if s == "#":
            return False
        if g == "+":
            continue
        if g != s:
            return False
    return len(g_levels) == len(s_levels)
