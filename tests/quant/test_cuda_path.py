"""The swapped linears' CUDA forward, traced without a GPU on fake CUDA tensors (FakeTensorMode): at the Wan 1.3B's
FFN shape, every operation one forward dispatches. Per call: one activation quantizer (a Triton custom op), one
GEMM, and for FP8 the bias added in place in the output's dtype; no pass over the (tokens, out) output in float32,
no torch.compile (nothing compiled, whatever the token count)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from vsagen.quant.fp8_linear import Fp8Linear
from vsagen.quant.int8_linear import Int8Linear

K, N = 1536, 8960  # ffn.net.0.proj of Wan2.1-1.3B


class OpLog(TorchDispatchMode):
    """Records (op name, output dtype, output element count) of every dispatched op but views and device queries."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if name.split(".")[-1] not in ("view", "t", "device", "_unsafe_view"):
            first = out[0] if isinstance(out, tuple) else out
            self.ops.append((name, getattr(first, "dtype", None), getattr(first, "numel", lambda: 0)()))
        return out


def forward_ops(cls, tokens: int) -> list:
    """The ops of one `cls` forward on a (1, tokens, K) bf16 fake CUDA input, bias in bf16 (the run's dtype)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(shape, dtype):
        return FakeTensor(mode, torch.empty(shape, dtype=dtype, device="meta"), torch.device("cuda", 0))

    with mode:
        if cls is Fp8Linear:
            layer = Fp8Linear(fake((N, K), torch.float8_e4m3fn), fake((N, 1), torch.float32), fake((N,), torch.bfloat16))
        else:
            layer = Int8Linear(fake((N, K), torch.int8), fake((70, 12), torch.float32), fake((N,), torch.bfloat16))
        x = fake((1, tokens, K), torch.bfloat16)
        with OpLog() as log:
            y = layer(x)
    assert y.shape == (1, tokens, N) and y.dtype == torch.bfloat16 and y.device.type == "cuda"
    return log.ops


@pytest.mark.parametrize("cls,want", [
    (Fp8Linear, ["vsagen.quantize_fp8_rows", "aten._scaled_mm"]),  # the bias in _scaled_mm's epilogue
    (Int8Linear, ["vsagen.quantize_int8_blocks", "vsagen.int8_block_gemm"]),  # the bias in the GEMM's epilogue
])
def test_one_quantizer_one_gemm_per_call(cls, want):
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for tokens in (32760, 512, 1000):  # self-attention / FFN rows, the text's 512, another count
        ops = forward_ops(cls, tokens)
        assert [name for name, _, _ in ops] == want
        big = [(name, dtype) for name, dtype, n in ops if n >= tokens * N]
        assert all(dtype == torch.bfloat16 for _, dtype in big)  # no float32 copy of the output
    assert counters["stats"]["unique_graphs"] == graphs  # no torch.compile on the forward path
