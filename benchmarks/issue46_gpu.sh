#!/usr/bin/env bash
# Issue 46's targets not yet measured, in two device calls back to back (H100 / H200; each under the 600 s limit;
# logs and JSONs under $OUT; a short table printed last):
#   PART=a  1. the 8-bit fine stage with V^T in 64-token tile slots (d0cbcd5): benchmarks/sage_fine.py, 1.3B and 14B;
#           2. the final latents' distance, FP8 vs bf16 beside bf16 vs fp32: benchmarks/fp8_latents.py (1.3B, 4 steps);
#           3. fastwan2.1-t2v-1.3b's DiT per video with --compile, --quant none and fp8 (target <= 0.5 s).
#   PART=b  4. the 14B DiT step with vsa, --quant none and fp8 (target fp8 >= 1.4x), 720p, 1 step after 1 warm-up;
#           5. turbowan2.1-t2v-1.3b-quant's DiT per video, its int8 file run as int8 W8A8 (--quant int8) against the
#              same file dequantized to bf16 (--quant none) (target: int8 below bf16).
#   PART=c  6. the 1.3B vsa step, eager, --quant none and fp8, after q / k / v share one quantization and FP8 keeps
#              the text k / v in bf16 (2c716e4); then fastwan2.1-t2v-1.3b's DiT per video, eager, none and fp8.
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh):
#     PART=a bash benchmarks/issue46_gpu.sh ; then PART=b, then PART=c
set -u
source benchmarks/gpu_env.sh || exit 1
runs=/tmp/issue46-runs; mkdir -p "$runs"

# t2v NAME QUANT [flags...]: one `vsagen t2v` run at the preset's size, random weights, one warm-up step
t2v() {
    local name=$1 quant=$2; shift 2
    timeout 170 vsagen t2v "a red fox running through fresh snow" --random-weights --warmup 1 --vae tiny \
        --quant "$quant" --out "$runs/$name.mp4" --overwrite "$@" > "$OUT/$name.log" 2>&1 || tail -4 "$OUT/$name.log"
    [ -f "$runs/$name.json" ] && cp "$runs/$name.json" "$OUT/"
}

# profile NAME QUANT MODEL: `vsagen profile` of the vsa DiT step, one timed step after one warm-up
profile() {
    timeout 200 vsagen profile --model "$3" --random-weights --attn vsa --steps 1 --warmup 1 --quant "$2" --no-stock \
        --format json --out "$OUT/$1.json" --overwrite > "$OUT/$1.log" 2>&1 || tail -4 "$OUT/$1.log"
}

if [ "${PART:-a}" = a ]; then
    timeout 200 python3 benchmarks/sage_fine.py --shapes 1.3b,14b 2>&1 | grep -v Warning | tee "$OUT/sage_fine.txt"
    timeout 150 python3 benchmarks/fp8_latents.py 2>&1 | grep -v Warning | tee "$OUT/fp8_latents.txt"
    for q in none fp8; do t2v "fastwan-compile-$q" "$q" --model fastwan2.1-t2v-1.3b --compile; done
elif [ "$PART" = c ]; then
    for q in none fp8; do profile "profile-1.3b-$q" "$q" wan2.1-t2v-1.3b; done
    for q in none fp8; do t2v "fastwan-eager-$q" "$q" --model fastwan2.1-t2v-1.3b; done
else
    for q in none fp8; do profile "profile-14b-$q" "$q" wan2.1-t2v-14b; done
    for q in none int8; do t2v "turbo-quant-$q" "$q" --model turbowan2.1-t2v-1.3b-quant; done
fi

python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
for path in sorted(glob.glob(os.path.join(out, "profile-*.json"))):
    row = json.load(open(path))["rows"][0]
    print(f"{os.path.basename(path)[:-5]:22} DiT {row['dit_s_per_step']:.3f} s/step, attention "
          f"{row['attention_s_per_step'] or float('nan'):.3f} s/step")
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    data = json.load(open(path))
    if "timing" not in data:
        continue
    t = data["timing"]
    print(f"{os.path.basename(path)[:-5]:22} quant {data['quant']}: DiT {t['dit_s']:.3f} s/video, warm-up "
          f"{t['warmup_s']:.1f} s, wait {t['wait_s']:.3f} s")
PY
