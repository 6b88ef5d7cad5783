#!/usr/bin/env bash
# Issue 31's GPU acceptance in one device call (H200; writes logs and JSONs under $OUT):
#  1. benchmarks/sla_equivalence.py at the Wan2.1-1.3B shape: SLA's own module (FastVideo 0.2.1's sdist, carried as
#     data in .peers/) beside vsagen's sla (query_rows 64 and 128): block maps, forward / gradient relative L2, and
#     forward and forward+backward times against dense cuDNN, same run;
#  2. the TurboWan2.1-1.3B preset end to end at 480x832x81 with random weights and a random proj_l (4 rCM steps,
#     decode, write; query_rows 64 and 128) against the dense 50-step CFG-5 run of Wan2.1-1.3B, same call.
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh) and .peers
# (`pip download --no-deps --no-binary :all: fastvideo==0.2.1 -d .peers`):
#     bash benchmarks/turbo_gpu.sh
set -u
source benchmarks/gpu_env.sh || exit 1
python3 benchmarks/sla_equivalence.py --sdist .peers/fastvideo-0.2.1.tar.gz --shape 1.3b 2>&1 | grep -v Warning \
    | tee "$OUT/sla_equivalence.txt"
python3 benchmarks/random_proj.py /tmp/proj.safetensors --layers 30 \
    --key "blocks.{i}.self_attn.attn_op.local_attn.proj_l" > /dev/null || exit 1
runs=/tmp/turbo-runs; rm -rf "$runs"; mkdir -p "$runs"
for rows in 64 128; do
    vsagen t2v --model turbowan2.1-t2v-1.3b --random-weights --warmup 1 --out "$runs/turbo-rows$rows.mp4" \
        --attn "sla:proj_weights=/tmp/proj.safetensors:query_rows=$rows" "a fox" > "$OUT/turbo-rows$rows.log" 2>&1 \
        || tail -5 "$OUT/turbo-rows$rows.log"
done
vsagen t2v --model wan2.1-t2v-1.3b --random-weights --attn full --steps 50 --guidance 5 --warmup 1 \
    --out "$runs/dense-50-cfg.mp4" "a fox" > "$OUT/dense.log" 2>&1 || tail -5 "$OUT/dense.log"
cp "$runs"/*.json "$OUT/"
python3 - "$runs" <<'PY'
import glob, json, os, sys
rows = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))}
print(f"{'run':18} {'steps':>5} {'DiT s':>8} {'attn s':>7} {'decode s':>8} {'write s':>7} {'total s':>8} "
      f"{'DiT x':>6} {'total x':>7}")
dense = rows.get("dense-50-cfg", {}).get("timing")
for name, d in rows.items():
    t = d["timing"]
    ratio = (f"{dense['dit_s'] / t['dit_s']:6.1f} {dense['total_s'] / t['total_s']:7.1f}" if dense else "")
    print(f"{name:18} {d['steps']:>5} {t['dit_s']:8.2f} {t['self_attention_s']:7.2f} {t['vae_decode_s']:8.2f} "
          f"{t['write_s']:7.2f} {t['total_s']:8.2f} {ratio}")
PY
