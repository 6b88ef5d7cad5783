#!/usr/bin/env bash
# Issue 33's GPU figures (H200 / H100), from the repository root through the device tool. Prepare here once:
#     bash ../shared/gpu/fetch-wheels.sh      (.whl: diffusers and the video writers)
#     bash ../shared/gpu/fetch-fa4.sh         (.fa4a, .fa4b: FlashAttention-4, two folders, two calls)
#     .peers/fastvideo-0.2.1.tar.gz           (FastVideo's sdist, 2.8 MB: pip download --no-deps --no-binary :all:
#                                              fastvideo==0.2.1; its Triton VSA kernel is loaded from it as data)
# fetch-fa4.sh's .fa4a/cu13.tar.xz (63 MiB) no longer fits beside the repository in one call's 64 MiB; recompress it
# once (2 min, 49.5 MiB): mkdir /tmp/u && tar -xJf .fa4a/cu13.tar.xz -C /tmp/u &&
#     tar -cf - -C /tmp/u . | xz -T2 --x86 --lzma2=preset=9e,dict=192MiB > /tmp/c.xz && mv /tmp/c.xz .fa4a/cu13.tar.xz
# Then three device calls back to back (the machine stays warm between them):
#   1. carry [".fa4a"]:                mkdir -p /tmp/fa4 && tar -xJf .fa4a/cu13.tar.xz -C /tmp/fa4
#   2. carry [".fa4b", ".whl", ".peers"]:   bash benchmarks/tiles_gpu.sh kernels
#      the kernels alone: benchmarks/tiles.py (every tile volume: whole backends with query rows 64 / 128 and FA4,
#      and the fine stage alone of vsagen, FastVideo's Triton VSA and FA4 on one selection; correctness at full size
#      on the 1.3B shape, forward and forward+backward against dense cuDNN at 1.3B and 14B 720p) and
#      benchmarks/fa4_adapter.py (the adapter's own check and timings), benchmarks/tile_expand.py (the list
#      expansion of tiles 128 / 256: torch against the one Triton launch)
#   3. carry [".fa4b", ".whl"]:        bash benchmarks/tiles_gpu.sh dit
#      the DiT, eager, random weights: `vsagen profile` of full and vsa at each tile at 1.3B 480p and 14B 720p
#   or 2'. carry [".fa4b", ".whl"]:    bash benchmarks/tiles_gpu.sh schedules
#      where FA4's time goes through the adapter (benchmarks/fa4_profile.py: padding, masks, lists, the kernel alone,
#      on the models' grids and on grids of whole cubes); the two forward schedules it also timed (fwd_pair.py)
#      were retired after they measured slower (source at commit 8b0ade0)
#   or 2''. carry [".fa4b", ".whl"]:   bash benchmarks/tiles_gpu.sh crop
#      grids of whole cubes, where FA4 needs no padding or mask: Nsight Compute on one forward of each engine with the
#      same lists (benchmarks/ncu_fine.py), FA4's split on the crop grids (fa4_profile.py), and the 1.3B DiT with
#      `--tile-fit crop` on both engines
#   or 2c. carry [".fa4b", ".whl"]:  bash benchmarks/tiles_gpu.sh auto
#      impl=auto's engine choice in the DiT: `vsagen profile` of vsa:tile=4x8x8 (auto) beside impl=triton, with
#      --tile-fit partial,crop at 1.3B (and crop at 14B with WITH_14B_DIT=1; the JSON's rows with the engine that ran;
#      benchmarks/profile_rows.py prints them), and FA4's split on the 1.3B and 14B crop grids
#   or 2ws. carry [".whl"] (with ".fa4b" after the .fa4a call: FA4's rows on the 1.3B grid too):
#                                  bash benchmarks/tiles_gpu.sh ws
#      the warp-specialized forward (vsagen/kernels/bsa_forward_ws.py, benchmarks/fwd_ws.py): checked against
#      float64 and the pipelined forward, timed beside it at every tile volume on the 1.3B and 14B grids and on grids
#      of whole cubes, and the 1.3B and 14B DiT with either forward in one process; ~3 min
# Without .fa4a/.fa4b (or when /tmp/fa4 is gone) the FA4 rows say why they were skipped and the rest runs; without
# the sdist, so do FastVideo's.
set -u
what=${1:-kernels}
source benchmarks/gpu_env.sh || exit 1
[ -d /tmp/fa4/nvidia_cutlass_dsl ] || echo "FA4 not prepared (.fa4b or /tmp/fa4 missing): its rows are skipped"
if [ "$what" = kernels ]; then
    python3 benchmarks/tiles.py --shapes 1.3b,14b --fastvideo-sdist .peers/fastvideo-0.2.1.tar.gz \
        --json "$OUT/tiles.json" 2>&1 | grep -v Warning | tee "$OUT/tiles.txt"
    python3 benchmarks/fa4_adapter.py --shapes 1.3b 2>&1 | grep -v Warning | tee "$OUT/fa4_adapter.txt"
    python3 benchmarks/tile_expand.py 2>&1 | grep -v Warning | tee "$OUT/tile_expand.txt"
