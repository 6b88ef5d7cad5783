"""The published sparse / distilled checkpoints' presets run as their authors run them, against the dense
multi-step CFG run of the same architecture (a GPU benchmark, not a test).

For each preset, two `vsagen t2v --json` processes on random weights at the real size (same seed, one warm-up
step each, so Triton compilation and autotuning stay out of the timed run):
* "as trained": the preset's own settings (e.g. FastWan2.1-1.3B: the 3-step DMD sampler, CFG off, `--attn auto`,
  which runs the backend the preset says it was trained for: vsa 0.8);
* "dense": `--sampler default --attn full` (the checkpoint's multistep scheduler at the preset's 50 steps, CFG 5).
Both decode with the VAE and write the mp4. The table gives DiT seconds per video (every timed forward), the VAE
decode, the mp4 write, the run's total (text encode to decode, from its JSON), the process's wall time, and the
dense / as-trained ratios.

Example (the lent H200):
    python benchmarks/published_presets.py --preset fastwan2.1-t2v-1.3b --preset hummingbird-xt --outdir /tmp/pub
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RUNS = {"as trained": [], "dense": ["--sampler", "default", "--attn", "full"]}


def run_one(preset: str, label: str, extra: list[str], outdir: Path, prompt: str) -> dict:
    out = outdir / f"{preset}-{label.replace(' ', '-')}.mp4"
    cmd = [sys.executable, "-m", "vsagen", "t2v", prompt, "--model", preset, "--random-weights", "--seed", "0",
           "--warmup", "1", "--out", str(out), "--overwrite", "--json", *RUNS[label], *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(wall_s=wall, label=label, preset=preset, command=" ".join(["vsagen", *cmd[3:]]))
    return result


def table(results: list[dict]) -> str:
    head = ("| preset | run | sampler | steps | CFG | attn | DiT fwds | DiT s / video | VAE decode s | write s | "
            "total s | wall s | DiT dense / this | total dense / this |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    dense = {r["preset"]: r for r in results if r["label"] == "dense"}
    for r in results:
        t, d = r["timing"], dense.get(r["preset"])
        backend = r["backend"]["name"] + (f" {r['backend']['sparsity']:g}" if "sparsity" in r["backend"] else "")
        ratio = (lambda key: f"{d['timing'][key] / t[key]:.1f}x" if d is not None and t[key] else "-")
        lines.append(f"| {r['preset']} | {r['label']} | {r['sampler']['name']} | {r['steps']} | "
                     f"{'on ' + format(r['guidance'], 'g') if r['cfg'] else 'off'} | {backend} | {t['dit_forwards']} | "
                     f"{t['dit_s']:.3f} | {t['vae_decode_s']:.2f} | {t['write_s']:.2f} | {t['total_s']:.2f} | "
                     f"{r['wall_s']:.1f} | {ratio('dit_s')} | {ratio('total_s')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", required=True, help="a published checkpoint's preset (repeat)")
    ap.add_argument("--outdir", type=Path, required=True)
    ap.add_argument("--prompt", default="a red fox running through fresh snow at dawn")
    ap.add_argument("--only", choices=list(RUNS), help="run one of the two configurations")
    ap.add_argument("extra", nargs="*", help="more vsagen t2v arguments (after --)")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    results = []
    for preset in args.preset:
        for label in ([args.only] if args.only else list(RUNS)):
            r = run_one(preset, label, args.extra, args.outdir, args.prompt)
            (args.outdir / f"{preset}-{label.replace(' ', '-')}.run.json").write_text(json.dumps(r, indent=1))
            print(f"{preset} {label}: DiT {r['timing']['dit_s']:.3f} s, total {r['timing']['total_s']:.2f} s, "
                  f"wall {r['wall_s']:.1f} s", flush=True)
            results.append(r)
    print(table(results))


if __name__ == "__main__":
    main()
