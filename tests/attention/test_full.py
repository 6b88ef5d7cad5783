"""vsagen.attention.full: dense SDPA attention against a float64 softmax, and its device / dtype check."""

from __future__ import annotations

import pytest
import torch

from conftest import FP32_ATOL, FP32_RTOL, attn_ctx as ctx, make_qkv, softmax_attention_fp64
from vsagen.attention.full import FullAttention
from vsagen.errors import BadInput
from vsagen.timing import NullTimer

B, H, D = 2, 3, 16


@pytest.mark.parametrize("s", [1, 37, 210])
def test_full_matches_fp64_softmax(s):
    q, k, v = make_qkv(B, s, H, D, seed=20)
    out = FullAttention()(q, k, v, ctx(None, None, NullTimer()))
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), softmax_attention_fp64(q, k, v), atol=FP32_ATOL, rtol=FP32_RTOL)


def test_full_check_device_dtype():
    full = FullAttention()
    cuda = torch.device("cuda")
    with pytest.raises(BadInput, match="bf16"):
        full.check(cuda, torch.float32)
    full.check(cuda, torch.bfloat16)
    full.check(cuda, torch.float16)
    full.check(torch.device("cpu"), torch.float32)
