"""Shared fixtures of the client's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.client.fake_node import FakeNodes


@pytest.fixture
def fakes() -> Iterator[FakeNodes]:
    """Fake nodes for one test, stopped after it (`tests/client/fake_node.py`)."""
    nodes = FakeNodes()
    try:
        yield nodes
    finally:
        nodes.close()
