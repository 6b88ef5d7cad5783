# Sourced by the benchmarks/*_gpu.sh scripts on the lent GPU, from the repository root: installs the carried
# wheels (.whl: ../shared/gpu/fetch-wheels.sh) and, where carried and unpacked, FlashAttention-4 (.fa4b, with
# /tmp/fa4 from .fa4a: ../shared/gpu/fetch-fa4.sh), then vsagen itself (editable, offline; from the tree where that
# cannot build); sets OUT (default /tmp/out) and prints the GPU, the versions and the commit (where this machine's
# git metadata is the tree's). Returns 1 when an install fails.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site
if [ -d .fa4b/whl ] && [ -d /tmp/fa4/nvidia_cutlass_dsl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site3 .fa4b/whl/*.whl &&
    cp -rn /tmp/fa4/nvidia_cutlass_dsl/. /tmp/site3/nvidia_cutlass_dsl/ &&
    cp -rn /tmp/fa4/nvidia_cutlass_dsl_libs_cu13-4.8.1.dist-info /tmp/site3/ &&
    export PYTHONPATH=/tmp/site3:/tmp/site3/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
fi
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /tmp/vsagen-install.log 2>&1; then
    # no build backend offline: run from the tree instead (PYTHONPATH and a `vsagen` shim on PATH)
    tail -2 /tmp/vsagen-install.log
    export PYTHONPATH=$PWD:$PYTHONPATH
    mkdir -p /tmp/vsagen-bin && printf '#!/bin/sh\nexec python3 -m vsagen "$@"\n' > /tmp/vsagen-bin/vsagen &&
        chmod +x /tmp/vsagen-bin/vsagen && export PATH=/tmp/vsagen-bin:$PATH
fi
python3 -c "import vsagen" || return 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
python3 -c "import flash_attn.cute, importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'))" \
    2>/dev/null || echo "flash-attn-4 not importable"
# the device's git metadata can be an older copy than the tree it runs: name the commit only when they agree
if git diff --quiet HEAD 2>/dev/null; then git rev-parse --short HEAD
else echo "commit: unknown here (this machine's git metadata is not the tree's: note the commit you carried)"; fi
return 0
