"""End-to-end timing breakdown of `vsagen t2v` (or, with --image, `vsagen i2v`) for several attention backends
(a GPU benchmark, not a test).

Each configuration runs in its own `vsagen t2v --json` / `vsagen i2v --json` process (fresh GPU memory, same seed), and the
script prints one markdown table: DiT time, attention-backend time (and its stages), VAE decode, total,
and the attention time as a ratio of the dense (`full`, cuDNN) run measured in the same invocation.

Example (the lent H200, random weights at the real size):
    python benchmarks/t2v_breakdown.py --model wan2.1-t2v-1.3b --random-weights --steps 2 \
        --run full --run vsa:0.875 --outdir /tmp/bench
    python benchmarks/t2v_breakdown.py --model wan2.2-i2v-a14b --random-weights --image first.png --steps 2 \
        --outdir /tmp/bench-i2v -- --height 480 --width 832 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def run_one(args: argparse.Namespace, spec: str, outdir: Path) -> dict:
    attn, _, sparsity = spec.partition(":")
    out = outdir / f"{attn}{'-' + sparsity if sparsity else ''}.mp4"
    command = ["i2v", str(args.image)] if args.image else ["t2v"]
    cmd = [sys.executable, "-m", "vsagen", *command, args.prompt, "--model", args.model, "--attn", attn,
           "--steps", str(args.steps), "--out", str(out), "--overwrite", "--json", "--seed", "0"]
    if sparsity:
        cmd += ["--sparsity", sparsity]
    if args.random_weights:
        cmd.append("--random-weights")
    cmd += args.extra
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    result["command"] = " ".join(cmd[2:])
    return result


def table(results: list[dict]) -> str:
    dense = next((r for r in results if r["attn"] == "full"), None)
    dense_attn = dense["timing"]["self_attention_s"] if dense else None
    head = ("| attn | sparsity | DiT s (fwds) | DiT s/step | by expert s (fwds) | attn1 s | attention s | stages s "
            "| attn % DiT | attention vs full | DiT vs full | VAE s | total s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        t = r["timing"]
        steps = max(1, len(t["dit_per_step_s"]))
        stages = ", ".join(f"{k} {v:.3f}" for k, v in t["self_attention_stages_s"].items()) or "-"
        ratio = f"{t['self_attention_s'] / dense_attn:.2f}x" if dense_attn else "-"
        dit_ratio = f"{dense['timing']['dit_s'] / t['dit_s']:.2f}x faster" if dense else "-"
        sp = r["backend"].get("sparsity", "-")
        by_expert = ", ".join(f"{e} {v:.3f} ({t.get('dit_forwards_by_expert', {}).get(e, '?')})"
                              for e, v in t.get("dit_by_expert_s", {}).items()) or "-"
        lines.append(f"| {r['attn']} | {sp} | {t['dit_s']:.3f} ({t['dit_forwards']}) | {t['dit_s'] / steps:.3f} | "
                     f"{by_expert} | {t['attn1_s']:.3f} | {t['self_attention_s']:.3f} | {stages} | "
                     f"{100 * t['attention_share_of_dit']:.1f} | {ratio} | {dit_ratio} | {t['vae_decode_s']:.3f} | "
                     f"{t['total_s']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="wan2.1-t2v-1.3b")
    ap.add_argument("--prompt", default="a red fox running through fresh snow, cinematic")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--image", type=Path, default=None, help="run `vsagen i2v IMAGE` (image-to-video models)")
    ap.add_argument("--run", action="append", default=None,
                    help="backend[:sparsity], repeatable; default: full and vsa:0.875")
    ap.add_argument("--outdir", type=Path, default=Path("bench-out"))
    ap.add_argument("extra", nargs="*", help="extra `vsagen t2v` flags after --")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    runs = args.run or ["full", "vsa:0.875"]
    results = [run_one(args, spec, args.outdir) for spec in runs]
    (args.outdir / "results.json").write_text(json.dumps(results, indent=2))
    r0 = results[0]
    v = r0["versions"]
    print(f"{r0['model']} {'i2v' if r0.get('image') else 't2v'} {r0['frames']}x{r0['height']}x{r0['width']} "
          f"steps={r0['steps']} experts={','.join(r0['experts'])} "
          f"guidance={r0['guidance']} dtype={r0['dtype']} grid={r0['denoised']['grid']} "
          f"tiles={r0['denoised']['tiles']} ({r0['denoised']['full_tiles']} full)")
    print(", ".join(f"{k} {val}" for k, val in v.items()))
    print(table(results))


if __name__ == "__main__":
    main()
