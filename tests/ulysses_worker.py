"""The gloo workloads of tests/attention/test_ulysses_attention.py (`attention_workload`),
tests/parallel/test_cfg.py (`cfg_workload`) and tests/parallel/test_ulysses.py (`cp_workload`), and `gloo_runs`, the
session fixture (imported by conftest) that runs those of the collected files once, in sequence, on ONE pair of
spawned gloo processes (`spawn`, `gloo_worker`; the processes import this module through PYTHONPATH; not a test).
Each file spawned its own pair before (7-14 s each on the 2-core machine, its workload included; the unmarked
attention file once in each pytest-xdist worker): two fresh processes importing torch and diffusers. The three files
now share the xdist group "gloo" (tests/scheduling.py), so one pytest-xdist worker runs them all and spawns once."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DEADLINE_S = 240  # the three workloads together (under a minute); a hang fails their tests, not the suite
MEET_S = 60  # how long a rank that ended a workload waits for its peer to end it (the ranks differ by seconds)


# backends with a larger VSA cube than the default 4x4x4 (issue 33), beside every registered backend
TILE_CASES = ("vsa:tile=4x4x8", "sla-star:tile=4x8x8")

# The workloads in the order each process runs them: {name: (its JSON files' prefix, the test file that reads them)}.
# `cp` last: it reports one accelerator to torch (diffusers divides by the count) and leaves diffusers' device mesh.
WORKLOADS = {"attention": ("rank", "attention/test_ulysses_attention.py"),
             "cfg": ("cfg", "parallel/test_cfg.py"),
             "cp": ("cp", "parallel/test_ulysses.py")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class GlooRuns:
    """The results of one `spawn`: call it with a workload's name for each rank's results (out/<prefix><rank>.json).

    Attributes:
        out: the folder the ranks wrote to.
        names: the workloads that ran.
        problem: why the processes did not both finish (the deadline passed, a rank died), else None.
    """

    out: Path
    names: tuple[str, ...]
    problem: str | None

    def __call__(self, name: str) -> list[dict]:
        """Each rank's results of workload `name` (a dict; "error": what it raised, if it did); fails the calling
        test where a rank wrote none (the workload did not run, or did not finish: `problem`)."""
        if name not in self.names:
            pytest.fail(f"the gloo workload {name!r} did not run: its test file {WORKLOADS[name][1]} was not collected")
        paths = [self.out / f"{WORKLOADS[name][0]}{r}.json" for r in range(2)]
        missing = [p.name for p in paths if not p.exists()]
        if missing:
            pytest.fail(f"the gloo workers wrote no {', '.join(missing)}: {self.problem or 'no problem reported'}")
        return [json.loads(p.read_text()) for p in paths]


@pytest.fixture(scope="session")
def gloo_runs(request, tmp_path_factory, vsagen_cache) -> GlooRuns:
    """The workloads (`WORKLOADS`) of the test files this session collected, run once on 2 spawned gloo processes.
    The tiny checkpoints that `cfg_workload` loads are built first, before the processes start (vsagen.models.tiny
    refuses to build under a process group)."""
    paths = {item.path for item in request.session.items}
    names = tuple(n for n, (_, file) in WORKLOADS.items() if HERE / file in paths)
    if "cfg" in names:
        request.getfixturevalue("tiny_dir")
        request.getfixturevalue("a14b_dir")
    out = tmp_path_factory.mktemp("gloo")
    return GlooRuns(out, names, spawn(names, out) if names else None)


def spawn(names: tuple[str, ...], out: Path) -> str | None:
    """Run the workloads `names` (`WORKLOADS`' order) on 2 spawned gloo processes (`gloo_worker`), each rank writing
    each workload's results to out/<prefix><rank>.json. Returns None when both processes finished, else why not:
    the deadline (DEADLINE_S) passed (both are then terminated) or a rank died; the results written until then
    stay."""
    import time

    import torch.multiprocessing as mp

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent)] + ([old] if old else []))
    try:
        ctx = mp.start_processes(gloo_worker,
                                 args=(2, _free_port(), str(out), names), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + DEADLINE_S
        while not ctx.join(timeout=5):  # False until every process has exited (it returns at each exit)
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.terminate()
                return f"the gloo workers did not finish within {DEADLINE_S} s"
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:  # a rank ended otherwise than by _leave
        return f"a gloo worker died: {e}"
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return None


def gloo_worker(rank: int, world: int, port: int, out_dir: str, names: tuple[str, ...]) -> None:
    """Rank `rank` of `world`: join one gloo process group, run the workloads `names` in it one after another (each
    fills its results; what one raises goes to its "error", with the traceback on stderr), write each one's results
    to out_dir/<prefix><rank>.json as it ends and meet the peer there (`_meet`), then leave (`_leave`). A rank whose
    peer does not come (the peer waits in a collective that this rank, having failed before it, will never join)
    writes the later workloads as not run and exits at once, which fails the peer's collective (the connection
    closed) instead of leaving both to the deadline."""
    import traceback

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    for i, name in enumerate(names):
        res: dict = {}
        try:
            globals()[f"{name}_workload"](rank, world, out_dir, res)
        except Exception as e:  # noqa: BLE001 - the tests print it instead of a KeyError
            res["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()  # to the first test's captured stderr
        _write(res, out_dir, name, rank)
        if not _meet(store, name, rank, world):
            for later in names[i + 1:]:
                _write({"error": f"not run: rank {rank} and its peer did not both end {name!r}"}, out_dir, later, rank)
                with contextlib.suppress(Exception):  # the store is rank 0's: gone with it
                    store.set(f"{later}/{rank}", "left")
            sys.stdout.flush()
            os._exit(0)
    _leave()


def _write(res: dict, out_dir: str, name: str, rank: int) -> None:
    """Write rank `rank`'s results of workload `name` to out_dir/<prefix><rank>.json, whole or not at all (the
    deadline may end the process)."""
    path = os.path.join(out_dir, f"{WORKLOADS[name][0]}{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(res, f)
    os.replace(path + ".tmp", path)


def _meet(store, name: str, rank: int, world: int) -> bool:
    """Tell the peers through the process group's TCP store (never through a collective, which a peer stuck in
    another one would take for its own) that this rank ended workload `name`, and wait up to MEET_S for every rank
    to say so. False where one did not, or said it left, or the store is gone (rank 0 left)."""
    from datetime import timedelta

    keys = [f"{name}/{r}" for r in range(world)]
    try:
        store.set(keys[rank], "ended")
        store.wait(keys, timedelta(seconds=MEET_S))
        return all(store.get(k) == b"ended" for k in keys)
    except Exception:  # noqa: BLE001 - a timeout or a store gone: the peer is not there
        return False


def _leave() -> None:
    """Wait for the peer and exit with os._exit: gloo's teardown after destroy_process_group aborted a rank now and
    then ("terminate called without an active exception", SIGABRT: CI, 2026-12-03), the device mesh's too."""
    import torch.distributed as dist

    try:  # neither rank leaves while the other still sets up groups (a peer gone mid-setup resets its sockets)
        dist.barrier()
    except Exception:  # noqa: BLE001 - the results are written; the tests read them
        pass
    sys.stdout.flush()
    os._exit(0)


