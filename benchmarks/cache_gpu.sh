#!/usr/bin/env bash
# Issue 34's GPU acceptance in one device call (H200 / H100; writes the tables under $OUT): the Wan2.1-1.3B
# architecture at 480x832x81 with random weights, 50 steps, CFG 5, eager: full, full + first-block, vsa and
# vsa + first-block (`vsagen profile --cache none,first-block`): DiT seconds per computed and per reused forward,
# the reuse share and the speed-up over dense uncached, same run. Random weights decide the reuse share (it says
# nothing of fidelity): what carries over is the cost of a reused step and the speed-up at a given share.
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh), one call per
# threshold (about 4 minutes each):
#     bash benchmarks/cache_gpu.sh 0.05      (diffusers' default)
#     bash benchmarks/cache_gpu.sh 0.1
set -u
source benchmarks/gpu_env.sh || exit 1
threshold=${1:-0.05}
vsagen profile --model wan2.1-t2v-1.3b --random-weights --attn full,vsa --cache "none,first-block:threshold=$threshold" \
    --steps 50 --warmup 1 --no-stock --format markdown 2>&1 | tee "$OUT/cache-$threshold.md"
