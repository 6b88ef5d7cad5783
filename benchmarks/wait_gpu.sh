#!/usr/bin/env bash
# Issue 45's targets in one device call: the wait (text encode -> mp4 written, the run's own `wait_s`) of the
# few-step presets with each decoder, random weights at real size, --warmup 1; then the stock decode's memory peak
# against the `--vae-tiling auto` estimate (benchmarks/vae_decode_peak.py gpu). Logs and run JSONs under $OUT.
# From the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh):
#     bash benchmarks/wait_gpu.sh [runs|peak|all]     (default all: about 6 minutes on an H100)
set -u
source benchmarks/gpu_env.sh || exit 1
what=${1:-all}
runs=/tmp/wait-runs; rm -rf "$runs"; mkdir -p "$runs"
run() {  # name, then vsagen t2v arguments
    local name=$1; shift
    local t0=$SECONDS
    vsagen t2v "$@" --random-weights --warmup 1 --out "$runs/$name.mp4" "a fox" > "$OUT/$name.log" 2>&1 \
        || tail -5 "$OUT/$name.log"
    echo "$name: $((SECONDS - t0)) s of process"
}
if [ "$what" = runs ] || [ "$what" = all ]; then
    run fastwan1.3b-tiny --model fastwan2.1-t2v-1.3b --vae tiny
    run fastwan1.3b-stock --model fastwan2.1-t2v-1.3b --vae stock
    run fastwan5b-tiny --model fastwan2.2-ti2v-5b --vae tiny
    run fastwan5b-stock-auto --model fastwan2.2-ti2v-5b --vae stock --vae-tiling auto
    run hbxt-light --model hummingbird-xt --vae light
    run hbxt-tiny --model hummingbird-xt --vae tiny
    cp "$runs"/*.json "$OUT/" 2>/dev/null
    python3 - "$runs" <<'PY'
import glob, json, os, sys
print(f"{'run':22} {'frames':>13} {'DiT s':>6} {'decode s':>8} {'write s':>7} {'wait s':>7} {'tiling':>14} {'MB':>5}")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(f)); t = d["timing"]
    size = f"{d['frames']}x{d['height']}x{d['width']}"
    c = d.get("vae_tiling_choice")
    tiling = ("tiled" if c["tiled"] else "untiled") if isinstance(c, dict) else str(d.get("vae_tiling"))
    mb = os.path.getsize(f[:-5] + ".mp4") / 1e6 if os.path.exists(f[:-5] + ".mp4") else float("nan")
    print(f"{os.path.basename(f)[:-5]:22} {size:>13} {t['dit_s']:6.2f} {t['vae_decode_s']:8.2f} "
          f"{t['write_s']:7.2f} {t['wait_s']:7.2f} {tiling:>14} {mb:5.1f}")
PY
fi
if [ "$what" = peak ] || [ "$what" = all ]; then
    python3 benchmarks/vae_decode_peak.py gpu 2>&1 | grep -v Casting | tee "$OUT/vae_decode_peak.txt"
fi