def attention_workload(rank: int, world: int, out_dir: str, res: dict) -> None:
    """Rank `rank` of `world` (the gloo group joined): the exchanges against slicing, then every registered backend
    (torch implementations) under Ulysses on fresh random inputs with partial tiles, against the same backend run on
    the whole sequence in this process, forward and backward; fills `res` with {case: max abs difference} and the
    timer's regions of one call ("all_to_all regions")."""
    import torch
    import torch.distributed as dist

    from vsagen.attention import backend_class, backend_names, make_backend
    from vsagen.attention.base import AttnContext
    from vsagen.layout import tile_layout
    from vsagen.attention.ulysses_attention import UlyssesAttention, heads_to_seq, seq_to_heads
    from vsagen.models.presets import load_preset
    from vsagen.timing import NullTimer

    group = dist.group.WORLD
    g = torch.Generator().manual_seed(5)  # the same inputs on every rank
    x = torch.randn(2, 12, 4, 8, generator=g)
    s = x.shape[1] // world
    h = seq_to_heads(x[:, rank * s:(rank + 1) * s], group)
    hl = x.shape[2] // world
    res["seq_to_heads"] = float((h - x[:, :, rank * hl:(rank + 1) * hl]).abs().max())
    res["round_trip"] = float((heads_to_seq(h, group) - x[:, rank * s:(rank + 1) * s]).abs().max())

    grid = (5, 6, 10)  # partial tiles in t and h; the tiny preset's pattern file's grid (2 heads)
    n_tok = tile_layout(grid).num_tokens
    for case in [*backend_names(), *TILE_CASES]:
        name, _, tile = case.partition(":tile=")  # the TILE_CASES: a larger cube, partial in every dimension
        opts = {}
        if "impl" in backend_class(name).Options.__dataclass_fields__:
            opts["impl"] = "torch"
        if name == "sparse-vdit":
            opts["patterns"] = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
        if tile:
            opts["tile"] = tile
        heads = 2 if name == "sparse-vdit" else 4
        be = make_backend(name, **opts)
        lay = tile_layout(grid, be.tile) if be.tiled else None
        q, k, v, do = (torch.randn(2, n_tok, heads, 8, generator=g) for _ in range(4))
        ctx = AttnContext(layout=lay, layer=0, expert="transformer", timer=NullTimer())
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        ref = be(qf, kf, vf, ctx)
        ref_grads = torch.autograd.grad(ref, (qf, kf, vf), do)
        s = n_tok // world
        chunk = slice(rank * s, (rank + 1) * s)
        ql, kl, vl = (t[:, chunk].clone().requires_grad_() for t in (q, k, v))
        got = UlyssesAttention(be, group)(ql, kl, vl, ctx)
        grads = torch.autograd.grad(got, (ql, kl, vl), do[:, chunk])
        res[f"{case} fwd"] = float((got - ref[:, chunk]).abs().max())
        if name == "full":  # the negative control: each rank attending its own shard only
            with torch.no_grad():
                res["shard only"] = float((be(ql, kl, vl, ctx) - ref[:, chunk]).abs().max())
        res[f"{case} bwd"] = max(float((a - b[:, chunk]).abs().max()) for a, b in zip(grads, ref_grads))
    from vsagen.timing import Timer

    timer = Timer("cpu")  # the exchanges are timed as "all_to_all" (the disabled timers above recorded nothing)
    with torch.no_grad():
        UlyssesAttention(make_backend("full"), group)(q[:, chunk], k[:, chunk], v[:, chunk],
                                                      AttnContext(layout=None, layer=0, expert=None, timer=timer))
    res["all_to_all regions"] = [n for n, _, _ in timer.finish()]


