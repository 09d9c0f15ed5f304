"""Durable state in SQLite (sessions, queued messages, retained, bridge outbox)."""