elif [ "$what" = schedules ]; then  # each part bounded so that one call holds both
    timeout 200 python3 benchmarks/fa4_profile.py --shapes 1.3b 2>&1 | grep -v Warning | tee "$OUT/fa4_profile.txt"
    timeout 150 python3 benchmarks/fa4_profile.py --shapes 14b --fits crop 2>&1 | grep -v Warning \
        | tee "$OUT/fa4_profile_14b.txt"
elif [ "$what" = crop ]; then
    sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
    sections="$sections --section ComputeWorkloadAnalysis --print-details all"
    for vol in 128 256; do
        timeout 90 python3 benchmarks/ncu_fine.py --volume $vol --time 2>&1 | grep -v Warning | tee "$OUT/fine-$vol.txt"
        timeout 120 ncu --clock-control none --nvtx --nvtx-include "vsagen/" --nvtx-include "fa4/" $sections \
            python3 benchmarks/ncu_fine.py --volume $vol > "$OUT/ncu-$vol.txt" 2>&1
        grep -E "^  [a-z_]|Duration|Registers Per|Shared Memory Config|Achieved Occupancy|Theoretical Occ|Issue Slots|\
Executed Ipc A|Compute \(SM\) Th|Memory Throughput|Warp Cycles Per Issued|Block Limit|Grid Size|Block Size|Tensor" \
            "$OUT/ncu-$vol.txt" | head -60
    done
    fa4=""
    python3 -c "import flash_attn.cute" 2>/dev/null && fa4=",vsa:tile=4x4x8:impl=fa4,vsa:tile=4x8x8:impl=fa4"
    timeout 200 vsagen profile --model wan2.1-t2v-1.3b --random-weights --tile-fit crop --steps 2 --no-stock \
        --attn "full,vsa:tile=4x4x8,vsa:tile=4x8x8$fa4" --format markdown 2>&1 | tee "$OUT/dit-1.3b-crop.md"
    timeout 120 python3 benchmarks/fa4_profile.py --shapes 1.3b --fits crop 2>&1 | grep -v Warning \
        | tee "$OUT/fa4_profile_crop.txt"
elif [ "$what" = ws ]; then
    timeout 420 python3 benchmarks/fwd_ws.py --shapes 1.3b,14b --dit 1.3b,14b 2>&1 | grep -v Warning \
        | tee "$OUT/fwd_ws.txt"
    if [ -d /tmp/fa4/nvidia_cutlass_dsl ]; then  # FA4 on the same grid, same run (the `.fa4a` call first)
        timeout 120 python3 benchmarks/fa4_profile.py --shapes 1.3b --fits partial 2>&1 | grep -v Warning \
            | tee "$OUT/fa4_profile_partial.txt"
    fi
elif [ "$what" = auto ]; then
    timeout 90 python3 benchmarks/fa4_profile.py --shapes 1.3b --fits crop 2>&1 | grep -v Warning \
        | tee "$OUT/fa4_profile_crop.txt"
    attn="full,vsa:tile=4x8x8,vsa:tile=4x8x8:impl=triton"
    timeout 180 vsagen profile --model wan2.1-t2v-1.3b --random-weights --attn "$attn" --tile-fit partial,crop \
        --steps 2 --no-stock --format json --out "$OUT/dit-auto-1.3b.json" 2>&1 | tail -3
    python3 benchmarks/profile_rows.py "$OUT"/dit-auto-*.json
    timeout 150 python3 benchmarks/fa4_profile.py --shapes 14b --fits crop 2>&1 | grep -v Warning \
        | tee "$OUT/fa4_profile_14b_crop.txt"
    if [ "${WITH_14B_DIT:-0}" = 1 ]; then  # 4-5 minutes more: the 14B DiT at --tile-fit crop
        timeout 300 vsagen profile --model wan2.1-t2v-14b --random-weights --attn "$attn" --tile-fit crop \
            --steps 1 --warmup 1 --no-stock --format json --out "$OUT/dit-auto-14b.json" 2>&1 | tail -3
        python3 benchmarks/profile_rows.py "$OUT/dit-auto-14b.json"
    fi
else
    fa4=""
    python3 -c "import flash_attn.cute" 2>/dev/null && fa4=",vsa:tile=4x4x8:impl=fa4,vsa:tile=4x8x8:impl=fa4"
    attn="full,vsa,vsa:tile=4x4x8,vsa:tile=4x8x8,vsa:tile=4x4x8:query_rows=128,vsa:tile=4x8x8:query_rows=128$fa4"
    vsagen profile --model wan2.1-t2v-1.3b --random-weights --attn "$attn" --steps 2 --no-stock \
        --format markdown 2>&1 | tee "$OUT/dit-1.3b.md"
    vsagen profile --model wan2.1-t2v-14b --random-weights --attn "$attn" --steps 1 --warmup 1 --no-stock \
        --format markdown 2>&1 | tee "$OUT/dit-14b.md"
fi
