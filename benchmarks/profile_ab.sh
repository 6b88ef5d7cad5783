#!/usr/bin/env bash
# The DiT of two trees on one GPU in one run: `vsagen profile` of the 1.3B (full, vsa) from an older tree (.old)
# and from this one, in the order old, new, new, old, each run's report under $OUT (issue 44's "no change in
# behaviour" check: b77f614, the tree before issue 44, against its result). Prepare .old here first:
#     mkdir -p .old && git archive COMMIT | tar -x -C .old && echo /.old/ >> .git/info/exclude
# then through the device tool, carrying .whl (../shared/gpu/fetch-wheels.sh) and .old:
#     bash benchmarks/profile_ab.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
ARGS="profile --model wan2.1-t2v-1.3b --random-weights --attn full,vsa --steps 2 --warmup 1 --no-stock --format json"
run() { # $1 label, $2 tree
  local t0=$(date +%s)
  (cd /tmp && PYTHONPATH="$2:/tmp/site" python3 -m vsagen $ARGS --out "$OUT/$1.json" > "$OUT/$1.log" 2>&1)
  echo "$1 rc=$? wall=$(( $(date +%s) - t0 ))s"; tail -3 "$OUT/$1.log"
}
run old1 "$PWD/.old"; run new1 "$PWD"; run new2 "$PWD"; run old2 "$PWD/.old"
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/*.json")):
    d = json.load(open(f)); r = {x["backend"] + ("/" + x["kind"] if x.get("kind", "backend") != "backend" else ""): x for x in d["rows"]}
    print(os.path.basename(f), " ".join(f"{k}={v['dit_s_per_step']:.4f}s/step(x{v['speedup_vs_full']:.3f})" for k, v in r.items()), "load", round(d["load_s"], 1))
PY
