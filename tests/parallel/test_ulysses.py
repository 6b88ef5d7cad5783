"""vsagen.parallel.ulysses: the degrees that split heads and tokens, the refusal of one that does not, and with gloo
and 2 processes the whole transformer under diffusers' context parallelism with vsagen's plan: every registered
backend (torch implementations) under Ulysses 2 equal to one process (fp32, max abs difference <= 1e-5). The exchanges
and `UlyssesAttention` themselves: tests/attention/test_ulysses_attention.py. The workload is
tests/ulysses_worker.py's `cp_workload`, run by its session fixture `gloo_runs` on the 2 processes that also run the
other two files'; the processes have a timeout."""

from __future__ import annotations

import pytest
from ulysses_worker import TILE_CASES

import vsagen.parallel.ulysses  # noqa: F401  (the module under test; the workers import it)
from vsagen.attention import backend_names

# One pytest-xdist worker runs this file and the other two files of the xdist group "gloo" (tests/scheduling.py):
# the session fixture `gloo_runs` (tests/ulysses_worker.py) spawns 2 gloo processes once for the three files.
pytestmark = pytest.mark.xdist_group("gloo")


@pytest.fixture(scope="module")
def cp_results(gloo_runs):
    return gloo_runs("cp")


@pytest.mark.parametrize("name", [*backend_names(), *TILE_CASES])
def test_diffusers_ulysses_2_with_every_backend_equals_one_process(cp_results, name):
    """The whole transformer: vsagen.apply, then enable_parallelism(ulysses_degree=2) with vsagen's plan (the
    tile-order hooks build the layout of the backend's cube: `vsa:tile=4x4x8`, `sla-star:tile=4x8x8`)."""
    for res in cp_results:
        assert name in res, res
        assert res[name] <= 1e-5, res


def test_vsagen_applied_after_enable_parallelism_is_refused(cp_results):
    for res in cp_results:
        assert "late apply" in res, res
        assert "no parallel config" in res["late apply"] and "enable_parallelism" in res["late apply"], res


def test_ulysses_degrees_split_heads_and_tokens():
    from vsagen.parallel.ulysses import ulysses_degrees

    assert ulysses_degrees(12, 32760, 8) == [1, 2, 3, 4, 6]  # Wan2.1-1.3B at 480x832x81: 32760 = 8 x 4095
    assert ulysses_degrees(40, 75600, 8) == [1, 2, 4, 5, 8]  # 14B at 720x1280x81
    assert ulysses_degrees(2, 7, 8) == [1]


def test_check_ulysses_degree_refuses_with_the_valid_degrees():
    from vsagen.errors import BadInput
    from vsagen.parallel.ulysses import check_ulysses_degree

    for n in (1, 2, 3, 4, 6):
        check_ulysses_degree(n, 12, 32760)
    with pytest.raises(BadInput) as info:
        check_ulysses_degree(8, 12, 32760)
    msg = str(info.value)
    assert "12 heads" in msg and "32760 tokens" not in msg.split("(")[0] and msg.endswith("1, 2, 3, 4, 6")
    with pytest.raises(BadInput, match=r"does not divide 2 heads and 7 tokens.*degrees that do: 1$"):
        check_ulysses_degree(3, 2, 7)
    with pytest.raises(BadInput, match="at least 1"):
        check_ulysses_degree(0, 12, 32760)
