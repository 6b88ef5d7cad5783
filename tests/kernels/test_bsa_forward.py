"""Tests for kernels/bsa_forward.py: `bsa_fwd` called directly with explicit tunings (packed tile plans or one
tile per iteration, one launch or size classes) against the eager reference, under the Triton interpreter on CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import vsagen.kernels.bsa_forward as fwd
from conftest import FP32_REL_L2, make_qkv, random_selection, reference_fwd_bwd, rel_l2
from vsagen.kernels.tuning import kernel_tuning
from vsagen.layout import tile_layout


@pytest.mark.parametrize("pack,launch", [(True, ((64, 4, 3),)), (False, ((16, 4, 2), (32, 4, 2), (64, 4, 3)))])
def test_launcher_matches_reference(pack, launch):
    lay = tile_layout((5, 6, 10))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=121)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 3, seed=122)
    tuning = dataclasses.replace(kernel_tuning(q.device, 16), pack_partial_tiles=pack, fwd_launch=launch)
    out, lse = fwd.bsa_fwd(q, k, v, q2k, cnt, lay.tile_offsets.to(torch.int32), 0.3, tuning=tuning)
    want_out, want_lse = reference_fwd_bwd(q, k, v, q2k, lay, torch.zeros_like(q), scale=0.3)[:2]
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (1, 1, lay.num_tokens)
    assert rel_l2(out, want_out) < FP32_REL_L2 and rel_l2(lse, want_lse) < FP32_REL_L2


def test_default_tuning_equals_explicit_default():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=123)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=124)
    off = lay.tile_offsets.to(torch.int32)
    a = fwd.bsa_fwd(q, k, v, q2k, cnt, off)
    b = fwd.bsa_fwd(q, k, v, q2k, cnt, off, tuning=kernel_tuning("cpu", 16))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
