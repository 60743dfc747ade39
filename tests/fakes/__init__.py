"""Fake upstream servers for tests (real HTTP on loopback)."""
