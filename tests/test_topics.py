"""Topic names and filters (MQTT 5.0 sections 4.7 and 4.8.2): validity with the reason
the log and the reason string give, shared subscriptions, matching and subsumption.

Each case is written out by hand from the specification's statements and examples."""

from __future__ import annotations

import pytest

from gateway.mqtt.topics import (
    filter_error,
    has_wildcard,
    matches,
    parse_shared,
    subsumes,
    topic_name_error,
)


@pytest.mark.parametrize(
    ("topic", "error"),
    [
        ("a/b", None),
        ("/", None),  # two empty levels are a valid name (4.7.3)
        ("$SYS/x", None),
        ("", "topic name is empty"),  # MQTT-4.7.3-1
        ("a/+", "topic name contains a wildcard"),  # MQTT-3.3.2-2
        ("a/#", "topic name contains a wildcard"),
        ("a\x00b", "topic name contains U+0000"),  # MQTT-4.7.3-2
        ("x" * 65_535, None),
        ("x" * 65_536, "topic name longer than 65,535 bytes"),
        ("é" * 32_768, "topic name longer than 65,535 bytes"),  # counted in UTF-8 bytes
    ],
)
def test_topic_name_errors(topic: str, error: str | None) -> None:
    assert topic_name_error(topic) == error


@pytest.mark.parametrize(
    ("topic_filter", "error"),
    [
        ("a/b", None),
        ("#", None),
        ("+", None),
        ("a/+/c", None),
        ("a/#", None),
        ("+/+/#", None),
        ("", "topic filter is empty"),  # MQTT-4.7.3-1
        ("a\x00b", "topic filter contains U+0000"),
        ("a\x00/#", "topic filter contains U+0000"),
        ("a#", "'#' must occupy a whole level"),  # MQTT-4.7.1-1
        ("a/#b", "'#' must occupy a whole level"),
        ("a/#/c", "'#' must be the last level"),
        ("#/#", "'#' must be the last level"),
        ("a+", "'+' must occupy a whole level"),  # MQTT-4.7.1-2
        ("a/+b/c", "'+' must occupy a whole level"),
        ("+a/#", "'+' must occupy a whole level"),
    ],
)
def test_filter_errors(topic_filter: str, error: str | None) -> None:
    assert filter_error(topic_filter) == error


@pytest.mark.parametrize(
    ("topic_filter", "parsed"),
    [
        ("a/b", None),
        ("$SYS/#", None),
        ("$share", None),
        ("$share/group/a/b", ("group", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/g/+/x/#", ("g", "+/x/#")),
    ],
)
def test_shared_subscriptions_are_parsed(topic_filter: str, parsed: tuple[str, str] | None) -> None:
    assert parse_shared(topic_filter) == parsed


@pytest.mark.parametrize(
    ("topic_filter", "error"),
    [
        ("$share/", "shared subscription needs $share/{ShareName}/{filter}"),
        ("$share/group", "shared subscription needs $share/{ShareName}/{filter}"),
        ("$share//a", "shared subscription needs $share/{ShareName}/{filter}"),
        ("$share/g+/a", "share name must not contain wildcards"),  # MQTT-4.8.2-2
        ("$share/g#/a", "share name must not contain wildcards"),
        ("$share/#/a", "share name must not contain wildcards"),
        ("$share/g/", "shared subscription has an empty topic filter"),
        ("$share/g/a/#/b", "'#' must be the last level"),
        ("$share/g/a+", "'+' must occupy a whole level"),
    ],
)
def test_malformed_shared_subscriptions_say_why(topic_filter: str, error: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_shared(topic_filter)
    assert str(caught.value) == error


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        # 4.7.1.2: '#' matches the parent and any number of child levels.
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/tennis/player1/#", "sport/tennis/player2", False),
        ("sport/#", "sport", True),
        ("#", "a/b/c", True),
        ("#", "/", True),
        # 4.7.1.3: '+' matches exactly one level, which may be empty.
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("+/tennis/#", "sport/tennis", True),
        # exact levels, and the number of levels
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/b", "a", False),
        ("a", "a/b", False),
        ("a/b/c", "a/b", False),
        ("a/+/c", "a/x/c", True),
        ("a/+/c", "a/x/d", False),
        # 4.7.2: wildcards at the first level do not match topics starting with '$'
        ("#", "$SYS/uptime", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/monitor/Clients", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("a/#", "a/$b", True),  # '$' only matters at the first level
        ("+/b", "$/b", False),
    ],
)
def test_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected


@pytest.mark.parametrize(
    ("general", "specific", "expected"),
    [
        ("#", "a/b", True),
        ("#", "#", True),
        ("a/#", "a/b/#", True),
        ("a/#", "a", True),
        ("a/#", "b/#", False),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),  # '#' reaches deeper than '+'
        ("a/+", "a/b/c", False),
        ("a/b", "a/+", False),
        ("a/b", "a/b", True),
        ("a/b", "a/b/c", False),
        ("a/b/c", "a/b", False),
        ("+/b", "a/b", True),
        ("+/b", "a/c", False),
        ("#", "$SYS/#", False),  # 4.7.2
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
    ],
)
def test_subsumes(general: str, specific: str, expected: bool) -> None:
    assert subsumes(general, specific) is expected


def test_has_wildcard() -> None:
    assert has_wildcard("a/+") and has_wildcard("#") and not has_wildcard("a/b")
