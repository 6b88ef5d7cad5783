"""`vsagen.request.processes`: `--gpus N` split into Ulysses x CFG parallel, and the refusals, before loading."""

from __future__ import annotations

import pytest

from vsagen.errors import BadInput
from vsagen.request.processes import split_processes


def test_split_processes_keeps_what_was_given_and_prefers_cfg_parallel():
    """--gpus N: CFG parallel on two halves first when CFG is on (one exchange a step), else Ulysses N; a given
    --ulysses / --cfg-parallel must make N processes (2U with --ulysses U implies CFG parallel when CFG is on)."""
    deg = [1, 2, 4]  # e.g. 4 heads
    cfg, nocfg = dict(guidance=5.0, degrees=deg), dict(guidance=1.0, degrees=deg)
    assert split_processes(1, None, False, **cfg) == (1, False, None)
    u, c, note = split_processes(2, None, False, **cfg)
    assert (u, c) == (1, True) and note == ("--gpus 2: the conditional and unconditional CFG passes run on two "
                                            "halves of the processes (as --cfg-parallel)")
    u, c, note = split_processes(8, None, False, **cfg)
    assert (u, c) == (4, True) and "each splitting the sequence 4 ways (as --cfg-parallel --ulysses 4)" in note
    assert split_processes(4, None, False, **nocfg)[:2] == (4, False)  # no CFG: Ulysses over all
    assert split_processes(2, None, False, guidance=5.0, degrees=[1, 2])[:2] == (1, True)
    assert split_processes(3, None, False, guidance=5.0, degrees=None)[:2] == (3, False)  # unknown model: tried
    assert split_processes(2, 2, False, **cfg) == (2, False, None)  # given: kept, no note
    assert split_processes(4, 2, True, **cfg) == (2, True, None)
    assert split_processes(6, None, True, guidance=5.0, degrees=None) == (3, True, None)
    u, c, note = split_processes(4, 2, False, **cfg)
    assert (u, c) == (2, True) and "(as --cfg-parallel)" in note
    for args, kw, needle in [
        ((2, 3, False), cfg, "--ulysses 3 runs in 3 processes, --gpus 2 starts 2: for --gpus 2 give --ulysses 2 or "
                             "--cfg-parallel, or leave --ulysses out"),
        ((4, 2, False), nocfg, "--ulysses 2 runs in 2 processes, --gpus 4 starts 4: for --gpus 4 give --ulysses 4,"),
        ((3, 2, True), dict(guidance=5.0, degrees=[1, 2]), "--ulysses 2 --cfg-parallel runs in 4 processes, --gpus 3 "
                                                           "starts 3: give --gpus 4"),
        ((3, None, True), cfg, "--gpus 3 is odd"),
        ((3, None, False), cfg, "--gpus 3 cannot split this run: Ulysses splits it across 2, 4 processes (the degrees "
                                "that divide the model's heads and this size's tokens), twice as many with CFG parallel; "
                                "give --gpus 2, 4, 8"),
        ((2, None, False), dict(guidance=1.0, degrees=[1]), "across no more than 1 process (the degrees"),
    ]:
        with pytest.raises(BadInput) as info:
            split_processes(*args, **kw)
        assert needle in str(info.value), str(info.value)
