"""The broker core: sessions, subscriptions, QoS flows, retained messages, wills.

Pure: no sockets, no asyncio, no clock. Time is an argument; output collects on
connections for the shell to write.
"""

from __future__ import annotations

from gateway.broker.auth import Authenticator, PasswordAuthenticator
from gateway.broker.core import Broker
from gateway.broker.message import Message
from gateway.broker.settings import NEVER_EXPIRES, BrokerSettings
from gateway.broker.state import Connection, Session, State, Subscription
from gateway.broker.subtree import SubTree

__all__ = [
    "NEVER_EXPIRES",
    "Authenticator",
    "Broker",
    "BrokerSettings",
    "Connection",
    "Message",
    "PasswordAuthenticator",
    "Session",
    "State",
    "SubTree",
    "Subscription",
]
