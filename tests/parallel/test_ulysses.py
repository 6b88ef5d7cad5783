"""vsagen.parallel.ulysses with gloo and 2 processes: the all-to-all exchanges against slicing, and every registered
backend (torch implementations) under Ulysses 2 equal to the same backend on the whole sequence, forward and
backward, on a grid with partial tiles (fp32, max abs difference <= 1e-5). The processes have a timeout."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch.multiprocessing as mp

import vsagen.parallel.ulysses  # noqa: F401  (the module under test; the workers import it)
from vsagen.attention import backend_names

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(worker_name: str, out: Path, prefix: str) -> list[dict]:
    """Run tests/parallel/ulysses_worker.<worker_name> on 2 spawned gloo processes (a hang fails after 240 s) and
    return each rank's results (out/<prefix><rank>.json)."""
    import os
    import sys
    import time

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent)] + ([old] if old else []))
    try:
        sys.path.insert(0, str(HERE))
        import ulysses_worker

        ctx = mp.start_processes(getattr(ulysses_worker, worker_name), args=(2, _free_port(), str(out)), nprocs=2,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + 240
        while not ctx.join(timeout=5):  # False until every process has exited (it returns at each exit)
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.terminate()
                pytest.fail("the gloo workers did not finish within 240 s")
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return [json.loads((out / f"{prefix}{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return _spawn("worker", tmp_path_factory.mktemp("ulysses"), "rank")


def test_exchanges_are_slicing(results):
    for res in results:
        assert res["seq_to_heads"] == 0.0 and res["round_trip"] == 0.0


@pytest.mark.parametrize("name", backend_names())
def test_every_backend_under_ulysses_2_equals_one_process(results, name):
    for res in results:
        assert res[f"{name} fwd"] <= 1e-5, res
        assert res[f"{name} bwd"] <= 1e-5, res


def test_attending_the_own_shard_only_would_be_caught(results):
    """What a processor without the all-to-all does (each rank over its own tokens): far from the whole sequence's
    attention, so the comparisons above can fail."""
    for res in results:
        assert res["shard only"] > 1e-2, res


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory):
    return _spawn("cp_worker", tmp_path_factory.mktemp("cp"), "cp")


@pytest.mark.parametrize("name", backend_names())
def test_diffusers_ulysses_2_with_every_backend_equals_one_process(cp_results, name):
    """The whole transformer: vsagen.apply, then enable_parallelism(ulysses_degree=2) with vsagen's plan."""
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