def cp_workload(rank: int, world: int, out_dir: str, res: dict) -> None:
    """Rank `rank` of `world` (the gloo group joined): the tiny Wan transformer patched by `vsagen.apply`, then
    diffusers' `enable_parallelism` with Ulysses and vsagen's plan (`context_parallel_plan`: Wan's without the RoPE
    split), against the same transformer in one process, for every registered backend (torch implementations); and
    vsagen applied after `enable_parallelism` (its processors then lack the parallel config) must be refused.
    Fills `res` with {case: max abs difference or message}. Runs last (`WORKLOADS`): it leaves torch reporting one
    accelerator and diffusers' device meshes behind."""
    import torch
    import torch.distributed as dist
    from conftest import make_transformer
    from diffusers import ContextParallelConfig

    import vsagen
    from vsagen.attention import backend_class, backend_names
    from vsagen.parallel.ulysses import context_parallel_plan
    from vsagen.models.presets import load_preset

    torch.accelerator.device_count = lambda: 1  # diffusers divides by it; zero on a CPU-only machine

    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 16, 5, 12, 20, generator=g)  # grid 5x6x10: partial tiles, 300 tokens
    text = torch.randn(1, 8, 32, generator=g)
    args = dict(hidden_states=x, timestep=torch.tensor([700.0]), encoder_hidden_states=text, return_dict=False)
    for case in [*backend_names(), *TILE_CASES]:
        name, _, tile = case.partition(":tile=")
        opts = {"impl": "torch"} if "impl" in backend_class(name).Options.__dataclass_fields__ else {}
        if name == "sparse-vdit":
            opts["patterns"] = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
        if tile:
            opts["tile"] = tile
        t = make_transformer()
        with vsagen.apply(t, name, fused_prologue="off", **opts), torch.no_grad():
            ref = t(**args)[0]
        vsagen.apply(t, name, fused_prologue="off", **opts)
        t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world), cp_plan=context_parallel_plan(t))
        with torch.no_grad():
            got = t(**args)[0]
        res[case] = float((got - ref).abs().max())
    dist.barrier()  # both ranks done with the runs above before new groups are set up
    try:
        t = make_transformer()
        t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world),
                             cp_plan=context_parallel_plan(t))
    except Exception as e:  # noqa: BLE001 - the test shows what was raised
        res["late apply"] = f"setup failed: {type(e).__name__}: {e}"
    else:
        vsagen.apply(t, "full", fused_prologue="off")
        try:
            with torch.no_grad():
                t(**args)
            res["late apply"] = "ran"
        except Exception as e:  # noqa: BLE001 - the test reads what was raised
            res["late apply"] = f"{type(e).__name__}: {e}"


