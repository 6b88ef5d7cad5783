"""vsagen.parallel.cfg: CFG parallel (the conditional and unconditional passes on different ranks) through vsagen's
orchestrator with gloo and 2 spawned processes equals one process (fp32, max abs difference <= 1e-5) for every
registered backend (torch impls) on the tiny model's grid with partial tiles and for both experts of tiny-a14b; a
served unconditional call counts no DiT forward; `profile_dit` under CFG parallel (every configuration, the overhead
rows included); the refusals before loading. The workload is tests/ulysses_worker.py's `cfg_workload`, run by its
session fixture `gloo_runs` on the 2 processes that also run the other two files'. The CLI under torchrun:
tests/parallel/test_launch.py."""

from __future__ import annotations

import pytest
from ulysses_worker import CFG_TINY_BACKENDS

from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.errors import BadInput
from vsagen.parallel.cfg import CfgSplit, check_cfg_parallel
from vsagen.timing import Timer

# One pytest-xdist worker runs this file and the other two files of the xdist group "gloo" (tests/scheduling.py):
# the session fixture `gloo_runs` (tests/ulysses_worker.py) spawns 2 gloo processes once for the three files.
pytestmark = pytest.mark.xdist_group("gloo")

CASES = (*(f"tiny {a}" for a in CFG_TINY_BACKENDS), "tiny-a14b full")


@pytest.fixture(scope="module")
def results(gloo_runs):
    """`gloo_runs` builds both checkpoints before the processes start (they load them)."""
    return gloo_runs("cfg")


@pytest.mark.parametrize("case", CASES)
def test_cfg_parallel_equals_one_process(results, case):
    for res in results:
        assert case in res, res
        got = res[case]
        assert got["diff"] <= 1e-5, res
        assert got["exchange timed"], res
    grid = results[0]["tiny full"]["grid"]
    assert any(n % 4 for n in grid), grid  # partial tiles


def test_each_rank_runs_one_forward_per_step(results):
    """2 steps: one forward a step on each rank (the served unconditional call is not a forward); tiny-a14b's two
    steps go one to each expert."""
    for res in results:
        assert res["tiny full"]["forwards"] == {"transformer": 2}, res
        assert res["tiny-a14b full"]["forwards"] == {"transformer": 1, "transformer_2": 1}, res


def test_profile_splits_every_configuration_overhead_rows_included(results):
    """`vsagen profile --cfg-parallel`: rank 0 alone gets the report; `full`, `diffusers-sdpa` (diffusers' own
    processors) and `full+tile-order` each ran one branch per rank, with both ranks' times and the exchange."""
    assert results[1]["profile"] is None, results[1]
    data = results[0]["profile"]
    assert data is not None, results[0]
    rows = data["rows"] + data["overhead"]["rows"]
    assert [r["backend"] for r in rows] == ["full", "diffusers-sdpa", "full+tile-order"]
    for r in rows:
        assert [x["rank"] for x in r["ranks"]] == [0, 1] and r["dit_forwards"] == 1, r  # one branch a step
        assert r["cfg_exchange_s_per_step"] == max(x["cfg_exchange_s_per_step"] for x in r["ranks"]) > 0, r
        assert r["all_to_all_s_per_step"] == 0, r
    assert data["overhead"]["rows"][0]["latents_rel_l2_vs_full"] <= 1e-6  # stock == full, as in one process


def test_refusals_before_loading(vsagen_cache):
    check_cfg_parallel(5.0, offload="none", compile=False)
    for kwargs, match in [(dict(guidance=1.0, offload="none", compile=False), "--guidance 1 turns classifier-free"),
                          (dict(guidance=5.0, offload="group", compile=False), "--offload group"),
                          (dict(guidance=5.0, offload="none", compile=True), "--compile")]:
        with pytest.raises(BadInput, match=match):
            check_cfg_parallel(**kwargs)
    assert resolve("a fox", model="tiny", device="cpu", cfg_parallel=True).processes == 2
    assert resolve("a fox", model="tiny", device="cpu", cfg_parallel=True, ulysses=2).processes == 4
    with pytest.raises(BadInput, match="--guidance 0.5 turns"):
        resolve("a fox", model="tiny", device="cpu", cfg_parallel=True, guidance=0.5)


def test_a_call_outside_the_pairs_is_refused():
    """The wrappers need diffusers' cond / uncond contexts, keyword calls and return_dict=False."""

    class Model:
        def cache_context(self, name):
            import contextlib

            return contextlib.nullcontext()

        def forward(self, **kwargs):
            return (kwargs["hidden_states"],)

    m = Model()
    split = CfgSplit(0, None, Timer("cpu")).install([m])
    with pytest.raises(RuntimeError, match="keyword arguments and return_dict=False"):
        m.forward(hidden_states=1)
    with pytest.raises(RuntimeError, match="context None"):
        m.forward(hidden_states=1, return_dict=False)
    with m.cache_context("uncond"), pytest.raises(RuntimeError, match="context 'uncond'"):
        m.forward(hidden_states=1, return_dict=False)
    split.remove()
    assert "forward" not in vars(m) and m.forward(hidden_states=1) == (1,)


def test_every_registered_backend_is_covered():
    from vsagen.attention import backend_names

    assert {a.split(":")[0] for a in CFG_TINY_BACKENDS} == set(backend_names())
