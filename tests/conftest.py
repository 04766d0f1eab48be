"""Shared test set-up: Hypothesis profiles and the GPU marker's skip rule."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.client.fake_node import FakeNodes

# ci: derandomized so a CI failure replays exactly; dev: the default; nightly: many more examples.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=100,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100, print_blob=True)
settings.register_profile(
    "nightly",
    deadline=None,
    max_examples=5_000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _has_gpu() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a CUDA device with CuPy")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fakes() -> Iterator[FakeNodes]:
    """Fake nodes for one test, stopped after it (`tests/client/fake_node.py`): the client's
    tests and the CLI's."""
    nodes = FakeNodes()
    try:
        yield nodes
    finally:
        nodes.close()
