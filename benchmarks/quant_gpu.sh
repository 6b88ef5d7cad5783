#!/usr/bin/env bash
# Issue 46's first GPU measurements in one device call (H100 / H200; logs and JSONs under $OUT):
#  1. benchmarks/lowbit_gemm.py: bf16 mm against FP8 _scaled_mm, int8 _int_mm and TurboDiffusion's block-scaled int8
#     GEMM at the Wan 1.3B / 14B linear shapes, activation quantization included, errors against float32;
#  2. the 1.3B DiT step with vsa at 480x832x81, random weights, eager: vsagen profile once per --quant (none, fp8,
#     int8), same call (the run JSONs record which linears ran in which precision).
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh):
#     bash benchmarks/quant_gpu.sh       (SKIP_GEMM=1: the profile rows only)
set -u
source benchmarks/gpu_env.sh || exit 1
[ -n "${SKIP_GEMM:-}" ] || timeout 240 python3 benchmarks/lowbit_gemm.py 2>&1 | grep -v Warning | tee "$OUT/lowbit_gemm.txt"
for q in none fp8 int8; do
    timeout 150 vsagen profile --model wan2.1-t2v-1.3b --random-weights --attn vsa --steps 2 --warmup 1 --quant "$q" \
        --format json --out "$OUT/profile-$q.json" --overwrite > "$OUT/profile-$q.log" 2>&1 || tail -5 "$OUT/profile-$q.log"
done
python3 - "$OUT" <<'PY'
import json, os, sys
print(f"{'quant':6} {'DiT s/step':>10} {'attention s/step':>16} {'DiT x none':>10}")
base = None
for q in ("none", "fp8", "int8"):
    path = os.path.join(sys.argv[1], f"profile-{q}.json")
    if not os.path.exists(path):
        print(f"{q:6} (no result: see profile-{q}.log)")
        continue
    data = json.load(open(path))
    row = data["rows"][0]
    dit, att = row["dit_s_per_step"], row["attention_s_per_step"]
    base = base or dit
    print(f"{q:6} {dit:10.3f} {'' if att is None else format(att, '.3f'):>16} {base / dit:10.2f}  "
          f"({data['settings']['quant']}; {[n for n in data['notes'] if n.startswith('--quant')]})")
PY
