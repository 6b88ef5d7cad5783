#!/usr/bin/env bash
# Issue 48 item 2 on the lent GPU in one device call (H100 / H200; the compare's JSON and log under $OUT): what the
# quality knobs of the sparse backends cost, `vsagen compare` on the Wan2.1-1.3B architecture at 480x832x81 with
# random weights, CFG 5, 4 steps after 1 warm-up: full (the reference), vsa, vsa with the first step dense
# (dense_steps=0.2: ceil(0.2 x 4) = 1), vsa with blocks 0 and 1 dense, and both knobs at once; DiT s/step, the
# speed-up against full and the latents' distance to full, same run. (Random weights: the distances say how far each
# run moves the network, not video quality.)
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh):
#     bash benchmarks/dense_knobs_gpu.sh        (MODEL=wan2.1-t2v-14b for the 14B; STEPS=... to change the steps)
set -u
source benchmarks/gpu_env.sh || exit 1
MODEL=${MODEL:-wan2.1-t2v-1.3b}
timeout 500 vsagen compare "a red fox running through fresh snow" --model "$MODEL" --random-weights \
    --attn full,vsa,vsa:dense_steps=0.2,vsa:dense_layers=0-1,vsa:dense_steps=0.2:dense_layers=0-1 \
    --steps "${STEPS:-4}" --warmup 1 --vae tiny --no-plot --out /tmp/dense-knobs --overwrite --json \
    > "$OUT/dense_knobs.json" 2> "$OUT/dense_knobs.log" || tail -5 "$OUT/dense_knobs.log"
python3 - "$OUT/dense_knobs.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
print(f"{'attn':42} {'DiT s/step':>10} {'x full':>7} {'latents rel L2':>14} {'PSNR dB':>8}")
for r in data["rows"]:
    print(f"{r['spec']:42} {r['dit_s_per_step']:10.3f} {r['speedup_vs_reference']:7.2f} "
          f"{r['latents_rel_l2']:14.3e} {r['psnr_db']!s:>8}")
PY
