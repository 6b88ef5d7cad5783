"""vsagen.request.bounds: the option groups (`--steps`, `--guidance`, `--flow-shift`) and a `default` sampler entry
(`default:steps=...`) take and refuse the same values."""

from __future__ import annotations

import pytest

from vsagen.errors import BadInput
from vsagen.request.bounds import MAX_FLOW_SHIFT, MAX_GUIDANCE, MAX_STEPS
from vsagen.request.options import SamplingOptions
from vsagen.request.sampling import parse_sampler


@pytest.mark.parametrize("flag,key,ok,bad", [
    ("steps", "steps", (1, MAX_STEPS), (0, MAX_STEPS + 1)),
    ("guidance", "guidance", (0.0, MAX_GUIDANCE), (-0.5, MAX_GUIDANCE + 1)),
    ("flow_shift", "shift", (0.5, MAX_FLOW_SHIFT), (0.0, MAX_FLOW_SHIFT * 2))])
def test_a_flag_and_a_sampler_entry_share_their_bounds(flag, key, ok, bad):
    for value in ok:
        SamplingOptions(**{flag: value})
        assert getattr(parse_sampler(f"default:{key}={value}"), key) == value
    for value in bad:
        with pytest.raises(BadInput):
            SamplingOptions(**{flag: value})
        with pytest.raises(BadInput, match=f"{key} must be in"):
            parse_sampler(f"default:{key}={value}")
