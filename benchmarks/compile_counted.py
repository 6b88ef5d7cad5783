"""`python3 benchmarks/compile_counted.py ARGS...`: the `vsagen ARGS...` command line in this process, and when it
ends, torch's compile-cache counters (`fxgraph_cache_*`, `autograd_cache_*`, ...) and Dynamo's compile-time totals
(seconds per phase: Dynamo's tracing, AOTAutograd, Inductor) written as JSON to $COUNTERS_OUT
(benchmarks/compile_cache_gpu.sh; on the CPU with `--model tiny --compile`)."""

import atexit
import json
import os
import sys


def dump() -> None:
    utils = sys.modules.get("torch._dynamo.utils")
    found: dict = {}
    if utils is not None:
        found = {f"{group}.{k}": v for group in ("inductor", "aot_autograd")
                 for k, v in utils.counters[group].items() if "cache" in k}
        try:
            names, values = utils.compile_times("csv", aggregate=True)
            found["seconds"] = {n: round(float(v), 3) for n, v in zip(names, values)}
        except Exception as e:  # noqa: BLE001 - the times are extra; their API differs across torch versions
            found["seconds"] = f"unavailable: {type(e).__name__}: {e}"
    with open(os.environ["COUNTERS_OUT"], "w") as f:
        json.dump(found, f)


atexit.register(dump)
sys.argv = ["vsagen", *sys.argv[1:]]
from vsagen.cli import main  # noqa: E402 - after the exit hook, as the command ends the process

main()
