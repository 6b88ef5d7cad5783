"""Issue 13: the H200 A/B of the ROCm seed's three kernel changes against the current `vsa` kernels.

At the three Wan shapes (B=1, D=128, bf16, `--sparsity` 0.875) it times VSA's fine stage (`block_sparse_attention`
on one coarse selection per shape, made with the baseline tuning and shared by every variant) forward (no_grad) and
forward+backward (a fixed random dO). Each variant is the device's `vsa` tuning through `dataclasses.replace`:
* change 1, tuning spaces: every launch of one kernel at other num_stages ("fwd stages 2|4", "dq stages 1|3",
  "dkdv stages 2|4"); "hip tables" (gfx942's three launch tables, `arch_tuning("rocm-cdna3", 128)`, no HIP options);
* change 2, evict-first hints on the one-pass loads: "evict_first", "streaming"; TMA loads take no hint, so also
  with pointer loads: "no-tma" (the control), "no-tma evict_first", "no-tma streaming";
* change 3: the pre-offset k2q entries (`lean_index`), `vsa`'s default since this A/B: "no lean index" is its
  control (vsa without it; a ratio below 1 is what the change gains);
* "rocm-vsa" (`kernel_tuning(..., "rocm-vsa")` as it is now: on CUDA the same tuning as vsa; the header lists what
  each variant changes) and "all" (lean index + streaming hints: rocm-vsa's changes on AMD, its tables aside).
Each variant's output and q/k/v gradients are first compared with the baseline's (relative L2, > 1e-2: FAIL; the
run goes on, as after a variant that raises, e.g. out of resources: an error row). "vs vsa" = vsa ms / variant ms
(> 1: faster), "x cuDNN" = dense cuDNN SDPA ms / variant ms, same pass. The whole VSA (coarse + fine) is timed for
vsa and rocm-vsa, and vsa again at each shape's end ("vsa again": the run's noise). Then per change: its best
variant per pass, and whether it beats vsa by more than 1% at every shape.

Timing: `vsagen.bench.bench_ms` (do_bench medians), warm-up 50 ms / rep 300 ms by default (`--rep-ms`), so that ~16
variants x 3 shapes fit in ~7 minutes. A variant's first call (the correctness one, untimed) compiles its Triton
kernels: compiles dominate a cold run.

Usage: python benchmarks/rocm_ab.py [--shapes 1.3b,5b,14b] [--variants "vsa,lean index,all"] [--sparsity 0.875]
       [--rep-ms 300] [--warmup-ms 50] [--json out.json] [--dry-run] [--interleave ROUNDS]
(--interleave: the chosen variants timed in rotating rounds instead, ratios taken within a round: for changes
 smaller than the drift of one long run.)
(--dry-run: print the variants and what they change, no GPU needed; on a CPU from the "cpu" tuning.)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
import time

import torch

from vsagen.bench import SHAPES, AttentionShape, bench_ms, make_inputs, rel_l2, sdpa
from vsagen.kernels import reference as ref
from vsagen.kernels.tuning import KernelTuning, arch_tuning, kernel_tuning
from vsagen.layout import tile_layout

FAIL_REL_L2 = 1e-2
MARGIN = 1.01  # "beats vsa": more than 1% faster
# change -> its variants ("no-tma" is change 2's control, not a candidate; "vsa again" is the noise row)
CHANGES = {
    "change 1: tuning spaces": ("fwd stages 2", "fwd stages 4", "dq stages 1", "dq stages 3", "dkdv stages 2",
                                "dkdv stages 4", "hip tables"),
    "change 2: evict-first hints": ("evict_first", "streaming", "no-tma evict_first", "no-tma streaming"),
    "change 3: lean index (vsa's default now; the row is its control, without it)": ("no lean index",),
    "combined": ("rocm-vsa", "all"),
}
WHOLE = ("vsa", "rocm-vsa")  # variants also timed as the whole VSA (coarse + fine)


def with_stages(launch: tuple, stages: int) -> tuple:
    """A launch table with every entry's num_stages replaced."""
    return tuple((block, warps, stages) for block, warps, _ in launch)


