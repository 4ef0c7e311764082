"""Fixtures shared by the runtime-bridge tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def one_rank_group():
    """A one-rank gloo process group in this process (the single-process forms of the parallel paths)."""
    dist = pytest.importorskip("torch.distributed")
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
