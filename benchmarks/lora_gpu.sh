#!/usr/bin/env bash
# Issue 48 item 1 on the lent GPU in one device call (H100 / H200; logs and JSONs under $OUT): what a LoRA costs.
#  1. benchmarks/lora_file.py writes a random rank-64 LoRA in the original Wan keys (lora_down / lora_up with
#     alphas, every block's attention and FFN linears) for the model's architecture;
#  2. vsagen compare at 480x832x81, random weights, vsa, 2 steps after 1 warm-up: rows at LoRA scale 0 and 1,
#     fused (the default: merged into the weights, nothing per step) and unfused (PEFT layers: the low-rank
#     products every forward), same call; then t2v's load time without and with the fused LoRA.
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh, peft
# included):   bash benchmarks/lora_gpu.sh      (MODEL=wan2.1-t2v-14b for the 14B; SIZE="--height 96 ..." smaller)
set -u
source benchmarks/gpu_env.sh || exit 1
MODEL=${MODEL:-wan2.1-t2v-1.3b}
SIZE=${SIZE:---height 480 --width 832 --frames 81}
LORA=/tmp/lora.safetensors  # (not under $OUT: ~170 MB for the 1.3B)
python3 benchmarks/lora_file.py "$MODEL" "$LORA" --rank 64 || exit 1
for mode in fused unfused; do
    extra=$([ "$mode" = unfused ] && echo ":fused=false")
    timeout 280 vsagen compare "a red fox" --model "$MODEL" --random-weights --attn vsa --steps 2 --warmup 1 $SIZE \
        --lora "$LORA:scale=0,1$extra" --no-plot --out "$OUT/compare-$mode" --overwrite --json \
        > "$OUT/compare-$mode.json" 2> "$OUT/compare-$mode.log" || tail -5 "$OUT/compare-$mode.log"
done
for lora in "" "--lora $LORA"; do
    name=$([ -z "$lora" ] && echo plain || echo lora)
    timeout 200 vsagen t2v "a red fox" --model "$MODEL" --random-weights --attn vsa --steps 1 $SIZE $lora \
        --out "$OUT/t2v-$name.mp4" --overwrite > "$OUT/t2v-$name.log" 2>&1 || tail -5 "$OUT/t2v-$name.log"
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'LoRA':18} {'DiT s/step':>10} {'x scale 0 fused':>15} {'PSNR dB':>8}")
base = None
for mode in ("fused", "unfused"):
    path = os.path.join(out, f"compare-{mode}.json")
    if not os.path.exists(path) or not os.path.getsize(path):
        print(f"{mode:18} (no result: see compare-{mode}.log)")
        continue
    for row in json.load(open(path))["rows"]:
        base = base or row["dit_s_per_step"]
        psnr = row["psnr_db"] if row["psnr_db"] == "inf" else format(row["psnr_db"], ".2f")
        print(f"{mode + ' scale ' + format(row['lora_scale'], 'g'):18} {row['dit_s_per_step']:10.3f} "
              f"{row['dit_s_per_step'] / base:15.3f} {psnr:>8}")
for name in ("plain", "lora"):
    path = os.path.join(out, f"t2v-{name}.json")
    if os.path.exists(path):
        data = json.load(open(path))
        print(f"t2v load ({name}): {data['timing']['load_s']:.2f} s  {data['lora']}")
PY