# every registered backend on the tiny model (torch impls; sparse-vdit with the tiny preset's pattern file)
CFG_TINY_BACKENDS = ("full", "vsa:impl=torch", "rocm-vsa:impl=torch", "sla-star:impl=torch", "sla:impl=torch",
                     "sparse-vdit:impl=torch")


def cfg_workload(rank: int, world: int, out_dir: str, res: dict) -> None:
    """Rank `rank` of `world` (the gloo group joined) of a CFG-parallel run through vsagen's orchestrator
    (`Session.run` of a request with cfg_parallel): for the tiny model with every registered backend
    (`CFG_TINY_BACKENDS`; its 5x6x10 grid has partial tiles) and the two-expert tiny-a14b with `full`, the same
    session first runs in one process (the reference), then CFG parallel; then `profile_dit` of the tiny model with
    `full` and the overhead rows under CFG parallel. Fills `res` with {case: max abs difference of the final
    latents, DiT forwards per expert, whether the exchange was timed; "profile": the report as JSON on rank 0, None
    on rank 1}. `out_dir`: the folder of the requests' output paths (Session.run writes no video)."""
    import dataclasses

    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.pipeline import Session
    from vsagen.timing import TimingReport

    for model, attns in (("tiny", CFG_TINY_BACKENDS), ("tiny-a14b", ("full",))):
        cfg = resolve("a fox", model=model, device="cpu", steps=2, cfg_parallel=True,
                      out=Path(out_dir) / f"{rank}.mp4")
        backends = [resolve("a fox", model=model, attn=a, device="cpu").backend.build() for a in attns]
        session = Session.load(dataclasses.replace(cfg, cfg_parallel=False), backends)  # loaded once
        plan = session.plan(cfg.tile_fit)
        for attn, backend in zip(attns, backends):
            session.request = dataclasses.replace(cfg, cfg_parallel=False)
            ref = session.run(backend, plan)
            session.request = cfg
            got = session.run(backend, plan)
            report = TimingReport.from_records(got.records, "cpu")
            res[f"{model} {attn}"] = {"diff": float((got.latents - ref.latents).abs().max()),
                                      "grid": list(plan.denoise_grid),
                                      "forwards": report.dit_forwards_by_expert,
                                      "exchange timed": report.cfg_exchange_s > 0}
    from vsagen.commands.profile import profile_dit
    from vsagen.commands.profile_config import resolve_profile

    # vsagen profile --cfg-parallel, its overhead rows included: rank 0's report, None elsewhere
    report = profile_dit(resolve_profile(model="tiny", attn="full", device="cpu", steps=1, warmup=0,
                                         cfg_parallel=True), writer=rank == 0)
    res["profile"] = None if report is None else report.to_dict()
