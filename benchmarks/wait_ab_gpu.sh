#!/usr/bin/env bash
# The wait of two trees on one GPU in one run (issue 45's 1.3B misses): `vsagen t2v --model fastwan2.1-t2v-1.3b
# --random-weights --warmup 1` with the tiny decoder in the order old, new, new, old, then with the stock decoder new,
# old; each run's JSON under $OUT and one table (DiT, decode, mp4 write, wait). Then the tiny decode alone
# (benchmarks/tiny_decode.py --only taew2_1 --bf16) and the stock Wan2.1 VAE decode with cuDNN autotuning on top of
# channels-last (benchmarks/vae_dtype.py). Prepare .old here first (the older tree, e.g. the commit before a change):
#     rm -rf .old && mkdir -p .old && git archive COMMIT | tar -x -C .old
# then through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh) and .old:
#     bash benchmarks/wait_ab_gpu.sh
set -u
source benchmarks/gpu_env.sh || exit 1
runs=/tmp/wait-ab; rm -rf "$runs"; mkdir -p "$runs"
run() { # label, tree, then vsagen t2v arguments
  local label=$1 tree=$2; shift 2
  (cd /tmp && PYTHONPATH="$tree:/tmp/site" timeout 150 python3 -m vsagen t2v --model fastwan2.1-t2v-1.3b \
      --random-weights --warmup 1 "$@" --out "$runs/$label.mp4" "a fox" > "$OUT/$label.log" 2>&1) \
      || tail -3 "$OUT/$label.log"
}
run tiny-old1 "$PWD/.old" --vae tiny; run tiny-new1 "$PWD" --vae tiny; run tiny-new2 "$PWD" --vae tiny
run tiny-old2 "$PWD/.old" --vae tiny; run stock-new "$PWD" --vae stock; run stock-old "$PWD/.old" --vae stock
cp "$runs"/*.json "$OUT/" 2>/dev/null
python3 - "$runs" <<'PY'
import glob, json, os, sys
print(f"{'run':12} {'DiT s':>6} {'decode s':>8} {'write s':>7} {'decode+write wall s':>19} {'wait s':>7}")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    t = json.load(open(f))["timing"]
    print(f"{os.path.basename(f)[:-5]:12} {t['dit_s']:6.3f} {t['vae_decode_s']:8.3f} {t['write_s']:7.3f} "
          f"{t.get('decode_write_s', float('nan')):19.3f} {t['wait_s']:7.3f}")
PY
timeout 90 python3 benchmarks/tiny_decode.py --only taew2_1 --bf16 --repeats 3 2>&1 | grep -v Warn
timeout 150 python3 benchmarks/vae_dtype.py --model wan2.1-t2v-1.3b --variants fp32,bf16+cl,bf16+cl+cudnn 2>&1 \
    | grep -v Casting | tail -6
