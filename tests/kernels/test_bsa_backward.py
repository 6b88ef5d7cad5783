"""Tests for kernels/bsa_backward.py: `bsa_bwd` called directly (k2q from `reference.build_k2q`) against the eager
reference's autograd gradients, and the second backward stream (GPU only), under the Triton interpreter on CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import vsagen.kernels.bsa_backward as bwd
from conftest import FP32_REL_L2, NAMES, kernel_fwd_bwd, make_qkv, random_selection, reference_fwd_bwd, rel_l2
from vsagen.kernels.bsa_forward import bsa_fwd
from vsagen.kernels.reference import build_k2q
from vsagen.kernels.tuning import interpreting, kernel_tuning
from vsagen.layout import tile_layout


@pytest.mark.parametrize("pack", [True, False])
def test_launcher_matches_reference_gradients(pack):
    """fp32, partial tiles, dlse given: dq, dk, dv equal the float64 reference's within fp32 rounding, with and
    without tile plans in the dQ loop."""
    lay = tile_layout((3, 5, 7))
    n = lay.num_tiles
    q, k, v = make_qkv(1, lay.num_tokens, 2, 16, seed=111)
    q2k, cnt = random_selection(1, 2, n, 3, seed=112)
    g = torch.Generator().manual_seed(113)
    do, dlse = torch.randn(q.shape, generator=g), torch.randn(1, 2, lay.num_tokens, generator=g)
    off = lay.tile_offsets.to(torch.int32)
    tuning = dataclasses.replace(kernel_tuning(q.device, 16), pack_partial_tiles=pack)
    out, lse = bsa_fwd(q, k, v, q2k, cnt, off, tuning=tuning)
    k2q, k2q_cnt = build_k2q(q2k, cnt, n)
    got = bwd.bsa_bwd(do, q, k, v, out, lse, q2k, cnt, k2q, k2q_cnt, off, dlse=dlse, tuning=tuning)
    want = reference_fwd_bwd(q, k, v, q2k, lay, do, dlse=dlse)[2:]
    for name, x, y in zip(NAMES[2:], got, want):
        assert rel_l2(x, y) < FP32_REL_L2, (name, rel_l2(x, y))


def test_launcher_rejects_bad_k2q():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=114)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=115)
    off = lay.tile_offsets.to(torch.int32)
    out, lse = bsa_fwd(q, k, v, q2k, cnt, off)
    k2q, k2q_cnt = build_k2q(q2k, cnt, lay.num_tiles)
    with pytest.raises(ValueError, match="k2q"):
        bwd.bsa_bwd(torch.ones_like(q), q, k, v, out, lse, q2k, cnt, k2q.long(), k2q_cnt, off)


@pytest.mark.skipif(not torch.cuda.is_available() or interpreting(),
                    reason="the second backward stream exists on CUDA only, without the interpreter")
def test_two_stream_backward_equals_one_stream():
    """dQ on its own stream beside dK/dV (KernelTuning.bwd_two_streams) gives the one-stream gradients bitwise
    (GPU only; the interpreter runs one stream)."""
    lay = tile_layout((5, 6, 10), device="cuda")
    q, k, v = (x.cuda() for x in make_qkv(2, lay.num_tokens, 2, 64, dtype=torch.bfloat16, seed=101))
    q2k, cnt = (x.cuda() for x in random_selection(2, 2, lay.num_tiles, 3, seed=102, partial_counts=True))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(103)).to(torch.bfloat16).cuda()
    results = {}
    for two in (False, True):
        tuning = dataclasses.replace(kernel_tuning(q.device, 64), bwd_two_streams=two)
        results[two] = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=tuning)
    for name, x, y in zip(NAMES, results[True], results[False]):
        assert torch.equal(x, y), name
