#!/usr/bin/env bash
# Issue 47 item 6 ("compiled code kept") in one device call (H100 / H200; logs, JSONs and counters under $OUT): the
# same plain `vsagen t2v --model fastwan2.1-t2v-1.3b --random-weights --warmup 1` three times, each a fresh process:
#   first   a fresh, empty VSAGEN_CACHE: compiles the fused block regions (torch.compile) and JITs vsagen's Triton
#           kernels, saving them under $VSAGEN_CACHE/compile/ (vsagen.models.compile_caches);
#   second  the same VSAGEN_CACHE: should find everything there (FX graph / AOTAutograd cache hits, no Triton kernel
#           added), paying Dynamo's tracing only;
#   off     for contrast, torch's caches off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1) and an empty Triton cache.
# Prints each run's warmup_s, its parts (warmup_parts_s) and load_s (from the run's JSON), torch's cache counters (fxgraph_cache_*,
# autograd_cache_*) and Dynamo's seconds per compile phase (benchmarks/compile_counted.py), the kernels in the
# Triton cache after the run, the cache's size, and second/first warm-up.
# Target (issue 47): second warmup_s <= 20% of first. About 2-3 minutes on an H100. PYC=1: bytecode cached (below).
# Run from the repository root through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh):
#     bash benchmarks/compile_cache_gpu.sh
set -u
source benchmarks/gpu_env.sh || exit 1
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR TORCHINDUCTOR_FORCE_DISABLE_CACHES
work=/tmp/compile-cache; rm -rf "$work"; mkdir -p "$work/runs"
export VSAGEN_CACHE=$work/vsagen-cache
if [ "${PYC:-0}" = 1 ]; then
    # PYC=1: Python's bytecode cached as an installed environment has it (pip writes .pyc at install; the lent GPU
    # sets PYTHONDONTWRITEBYTECODE and its torch has none, so every process there compiles the sources of the
    # modules it imports, torch._dynamo's and Inductor's inside the first compile among them). A "prime" run with
    # its own empty vsagen cache writes the .pyc (under $work/pyc) before "first", whose compile caches stay empty.
    unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$work/pyc
    echo "PYC=1: sys.flags.dont_write_bytecode $(python3 -c "import sys; print(sys.flags.dont_write_bytecode)")"
    VSAGEN_CACHE=$work/prime-cache vsagen t2v --model fastwan2.1-t2v-1.3b --random-weights --warmup 1 \
        --out "$work/runs/prime.mp4" "a fox" > "$OUT/prime.log" 2>&1 || { echo "prime failed:"; tail -5 "$OUT/prime.log"; }
    echo "prime: $(find "$work/pyc" -name '*.pyc' | wc -l) .pyc written"
fi
for run in ${RUNS:-first second off}; do  # RUNS="first second": without the caches-off contrast
    if [ "$run" = off ]; then
        export TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 TRITON_CACHE_DIR=$work/triton-off
    fi
    start=$(date +%s%N)
    COUNTERS_OUT=$work/runs/$run.counters.json python3 benchmarks/compile_counted.py t2v --model fastwan2.1-t2v-1.3b \
        --random-weights --warmup 1 --out "$work/runs/$run.mp4" "a fox" > "$OUT/$run.log" 2>&1 \
        || { echo "run $run failed:"; tail -5 "$OUT/$run.log"; }
    echo "$run: process wall $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$work/runs/wall.txt"
    triton_dir=${TRITON_CACHE_DIR:-$VSAGEN_CACHE/compile/triton}
    echo "$run: kernels in the Triton cache after it: $(find "$triton_dir" -name '*.cubin' 2>/dev/null | wc -l)" \
        | tee -a "$work/runs/wall.txt"
done
du -sh "$VSAGEN_CACHE"/compile/* 2>/dev/null | tee "$OUT/cache-size.txt"
cp "$work"/runs/*.json "$work/runs/wall.txt" "$OUT/"
python3 - "$work/runs" <<'PY'
import json, os, sys

runs = sys.argv[1]
rows = {}
for name in ("first", "second", "off"):
    try:
        rows[name] = json.load(open(os.path.join(runs, f"{name}.json")))["timing"]
    except OSError:
        print(f"{name}: no run JSON")
        continue
    counters = json.load(open(os.path.join(runs, f"{name}.counters.json")))
    print(f"{name:7} warmup_s {rows[name]['warmup_s']:7.2f}  load_s {rows[name]['load_s']:6.2f}  "
          f"total_s {rows[name]['total_s']:6.2f}  {counters}")
    parts = rows[name].get("warmup_parts_s") or {}  # the warm-up's split (steps, compile inside them, decoder)
    print(f"{'':7} warm-up steps {parts.get('denoise', 0):6.2f} (of which torch.compile {parts.get('compile', 0):5.2f})"
          f"  decoder's first call {parts.get('decode', 0):5.2f}")
if "first" in rows and "second" in rows:
    ratio = rows["second"]["warmup_s"] / rows["first"]["warmup_s"]
    print(f"second/first warmup_s: {ratio:.3f} (target <= 0.20)")
if "off" in rows and "second" in rows:
    print(f"second/off warmup_s: {rows['second']['warmup_s'] / rows['off']['warmup_s']:.3f}")
PY
