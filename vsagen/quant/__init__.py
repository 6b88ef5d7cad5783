"""Low-bit linears for the DiT (`--quant`): what belongs here is the arithmetic of quantized linear layers and
their placement in a transformer, nothing of a run (no options, no loading):

* `int8_linear`: TurboDiffusion's int8 W8A8 linear (128 x 128 block scales for weights and activations), their
  formulas cited line by line; the GEMM is `vsagen.kernels.int8_block_gemm` on CUDA.
* `fp8_linear`: FP8 e4m3 W8A8 with row-wise scales (`torch._scaled_mm` on sm89+, a float32 emulation elsewhere for
  the tests) and `fp8_unsupported`, which GPUs have FP8.
* `fp8_ffn`: a block FFN with both linears in FP8 runs its GELU inside the second linear's quantizer (eager CUDA).
* `lowbit`: `LowBitLinear`, what both share (quantized buffers keep their dtypes through `.to(dtype)`).
* `swap`: which of a Wan transformer's linears go low-bit (the blocks' attention and FFN projections),
  `quantize_transformer` (the swap), `quantize_pipeline` (every expert, for the run) and `precision_summary`.

Layer: above base and kernels, below attention (docs/internals.md, "Layers"); imports only those and torch.
"""
