"""Shared test setup: JAX on CPU with its default (single) device; `slow` marks end-to-end tests.

Tests that need several CPU devices set XLA_FLAGS themselves (see parallel_test.py), so nothing here
touches XLA_FLAGS.  `pytest -m "not slow"` skips the end-to-end runs; under pytest-xdist the slow tests
are collected first so that the two workers start them early and finish together.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before any test module imports jax


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: end-to-end test that compiles a training run (seconds+)")


def pytest_collection_modifyitems(session, config, items):
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow tests first
