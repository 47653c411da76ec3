"""Fixtures of the GPU tests (tests/gpu); a module's own fixture of the same name wins."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A freshly seeded generator; the seed is printed and kept in the test's user properties (to replay a failure)."""
    seed = int(np.random.SeedSequence().entropy % (2**63))
    request.node.user_properties.append(("seed", seed))
    print(f"seed {seed}")
    return np.random.default_rng(seed)