def build_variants(device: torch.device) -> dict[str, KernelTuning]:
    """Every variant's tuning at D=128, in table order, derived from the device's `vsa` tuning."""
    base = kernel_tuning(device, 128)
    rep = dataclasses.replace
    hip = arch_tuning("rocm-cdna3", 128)
    out = {"vsa": base}
    for field, short, stages in (("fwd_launch", "fwd", (2, 4)), ("bwd_dq_launch", "dq", (1, 3)),
                                 ("bwd_dkdv_launch", "dkdv", (2, 4))):
        for s in stages:
            out[f"{short} stages {s}"] = rep(base, **{field: with_stages(getattr(base, field), s)})
    out["hip tables"] = rep(base, fwd_launch=hip.fwd_launch, bwd_dq_launch=hip.bwd_dq_launch,
                            bwd_dkdv_launch=hip.bwd_dkdv_launch)
    for hint in ("evict_first", "streaming"):
        out[hint] = rep(base, one_pass_loads=hint)
    out["no-tma"] = rep(base, tma_loads=False)
    for hint in ("evict_first", "streaming"):
        out[f"no-tma {hint}"] = rep(base, tma_loads=False, one_pass_loads=hint)
    out["no lean index"] = rep(base, lean_index=False)  # change 3's control: vsa before lean_index was its default
    out["rocm-vsa"] = kernel_tuning(device, 128, "rocm-vsa")
    out["all"] = rep(base, lean_index=True, one_pass_loads="streaming")  # rocm-vsa's changes on AMD (tables aside)
    return out


def differences(t: KernelTuning, base: KernelTuning) -> str:
    """The fields in which t differs from base, as `name=value` pairs ("same as vsa" when none)."""
    diff = [f"{f.name}={getattr(t, f.name)}" for f in dataclasses.fields(t)
            if getattr(t, f.name) != getattr(base, f.name)]
    return ", ".join(diff) or "same as vsa"


def make_calls(x, leaves, do, sel, off, top_k, t: KernelTuning, whole: bool):
    """(run, fwd, fwd_bwd): run(q, k, v) -> out; fwd() under no_grad on x; fwd_bwd() on the leaves, grads reset.
    whole: the coarse stage runs inside each call (with t); else the fixed selection `sel`."""
    from vsagen.kernels.block_sparse_attn import block_sparse_attention
    from vsagen.kernels.coarse import coarse_stage

    def run(q, k, v):
        c = coarse_stage(q, k, off, top_k, tuning=t) if whole else sel
        return block_sparse_attention(q, k, v, c.q2k, c.q2k_cnt, off, tuning=t)[0]

    def fwd():
        with torch.no_grad():
            return run(*x)

    def fwd_bwd():
        for leaf in leaves:
            leaf.grad = None
        run(*leaves).backward(do)
    return run, fwd, fwd_bwd


def measure(name: str, scope: str, calls, leaves, do, want, bench) -> dict:
    """One row: correctness against `want` ([out, dq, dk, dv] of the baseline; "base": this is the baseline, its
    outputs go to row["_outputs"]; None: the baseline failed, unchecked), then fwd and fwd+bwd ms. Errors become
    the row's status."""
    row = {"variant": name, "scope": scope, "fwd_ms": None, "fwd_bwd_ms": None, "rel_l2": {}, "max_rel_l2": None}
    try:
        run, fwd, fwd_bwd = calls
        for leaf in leaves:
            leaf.grad = None
        out = run(*leaves)
        out.backward(do)
        got = [out.detach()] + [leaf.grad for leaf in leaves]
        if want == "base":
            row["_outputs"] = want = got
        if want is not None:
            row["rel_l2"] = {k: rel_l2(a, b) for k, a, b in zip(("out", "dq", "dk", "dv"), got, want)}
            row["max_rel_l2"] = max(row["rel_l2"].values())
        del out, got
        row["fwd_ms"] = bench(fwd)
        row["fwd_bwd_ms"] = bench(fwd_bwd)
        err = row["max_rel_l2"]
        bad = err is not None and not err <= FAIL_REL_L2  # NaN fails too
        row["status"] = f"FAIL (rel L2 > {FAIL_REL_L2:g})" if bad else "ok" if want is not None else "ok, unchecked"
    except Exception as e:  # noqa: BLE001 - e.g. a compile error or out of resources: an error row, go on
        row["status"] = f"ERROR {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    finally:
        for leaf in leaves:
            leaf.grad = None
    print(f"  {scope} {name}: {row['status']}, fwd {fmt(row['fwd_ms'], '.3f')} ms, fwd+bwd "
          f"{fmt(row['fwd_bwd_ms'], '.3f')} ms, max rel L2 {fmt(row['max_rel_l2'], '.1e')}", flush=True)
    return row


