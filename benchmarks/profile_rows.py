"""Print the rows of `vsagen profile --format json` reports as one markdown table (not a test).

Usage: python benchmarks/profile_rows.py REPORT.json [REPORT.json ...]
One row per configuration: model, backend entry, tile fit, grid, the implementation that ran (`impl`, from the
backend's `impl_ran`), DiT and attention seconds per step, and the speed-up over `full` on the same grid.
"""

from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> int:
    print("| model | backend | tile fit | grid | impl ran | DiT s/step | attention s/step | speed-up vs full |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for r in report["rows"]:
            speed = r.get("speedup_vs_full")
            print(f"| {report['model']} | {r['spec']} | {r['tile_fit']} | {r['grid']} | {r['impl']} | "
                  f"{r['dit_s_per_step']:.4f} | {r['attention_s_per_step']:.4f} | "
                  f"{'-' if speed is None else f'{speed:.2f}x'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
