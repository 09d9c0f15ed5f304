"""Test support: a pure-core harness and real-process fixtures."""
