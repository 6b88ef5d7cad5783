"""vsagen.attention.ulysses_attention with gloo and 2 processes: the all-to-all exchanges against slicing, timed as
"all_to_all", and every registered backend (torch implementations) under `UlyssesAttention` over 2 ranks equal to the
same backend on the whole sequence, forward and backward, on a grid with partial tiles (fp32, max abs difference
<= 1e-5). The workload is tests/ulysses_worker.py's `attention_workload`, run by its session fixture `gloo_runs` on
the 2 processes that also run tests/parallel/test_ulysses.py's and test_cfg.py's; the processes have a timeout."""

from __future__ import annotations

import pytest
from ulysses_worker import TILE_CASES

import vsagen.attention.ulysses_attention  # noqa: F401  (the module under test; the workers import it)
from vsagen.attention import backend_names

# One pytest-xdist worker runs this file and the other two files of the xdist group "gloo" (tests/scheduling.py):
# the session fixture `gloo_runs` (tests/ulysses_worker.py) spawns 2 gloo processes once for the three files.
pytestmark = pytest.mark.xdist_group("gloo")


@pytest.fixture(scope="module")
def results(gloo_runs):
    return gloo_runs("attention")


def test_exchanges_are_slicing(results):
    for res in results:
        assert res["seq_to_heads"] == 0.0 and res["round_trip"] == 0.0


def test_the_exchanges_are_timed_as_all_to_all(results):
    """Two "all_to_all" regions a call (q, k, v in; the output back), and none with the timer disabled."""
    for res in results:
        assert res["all_to_all regions"] == ["all_to_all", "all_to_all"], res


@pytest.mark.parametrize("name", [*backend_names(), *TILE_CASES])
def test_every_backend_under_ulysses_2_equals_one_process(results, name):
    for res in results:
        assert res[f"{name} fwd"] <= 1e-5, res
        assert res[f"{name} bwd"] <= 1e-5, res


def test_attending_the_own_shard_only_would_be_caught(results):
    """What a processor without the all-to-all does (each rank over its own tokens): far from the whole sequence's
    attention, so the comparisons above can fail."""
    for res in results:
        assert res["shard only"] > 1e-2, res