def run_shape(key: str, shape: AttentionShape, sparsity: float, variants: dict[str, KernelTuning], bench,
              device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> tuple[dict, list[dict]]:
    """Dense cuDNN timings and every variant's row at one shape; the ratios filled in (device / dtype: for a CPU
    smoke run under TRITON_INTERPRET=1)."""
    from torch.nn.attention import SDPBackend

    from vsagen.kernels.coarse import coarse_stage

    layout = tile_layout(shape.grid, device=device)
    off = layout.tile_offsets_i32
    top_k = ref.top_k_from_sparsity(sparsity, layout.num_tiles)
    x = make_inputs(shape, seed=1, device=device, dtype=dtype)
    leaves = [t.detach().clone().requires_grad_(True) for t in x]
    g = torch.Generator(device=device).manual_seed(2)
    do = torch.randn(x[0].shape, generator=g, device=device, dtype=dtype)
    base = variants["vsa"]
    sel = coarse_stage(x[0], x[1], off, top_k, tuning=base)
    dense = {"fwd_ms": None, "fwd_bwd_ms": None}
    try:
        dense["fwd_ms"] = bench(lambda: sdpa(*x, SDPBackend.CUDNN_ATTENTION))

        def dense_fb():
            for leaf in leaves:
                leaf.grad = None
            sdpa(*leaves, SDPBackend.CUDNN_ATTENTION).backward(do)
        dense["fwd_bwd_ms"] = bench(dense_fb)
    except Exception as e:  # noqa: BLE001 - no cuDNN attention here: the x cuDNN columns stay empty
        print(f"  SDPA cuDNN: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
    print(f"{shape.name}: S={shape.tokens} H={shape.heads} tiles={layout.num_tiles} top_k={top_k}; cuDNN fwd "
          f"{fmt(dense['fwd_ms'], '.3f')} ms, fwd+bwd {fmt(dense['fwd_bwd_ms'], '.3f')} ms", flush=True)
    rows = [measure("vsa", "fine", make_calls(x, leaves, do, sel, off, top_k, base, False), leaves, do, "base",
                    bench)]
    want = rows[0].pop("_outputs", None)
    jobs = [(n, "fine", t, False) for n, t in variants.items() if n != "vsa"]
    jobs += [(n, "whole", variants[n], True) for n in WHOLE if n in variants]
    jobs.append(("vsa again", "fine", base, False))
    for name, scope, t, whole in jobs:
        calls = make_calls(x, leaves, do, sel, off, top_k, t, whole)
        rows.append(measure(name, scope, calls, leaves, do, want, bench))
    for r in rows:
        ref_row = next((b for b in rows if b["variant"] == "vsa" and b["scope"] == r["scope"]), None)
        r["shape"] = key
        for kind in ("fwd", "fwd_bwd"):
            ms, b, d = r[f"{kind}_ms"], ref_row and ref_row[f"{kind}_ms"], dense[f"{kind}_ms"]
            r[f"{kind}_vs_vsa"] = b / ms if ms and b else None
            r[f"{kind}_x_cudnn"] = d / ms if ms and d else None
    del x, leaves, do, sel, want
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"shape": key, "name": shape.name, "tokens": shape.tokens, "heads": shape.heads,
            "tiles": layout.num_tiles, "top_k": top_k, "cudnn": dense}, rows


def interleaved(key: str, shape: AttentionShape, sparsity: float, variants: dict[str, KernelTuning], rounds: int,
                bench) -> list[str]:
    """The chosen variants' fine stage timed in `rounds` interleaved rounds (the order rotated each round), so a
    drift of the GPU's clock during the run falls on every variant alike: per variant the median fwd and fwd+bwd
    ms and the median, min and max over the rounds of vsa ms / its ms in the same round."""
    from vsagen.kernels.coarse import coarse_stage

    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets_i32
    top_k = ref.top_k_from_sparsity(sparsity, layout.num_tiles)
    x = make_inputs(shape, seed=1)
    leaves = [t.detach().clone().requires_grad_(True) for t in x]
    do = torch.randn(x[0].shape, generator=torch.Generator(device="cuda").manual_seed(2), device="cuda",
                     dtype=x[0].dtype)
    sel = coarse_stage(x[0], x[1], off, top_k, tuning=variants["vsa"])
    calls = {n: make_calls(x, leaves, do, sel, off, top_k, t, False) for n, t in variants.items()}
    for _, _, fwd_bwd in calls.values():  # compile everything first
        fwd_bwd()
    names = list(calls)
    ms = {n: {"fwd": [], "fwd_bwd": []} for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            ms[n]["fwd"].append(bench(calls[n][1]))
            ms[n]["fwd_bwd"].append(bench(calls[n][2]))
    lines = [f"\n### interleaved, {shape.name}, {rounds} rounds",
             "| variant | fwd ms (median) | fwd vs vsa (median [min, max]) | fwd+bwd ms (median) | "
             "fwd+bwd vs vsa (median [min, max]) |", "|---|---|---|---|---|"]

    def median(v):
        return sorted(v)[len(v) // 2]

    for n in names:
        cells = [n]
        for kind in ("fwd", "fwd_bwd"):
            ratio = [b / a for a, b in zip(ms[n][kind], ms["vsa"][kind])]
            cells += [f"{median(ms[n][kind]):.3f}", f"{median(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}]"]
        lines.append("| " + " | ".join(cells) + " |")
    del x, leaves, do, sel, calls
    torch.cuda.empty_cache()
    return lines


def fmt(v, spec: str) -> str:
    """v formatted by spec, "-" for None."""
    return "-" if v is None else format(v, spec)


def print_table(info: dict, rows: list[dict]) -> None:
    """One shape's markdown table."""
    print(f"\n### {info['name']} (cuDNN fwd {fmt(info['cudnn']['fwd_ms'], '.3f')} ms, "
          f"fwd+bwd {fmt(info['cudnn']['fwd_bwd_ms'], '.3f')} ms)")
    print("| variant | fwd ms | fwd vs vsa | fwd x cuDNN | fwd+bwd ms | fwd+bwd vs vsa | fwd+bwd x cuDNN | "
          "max rel L2 | status |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = f"whole {r['variant']} (coarse + fine)" if r["scope"] == "whole" else r["variant"]
        print(f"| {name} | {fmt(r['fwd_ms'], '.3f')} | {fmt(r['fwd_vs_vsa'], '.3f')} | "
              f"{fmt(r['fwd_x_cudnn'], '.2f')} | {fmt(r['fwd_bwd_ms'], '.3f')} | {fmt(r['fwd_bwd_vs_vsa'], '.3f')} | "
              f"{fmt(r['fwd_bwd_x_cudnn'], '.2f')} | {fmt(r['max_rel_l2'], '.1e')} | {r['status']} |")


def summarize(rows: list[dict], shapes: list[str]) -> list[str]:
    """Per change and pass: the best variant (geometric mean of vs vsa over the shapes, ok rows only) and whether
    it beats vsa by more than 1% at every shape; then the baseline's repeat spread."""
    fine = {(r["shape"], r["variant"]): r for r in rows if r["scope"] == "fine"}
    lines = []

    def ratios(name: str, kind: str, over: str = "vsa") -> list[float] | None:
        got = []
        for s in shapes:
            r, b = fine.get((s, name)), fine.get((s, over))
            if not r or not b or r["status"] != "ok" or not r[f"{kind}_ms"] or not b[f"{kind}_ms"]:
                return None
            got.append(b[f"{kind}_ms"] / r[f"{kind}_ms"])
        return got

    def verdict(label: str, cands, kind: str, over: str = "vsa") -> str:
        scored = [(math.prod(rs) ** (1 / len(rs)), n, rs) for n in cands if (rs := ratios(n, kind, over))]
        if not scored:
            return f"  {label}: no variant of it ran ok at every shape (or none was selected)"
        _, best, rs = max(scored)
        per = ", ".join(f"{s} {x:.3f}x" for s, x in zip(shapes, rs))
        yes = all(x > MARGIN for x in rs)
        return (f"  {label}: best '{best}' ({per}) -> beats {over} by >1% at all {len(shapes)} shapes: "
                f"{'yes' if yes else 'no'}")

    for change, names in CHANGES.items():
        lines.append(change)
        for kind, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
            lines.append(verdict(label, names, kind))
            if change.startswith("change 2"):
                lines.append(verdict(f"{label}, hint over its no-tma control", names[2:], kind, "no-tma"))
    for kind, label in (("fwd", "fwd"), ("fwd_bwd", "fwd+bwd")):
        rs = ratios("vsa again", kind)
        if rs:
            lines.append(f"noise, {label}: vsa ms / the same tuning's ms again at the shape's end: "
                         + ", ".join(f"{s} {x:.3f}x" for s, x in zip(shapes, rs)))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.3b,5b,14b", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--variants", default=None, help="comma list of variant names (default: all; vsa always runs)")
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--warmup-ms", type=float, default=50)
    ap.add_argument("--rep-ms", type=float, default=300)
    ap.add_argument("--json", default=None, help="write all numbers here (rewritten after each shape)")
    ap.add_argument("--dry-run", action="store_true", help="print the variants and shapes; no GPU needed")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="instead of the table: time the chosen variants in ROUNDS interleaved rounds per shape")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    if bad := [s for s in shapes if s not in SHAPES]:
        ap.error(f"unknown shapes {bad}; known: {list(SHAPES)}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    variants = build_variants(device)
    if args.variants:
        chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
        if bad := [v for v in chosen if v not in variants]:
            ap.error(f"unknown variants {bad}; known: {list(variants)}")
        variants = {n: t for n, t in variants.items() if n == "vsa" or n in chosen}
    import triton

    gpu = torch.cuda.get_device_name() if cuda else "none (CPU)"
    print(f"{gpu} torch {torch.__version__} triton {triton.__version__} sparsity {args.sparsity} "
          f"warmup {args.warmup_ms} ms rep {args.rep_ms} ms", flush=True)
    print(f"vsa ({device.type}): {variants['vsa']}")
    for name, t in variants.items():
        print(f"  {name}: {differences(t, variants['vsa'])}")
    if args.dry_run or not cuda:
        for key in shapes:
            n = tile_layout(SHAPES[key].grid, device="cpu").num_tiles
            print(f"{key}: {SHAPES[key].name} S={SHAPES[key].tokens} H={SHAPES[key].heads} tiles={n} "
                  f"top_k={ref.top_k_from_sparsity(args.sparsity, n)}")
        if not args.dry_run:
            sys.exit("no CUDA device: only --dry-run runs here")
        return
    report = {"meta": {"torch": torch.__version__, "triton": triton.__version__, "gpu": gpu,
                       "date": datetime.datetime.now().isoformat(timespec="seconds"), "sparsity": args.sparsity,
                       "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "fail_rel_l2": FAIL_REL_L2},
              "tunings": {n: dataclasses.asdict(t) for n, t in variants.items()}, "shapes": [], "rows": []}

    def bench(fn) -> float:
        return bench_ms(fn, device="cuda", warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)

    start = time.perf_counter()
    if args.interleave:
        lines = []
        for key in shapes:
            lines += interleaved(key, SHAPES[key], args.sparsity, variants, args.interleave, bench)
            print("\n".join(lines[-len(variants) - 3:]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(report, interleaved=lines), f, indent=1)
        return
    for key in shapes:
        info, rows = run_shape(key, SHAPES[key], args.sparsity, variants, bench)
        report["shapes"].append(info)
        report["rows"] += rows
        print_table(info, rows)
        print(f"({time.perf_counter() - start:.0f} s so far)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    report["summary"] = summarize(report["rows"], shapes)
    print("\n## Summary (vs vsa = vsa ms / variant ms; >1 is faster)")
    print("\n".join(report["summary"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
