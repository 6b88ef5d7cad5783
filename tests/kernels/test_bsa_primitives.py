"""Tests for kernels/bsa_primitives.py: the TMA layout checks (`use_tma`), the size-class launch list, and the
choice between q2k lists and tile plans (`q2k_lists`); no kernel of its own (its jit helpers run in every forward
and backward test)."""

from __future__ import annotations

import torch

import vsagen.kernels.bsa_primitives as primitives
from conftest import random_selection
from vsagen.kernels.tuning import kernel_tuning
from vsagen.layout import tile_layout


def test_tma_only_where_the_layout_allows(monkeypatch):
    """TMA needs 16-bit (B*S, H*D)-viewable tensors with D a power of two; anything else takes pointer loads, and
    the default tuning takes TMA only on a GPU of compute capability 9 or 10 (never under the interpreter)."""
    x = torch.randn(2, 70, 3, 32, dtype=torch.bfloat16)
    qkv = torch.randn(2, 70, 3, 3, 32, dtype=torch.bfloat16)

    def use_tma(*xs):
        return primitives.use_tma(*xs, wanted=True)  # what tma_loads=True asked for

    assert use_tma(x) and use_tma(qkv[:, :, 1])  # a slice of a packed qkv: token stride 3*H*D
    assert not use_tma(x.float())  # fp32
    assert not use_tma(torch.randn(2, 70, 3, 40, dtype=torch.bfloat16))  # D not a power of two
    assert not use_tma(x.transpose(0, 1).contiguous().transpose(0, 1))  # batches not S tokens apart
    assert not use_tma(torch.randn(2, 3, 70, 32, dtype=torch.bfloat16).transpose(1, 2))  # heads not packed
    assert not use_tma(x[..., :16])  # D sliced: heads not packed
    flat = torch.randn(x.numel() + 1, dtype=torch.bfloat16)
    assert not use_tma(flat[1:].view(x.shape))  # base 2 bytes off a 16-byte boundary
    monkeypatch.setattr(primitives, "have_tensor_descriptors", lambda: False)  # a Triton older than 3.4
    assert not use_tma(x)
    monkeypatch.undo()
    assert not primitives.use_tma(x, wanted=kernel_tuning(x.device, 32).tma_loads)  # CPU / interpreter
    assert not primitives.use_tma(x, wanted=False)


def test_size_classes_bounds_and_fp32_stages():
    launch = ((16, 4, 2), (32, 4, 2), (64, 8, 3))
    assert primitives.size_classes(launch, 64, torch.bfloat16) == [(16, 0, 4, 2), (32, 16, 4, 2), (64, 32, 8, 3)]
    wide = primitives.size_classes(launch, primitives.FP32_WIDE_BLOCK_D, torch.float32)
    assert [stages for *_, stages in wide] == [primitives.FP32_WIDE_NUM_STAGES] * 3


def test_q2k_lists_packs_only_when_asked_and_useful():
    lay = tile_layout((3, 5, 7))  # partial tiles
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=131)
    off = lay.tile_offsets.to(torch.int32)
    plan, plan_cnt, pack = primitives.q2k_lists(q2k, cnt, off, lay.num_tokens, True)
    assert pack and plan_cnt.shape == (1, 1, lay.num_tiles, 4)
    lists, counts, pack = primitives.q2k_lists(q2k, cnt, off, lay.num_tokens, False)
    assert not pack and lists is q2k and counts is cnt
    full = torch.arange(0, 2 * primitives.BLOCK + 1, primitives.BLOCK, dtype=torch.int32)  # every tile full
    q2k2, cnt2 = random_selection(1, 1, 2, 1, seed=132)
    assert not primitives.q2k_lists(q2k2, cnt2, full, 2 * primitives.BLOCK, True)[2]
