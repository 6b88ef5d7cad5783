"""A stand-in for FlashAttention-4 on a CPU (shared by the FA4 adapter's tests and `vsa`'s impl auto tests).

`emulate_fa4` is FA4's block-sparse semantics in float64 on the padded sequence; `FakeFA4().install(monkeypatch)`
puts `flash_attn.cute.interface.flash_attn_func` and `flash_attn.cute.block_sparsity.BlockSparseTensorsTorch` in
`sys.modules` (running `emulate_fa4`, checking the index strides as FA4 does), makes `fa4_unavailable` say None
and the device capability 9.0, and records each call.
"""

from __future__ import annotations

import sys

import torch

from conftest import tile_map
from vsagen.kernels import fa4_block_sparse as fa4


def decode(cnt: torch.Tensor, idx: torch.Tensor, n_cols: int) -> torch.Tensor:
    """FA4's lists (first cnt entries of each row) back to a dense map, asserting they ascend without repeats."""
    b, h, rows = cnt.shape
    for bi in range(b):
        for hi in range(h):
            for r in range(rows):
                used = idx[bi, hi, r, :int(cnt[bi, hi, r])].tolist()
                assert used == sorted(set(used)), used
    return tile_map(idx, cnt, n_cols)


def emulate_fa4(qp, kp, vp, index, key_valid, scale=None):
    """float64 FA4 block-sparse semantics on the padded sequence: query block m attends every slot of its full
    blocks and the slots with key_valid of its mask blocks; a row with no key gives 0."""
    qb, kb = index.block_size
    m_cnt, m_idx, f_cnt, f_idx = index.fwd
    n_k = kp.shape[1] // kb
    full, mask = decode(f_cnt, f_idx, n_k), decode(m_cnt, m_idx, n_k)
    full = full.repeat_interleave(qb, 2).repeat_interleave(kb, 3)
    mask = mask.repeat_interleave(qb, 2).repeat_interleave(kb, 3)
    allowed = full | (mask & key_valid.bool().view(1, 1, 1, -1))  # (B, H, P, P)
    scale = qp.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.einsum("bshd,bthd->bhst", qp.double(), kp.double()) * scale
    empty = ~allowed.any(-1, keepdim=True)
    p = torch.softmax(logits.masked_fill(~(allowed | empty), float("-inf")), -1).masked_fill(empty, 0.0)
    return torch.einsum("bhst,bthd->bshd", p, vp.double())


class FakeFA4:
    """Stands in for `flash_attn.cute` on a CPU: `flash_attn_func` runs `emulate_fa4` on the lists it is handed and
    records what it was called with (whether a mask_mod came, the sequence length)."""

    def __init__(self):
        self.calls = []

    def install(self, monkeypatch):
        import types
        from dataclasses import dataclass

        @dataclass
        class BlockSparseTensorsTorch:
            mask_block_cnt: torch.Tensor
            mask_block_idx: torch.Tensor
            full_block_cnt: torch.Tensor
            full_block_idx: torch.Tensor
            block_size: tuple

        def flash_attn_func(q, k, v, softmax_scale=None, mask_mod=None, aux_tensors=None,
                            block_sparse_tensors=None, block_sparse_tensors_bwd=None):
            t = block_sparse_tensors
            for lists in (t, block_sparse_tensors_bwd):  # FA4's own check, literal even for a width of 1
                for idx in (lists and (lists.mask_block_idx, lists.full_block_idx)) or ():
                    assert idx.stride(-1) == 1, f"Expected strides[leading_dim] == 1, but got {idx.stride(-1)}"
            index = fa4.Fa4SparseIndex(fwd=(t.mask_block_cnt, t.mask_block_idx, t.full_block_cnt, t.full_block_idx),
                                       bwd=None, block_size=t.block_size)
            if mask_mod is None:  # FA4 then never masks: a mask block would attend its padding
                assert int(t.mask_block_cnt.sum()) == 0
                key_valid = torch.ones(k.shape[1], dtype=torch.int32)
            else:
                key_valid = aux_tensors[0]
            self.calls.append({"mask_mod": mask_mod is not None, "tokens": q.shape[1],
                               "bwd": block_sparse_tensors_bwd is not None})
            return emulate_fa4(q, k, v, index, key_valid, softmax_scale).to(q.dtype), None

        pkg = types.ModuleType("flash_attn")
        cute = types.ModuleType("flash_attn.cute")
        interface = types.ModuleType("flash_attn.cute.interface")
        interface.flash_attn_func = flash_attn_func
        block_sparsity = types.ModuleType("flash_attn.cute.block_sparsity")
        block_sparsity.BlockSparseTensorsTorch = BlockSparseTensorsTorch
        for name, mod in (("flash_attn", pkg), ("flash_attn.cute", cute), ("flash_attn.cute.interface", interface),
                          ("flash_attn.cute.block_sparsity", block_sparsity)):
            monkeypatch.setitem(sys.modules, name, mod)
        monkeypatch.setattr(fa4, "fa4_unavailable", lambda device, volume: None)
        monkeypatch.setattr(fa4, "fa4_version", lambda: fa4.FA4_REQUIREMENT.partition("==")[2])
        monkeypatch.setattr(fa4, "key_valid_mask_mod", lambda: "key_slot_valid")
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        return self
