#!/usr/bin/env bash
# Issue 32's GPU measurements in one device call (H200; logs and JSONs under $OUT):
#  1. benchmarks/vae_dtype.py: the bf16 VAE decode against float32 (PSNR, times) at the 1.3B's and the 5B's sizes,
#     and on top of bf16 channels-last 3-D, cuDNN autotuning and (1.3B) a compiled decoder;
#  2. the few-step runs end to end with random weights, --warmup 1: FastWan2.1-1.3B (3 DMD steps, vsa 0.8,
#     480x832x81) and Hummingbird-XT (3 steps, 704x1280x121) with the streamed decode + encode (the defaults), the
#     old encode (x264 medium), the bf16 VAE, and for Hummingbird-XT the light decoder against the stock one: the
#     wait (text encode to the mp4 written), decode, encode and their overlap, from each run's JSON;
#  3. benchmarks/light_vae_equivalence.py at 704p: AMD's decoder (their file, carried in .peers/) against vsagen's.
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh) and .peers
# (`git show 63b54d1:infer/examples/wan2.2/autoencoder_kl_turbo_vaed_ours_wan22.py` of AMD-AGI/HummingbirdXT):
#     bash benchmarks/decode_gpu.sh
set -u
source benchmarks/gpu_env.sh || exit 1
nproc; python3 -c "import imageio_ffmpeg; print('imageio-ffmpeg', imageio_ffmpeg.__version__)"
python3 benchmarks/vae_dtype.py --model wan2.1-t2v-1.3b --variants fp32,bf16,bf16+cl,bf16+cudnn,bf16+compile 2>&1 | grep -v Casting | tee "$OUT/vae_dtype_1.3b.txt"
python3 benchmarks/vae_dtype.py --model wan2.2-ti2v-5b --tiling --variants fp32,bf16,bf16+cl,bf16+cudnn 2>&1 | grep -v Casting | tee "$OUT/vae_dtype_5b.txt"
runs=/tmp/decode-runs; rm -rf "$runs"; mkdir -p "$runs"
run() {  # name, then vsagen t2v arguments
    local name=$1; shift
    vsagen t2v "$@" --random-weights --warmup 1 --out "$runs/$name.mp4" "a fox" > "$OUT/$name.log" 2>&1 \
        || tail -5 "$OUT/$name.log"
}
run fastwan-stream --model fastwan2.1-t2v-1.3b                           # the defaults (a bf16 decode since ea93ca0)
run fastwan-medium --model fastwan2.1-t2v-1.3b --codec x264:preset=medium --vae-dtype fp32   # the old run
run fastwan-fp32vae --model fastwan2.1-t2v-1.3b --vae-dtype fp32
run hbxt-stock --model hummingbird-xt --vae stock
run hbxt-stock-bf16vae --model hummingbird-xt --vae stock --vae-dtype bf16
run hbxt-light --model hummingbird-xt --vae light
cp "$runs"/*.json "$OUT/"
python3 - "$runs" <<'PY'
import glob, json, os, sys
print(f"{'run':20} {'DiT s':>7} {'decode s':>8} {'encode s':>8} {'overlap':>7} {'wait s':>7} {'MB':>6}")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(f)); t = d["timing"]
    mb = os.path.getsize(f[:-5] + ".mp4") / 1e6
    print(f"{os.path.basename(f)[:-5]:20} {t['dit_s']:7.2f} {t['vae_decode_s']:8.2f} {t['write_s']:8.2f} "
          f"{t['overlap_s']:7.2f} {t['wait_s']:7.2f} {mb:6.1f}")
PY
python3 benchmarks/light_vae_equivalence.py --source .peers/autoencoder_kl_turbo_vaed_ours_wan22.py \
    --arch hummingbird --shape 704p 2>&1 | tail -12 | tee "$OUT/light_vae.txt"
