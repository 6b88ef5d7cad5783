"""`full`: dense attention through torch's scaled_dot_product_attention.

On CUDA the call is restricted to the cuDNN and flash kernels (cuDNN first), so it never falls back to the
slow math path silently; those kernels need bf16 or fp16. On CPU torch picks its own kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import BadInput
from .base import AttnContext, Backend
from .shared import NoOptions

if TYPE_CHECKING:
    import torch


class FullAttention(Backend):
    """Dense self-attention, the baseline every sparse backend is measured against (no options)."""

    name = "full"
    Options = NoOptions
    tiled = False
    traceable = True  # SDPA (and the sdpa_kernel context on CUDA) traces without a graph break

    def check(self, device: torch.device, dtype: torch.dtype) -> None:
        """Raises BadInput for fp32 on CUDA (cuDNN and flash need bf16 / fp16)."""
        import torch

        if device.type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
            raise BadInput("--attn full on CUDA runs cuDNN/flash attention, which need --dtype bf16 or fp16")

    def describe(self, device: torch.device | None = None) -> dict:
        """{"name": "full"}; given the run's device, also {"impl_ran": "sdpa"} (torch's scaled_dot_product_attention:
        cuDNN or flash on CUDA, torch's own choice elsewhere), as the other backends name what ran."""
        return {"name": self.name} if device is None else {"name": self.name, "impl_ran": "sdpa"}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """q, k, v: (B, S, H, D) -> (B, S, H, D) like q (the context is unused)."""
        import torch.nn.functional as F

        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        if q.is_cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
                out = F.scaled_dot_product_attention(qt, kt, vt)
        else:
            out = F.scaled_dot_product_attention(qt, kt, vt)
        return out.transpose(1, 2)
