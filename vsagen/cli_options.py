"""The command-line options the `vsagen` commands share: one typed declaration (type, default handling, help text)
each, so `t2v`, `i2v`, `profile`, `compare` and `search` describe an option the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Model = Annotated[str, typer.Option(help="Preset name (see `vsagen presets`), local diffusers directory, or hub id.")]
Attn = Annotated[str, typer.Option(help="Self-attention backend (see `vsagen backends`): auto (the default: the "
                                        "backend the checkpoint was trained for, else full; the run's notes say "
                                        "which and why), full, vsa, rocm-vsa, sla-star, sparse-vdit (a pattern "
                                        "file: sparse-vdit:patterns=FILE); options as NAME:KEY=VALUE[:KEY=VALUE], "
                                        "e.g. vsa:sparsity=0.9:impl=torch.")]
Sparsity = Annotated[Optional[float], typer.Option(help="Fraction of key tiles skipped per query tile "
                                                       "(sparse backends; default from the preset).")]
AttnImpl = Annotated[str, typer.Option(help="Backend implementation: auto (vsa: Triton kernels on CUDA, "
                                            "the torch reference elsewhere), triton or torch.")]
Height = Annotated[Optional[int], typer.Option(help="Pixels (multiple of the model's spatial stride).")]
Width = Annotated[Optional[int], typer.Option(help="Pixels (multiple of the model's spatial stride).")]
Frames = Annotated[Optional[int], typer.Option(help="Frames, of the form 4k+1.")]
Steps = Annotated[Optional[int], typer.Option(help="Denoising steps.")]
Guidance = Annotated[Optional[float], typer.Option(help="CFG scale (> 1 runs two DiT passes a step).")]
Guidance2 = Annotated[Optional[float], typer.Option(help="CFG scale of the second expert (two-expert models such "
                                                         "as wan2.2-t2v-a14b / wan2.2-i2v-a14b; default from the "
                                                         "preset, else --guidance).")]
FlowShift = Annotated[Optional[float], typer.Option(help="Flow-matching timestep shift of the scheduler (> 0; larger "
                                                         "spends more steps at high noise; default from the preset).")]
NegativePrompt = Annotated[Optional[str], typer.Option(help="Negative prompt for CFG (no effect with --guidance "
                                                            "<= 1, which turns CFG off; the run's notes say so).")]
Seed = Annotated[int, typer.Option(help="Random seed.")]
Fps = Annotated[Optional[int], typer.Option(help="Frames per second of the mp4.")]
Out = Annotated[Optional[Path], typer.Option(help="The mp4 file to write (a file name ending in .mp4, not a folder; "
                                                 "default vsagen-<model>-<attn>-seed<seed>.mp4 in the current "
                                                 "folder); the timing JSON goes beside it (same name, .json).")]
Overwrite = Annotated[bool, typer.Option(help="Replace existing output files.")]
Device = Annotated[str, typer.Option(help="auto, cuda or cpu.")]
Dtype = Annotated[str, typer.Option(help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16 or fp32.")]
TileFit = Annotated[str, typer.Option(help="Grids not multiple of 4: 'partial' edge tiles, or 'crop' (denoise a "
                                           "larger latent, crop before decode).")]
RandomWeights = Annotated[bool, typer.Option(help="The preset's real architecture with random weights and random "
                                                  "prompt embeddings (timing without a download).")]
AllowPickle = Annotated[bool, typer.Option(help="Also load pickle (.bin/.pt) weights; they can run code.")]
Warmup = Annotated[int, typer.Option(help="Untimed warm-up denoising steps before the timed run.")]
Offload = Annotated[str, typer.Option(help="Keep weights in CPU memory and move them to the GPU as needed (CUDA "
                                           "only): 'none', 'model' (whole components in turn) or 'group' (one "
                                           "transformer block at a time, prefetched on a CUDA stream).")]
VaeTiling = Annotated[str, typer.Option(help="Decode (and encode) with diffusers' spatially tiled VAE: 'on', 'off', "
                                             "or 'auto' (on for frames of more than 480x832 pixels).")]
Compile = Annotated[bool, typer.Option("--compile", help="torch.compile the transformer blocks (diffusers' "
                                       "compile_repeated_blocks), each block one graph with the attention backend "
                                       "inside it, so the attention is not timed (graph breaks around it only for "
                                       "a backend that cannot be traced, or with --offload group). The first step "
                                       "pays the compilation: use --warmup 1.")]
ProfileCompile = Annotated[bool, typer.Option("--compile", help="torch.compile the transformer blocks (diffusers' "
                                              "compile_repeated_blocks), each block one graph with the attention "
                                              "backend inside it, so the attention columns read '-' (time it with "
                                              "--kernels); every configuration compiles in its warm-up step.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of the table.")]
Verbose = Annotated[bool, typer.Option(help="Show tracebacks.")]
Ulysses = Annotated[int, typer.Option(help="Split the transformer's sequence across N processes (Ulysses sequence "
                                           "parallelism through diffusers' context parallelism; every backend): "
                                           "start with torchrun --nproc_per_node N -m vsagen ... --ulysses N. "
                                           "Rank 0 writes the files.")]
CfgParallel = Annotated[bool, typer.Option("--cfg-parallel", help="Run the conditional and unconditional CFG passes "
                                           "on different processes (needs --guidance > 1): start with torchrun "
                                           "--nproc_per_node 2 -m vsagen ... --cfg-parallel, or 2 x N processes "
                                           "with --ulysses N.")]
