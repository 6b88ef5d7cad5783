"""Region timers and the timing breakdown report.

On CUDA every region is a pair of CUDA events recorded on the current stream; nothing synchronizes until
`Timer.finish`, which synchronizes once and reads all the events. On CPU regions use `time.perf_counter`
(CPU work is synchronous). Regions may nest; the report adds regions of the same name. A region opened with
`region(name, apart_from=outer)` is carved out of the open region `outer`: `outer` is closed while it runs and
reopened after it, so its time is recorded once, under `name`, and `outer`'s pieces add up to the rest (nothing
is subtracted afterwards).

Region names used by vsagen: "total", "text_encode", "image_encode" (image to video: diffusers' `encode_image`,
the CLIP image encoder), "condition_encode" (image to video: diffusers' `prepare_latents`, i.e. the VAE encode of
the condition video plus the initial noise), both carved out of "denoise" (the diffusers pipeline call: the
sampling loop and its set-up), "dit" (one transformer forward; tagged with the denoising step), "dit/<expert>"
(the same forward again, named by the pipeline component that ran it: "transformer", or "transformer_2" for the
second expert of a two-expert pipeline), "attn1" (the whole self-attention module: projections, norms, RoPE,
backend, output projection), "self_attention" (the backend call alone) and "self_attention/<stage>" for the
stages a backend reports (e.g. VSA's "coarse" and "fine"), "vae_decode". Multi-process runs (`vsagen.parallel`) add
"all_to_all" (Ulysses' sequence <-> heads exchanges, inside "self_attention") and "cfg_exchange" (CFG parallel: the
exchange of the two branches' predictions, inside "dit"); `rank_row` / `rank_stats` turn each rank's report into
the per-rank rows rank 0 reports.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch


# The run JSON's timing names of the self-attention that said less than what they time (`TimingReport.to_dict`):
# old name -> new name. Both are written for one release (the old ones go in the next); the JSON lists this map as
# "deprecated_aliases".
DEPRECATED_ALIASES = {"attn1_s": "attn1_module_s", "self_attention_s": "attention_backend_s",
                      "self_attention_stages_s": "attention_backend_stages_s"}


class Timer:
    """Collects named regions; `finish()` turns them into seconds.

    `step` is the current denoising step (-1 outside the loop); each region remembers it.
    `enabled` False makes every region a no-op (used for warm-up runs, which are reported apart).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.step = -1
        self.enabled = True
        self._records: list[tuple[str, int, Any, Any]] = []
        self._open: dict[int, tuple[str, int, Any]] = {}
        self._discarded: set[int] = set()
        self._next_token = 0

    def _now(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def start(self, name: str) -> int | None:
        """Open a region; returns a token for `stop` (None when disabled, and while torch.compile traces: regions
        inside a compiled graph are not timed and leave nothing in it, so tracing never breaks here; see
        `TimingReport` for how the report shows them)."""
        if torch.compiler.is_compiling() or not self.enabled:  # compiling first: no guard on `enabled`
            return None
        token = self._next_token
        self._next_token += 1
        self._open[token] = (name, self.step, self._now())
        return token

    def stop(self, token: int | None, rename: str | None = None) -> None:
        """Close the region opened by `start`; with `rename` it is recorded under that name (a region whose kind is
        known only at its end: a DiT forward a cache computed or reused, `vsagen.cache.install`)."""
        if token is None:
            return
        if token in self._discarded:
            self._discarded.discard(token)
            return
        name, step, begin = self._open.pop(token)
        self._records.append((rename or name, step, begin, self._now()))

    def discard(self, name: str) -> None:
        """Forget the open regions called `name` or `name/...`: their `stop` records nothing. For a region whose body
        turned out not to run (a CFG-parallel transformer call served by the exchange of the pair's predictions,
        `vsagen.parallel.cfg`: no DiT forward ran, so no "dit" region)."""
        for token in [t for t, (n, _, _) in self._open.items() if n == name or n.startswith(name + "/")]:
            del self._open[token]
            self._discarded.add(token)

    def region(self, name: str, *, apart_from: str | None = None) -> AbstractContextManager[None]:
        """Time the body as region `name`.

        With `apart_from`, every open region of that name is closed for the duration of the body (the piece so
        far is recorded) and reopened right after it, so the body's time appears under `name` only; the report
        adds the pieces of the enclosing region. Regions opened inside the body nest as usual.

        Disabled, or while torch.compile traces, this is a `contextlib.nullcontext` (dynamo traces it as
        nothing, without a graph break; compiling is checked first, so the graph does not guard on `enabled`).
        """
        if torch.compiler.is_compiling() or not self.enabled:
            return nullcontext()
        return self._region(name, apart_from)

    @contextmanager
    def _region(self, name: str, apart_from: str | None) -> Iterator[None]:
        """`region` while timing."""
        paused = self._pause(apart_from) if apart_from is not None else []
        token = self.start(name)
        try:
            yield
        finally:
            self.stop(token)
            self._resume(paused)

    def _pause(self, name: str) -> list[tuple[int, str, int]]:
        """Close the open regions called `name` (recording the piece so far); returns what `_resume` reopens."""
        paused = [(tok, n, step) for tok, (n, step, _) in self._open.items() if n == name]
        if paused:
            now = self._now()
            for tok, n, step in paused:
                _, _, begin = self._open.pop(tok)
                self._records.append((n, step, begin, now))
        return paused

    def _resume(self, paused: list[tuple[int, str, int]]) -> None:
        """Reopen regions closed by `_pause` under their old tokens (so their owners' `stop` still works)."""
        if paused:
            now = self._now()
            for tok, n, step in paused:
                self._open[tok] = (n, step, now)

    def finish(self) -> list[tuple[str, int, float]]:
        """Synchronize once (CUDA) and return (name, step, seconds) for every closed region."""
        if self.cuda:
            torch.cuda.synchronize()
            out = [(n, s, b.elapsed_time(e) / 1000.0) for n, s, b, e in self._records]
        else:
            out = [(n, s, e - b) for n, s, b, e in self._records]
        return out


class NullTimer(Timer):
    """A timer that records nothing (for code paths called outside a run)."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.enabled = False


@dataclass
class TimingReport:
    """Where the time of one run went (seconds).

    `dit_s` sums every transformer forward (two per step with CFG), over all experts; `dit_by_expert_s` and
    `dit_forwards_by_expert` split it by the pipeline component that ran ("transformer", and "transformer_2" in
    two-expert pipelines; their sums are `dit_s` and `dit_forwards`); `self_attention_s` sums the attention
    backend calls inside them (`self_attention_stages_s` splits them by the stages the backend reports);
    `attn1_s` is the whole self-attention module including projections, q/k norms, RoPE and output
    projection. `attention_share_of_dit` = self_attention_s / dit_s. `total_s` runs from the text encoder
    to the end of the VAE decode; `load_s` and `write_s` (host clock) are outside it.

    The decode and the mp4 write (`t2v` / `i2v`: `vsagen.decode.stream`, `vsagen.media.video.encode_mp4_stream`) run as
    a stream, the encode in a thread of its own while the next frames decode: `vae_decode_s` is then the decode's own
    time (each latent frame's decode and its uint8 frames), `write_s` the encoder's (frames to ffmpeg, its finish),
    `decode_write_s` the wall time of the two together and `overlap_s` = vae_decode_s + write_s - decode_write_s (both
    at once); `wait_s` runs from the text encoder to the mp4 written (total_s - vae_decode_s + decode_write_s), what the
    user waits for; `decode_share_of_wait` / `write_share_of_wait` in the JSON. Without a stream (compare, profile)
    decode_write_s and overlap_s are 0 and wait_s is total_s + write_s.

    Under `--compile` the regions compiled into the transformer blocks' graphs cannot be timed (no timer runs
    inside a compiled graph): `attn1_s` always, and with the attention backend inside the graphs (no graph
    breaks) also `self_attention_s` and `attention_share_of_dit`. Those are None (null in the JSON, "not
    timed" in the table), never a 0 that would read as "took no time"; `self_attention_stages_s` is then empty.

    `vsagen.apply`'s report (`AppliedBackend.report`) times the DiT only: the regions of the pipeline call around it
    (total_s, text_encode_s, denoise_s, vae_decode_s, image_encode_s, condition_encode_s; and so wait_s) are None
    there, null in the JSON; the commands' reports time them all.

    Image to video only (0 otherwise): `image_encode_s` is diffusers' `encode_image` (CLIP image encoder; Wan2.1
    I2V) and `condition_encode_s` its `prepare_latents` (VAE encode of the condition video and the initial noise).
    Both are measured apart from `denoise_s` (see `Timer.region(apart_from=...)`), so text_encode_s +
    image_encode_s + condition_encode_s + denoise_s + vae_decode_s <= total_s: no region is counted twice.
    With `--offload`, weight transfers are inside the regions that trigger them (the DiT forwards, the encoders).

    Multi-process runs: `all_to_all_s` is the time of this rank's Ulysses exchanges (part of `self_attention_s`),
    `cfg_exchange_s` that of its CFG-parallel exchanges (part of `dit_s`); `ranks` holds every rank's `rank_row`
    (rank 0's report; empty in a one-process run), and `to_dict` adds their max and mean (`rank_stats`).

    `warmup_s` is the untimed warm-up (not in `total_s`); `warmup_parts_s` says where it went (`WarmUp.parts`: the
    warm-up steps, torch.compile's compilation inside them, the decoder's first call), empty without a warm-up.

    Names in the JSON (`to_dict`): the fields that time the self-attention carry names that say what they time,
    `attn1_module_s` (the whole attn1 module, the table's "self-attention module (attn1)" row),
    `attention_backend_s` (the backend call alone, the table's "attention backend" row) and
    `attention_backend_stages_s` (its stages). The older names, `attn1_s`, `self_attention_s` (which read as the
    whole self-attention but time the backend alone) and `self_attention_stages_s`, hold the same values for one
    more release; the JSON lists them under "deprecated_aliases" (`DEPRECATED_ALIASES`: old name -> new name).
    In Python the fields keep their old names; the new ones are properties.
    """

    device: str
    total_s: float | None
    text_encode_s: float | None
    denoise_s: float | None
    dit_s: float
    dit_forwards: int
    dit_per_step_s: list[float]
    attn1_s: float | None
    self_attention_s: float | None
    self_attention_stages_s: dict[str, float]
    vae_decode_s: float | None
    attention_share_of_dit: float | None
    image_encode_s: float | None = 0.0
    condition_encode_s: float | None = 0.0
    load_s: float = 0.0
    write_s: float = 0.0
    decode_write_s: float = 0.0
    warmup_s: float = 0.0
    warmup_parts_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dit_by_expert_s: dict[str, float] = field(default_factory=dict)
    dit_forwards_by_expert: dict[str, int] = field(default_factory=dict)
    all_to_all_s: float = 0.0
    cfg_exchange_s: float = 0.0
    ranks: list[dict[str, Any]] = field(default_factory=list)
    # a step cache (`vsagen.cache.install`): the DiT forwards it computed in full and those it served from its cache,
    # their seconds, and the steps with a reused forward; without a cache every forward is computed
    dit_computed_forwards: int = 0
    dit_reused_forwards: int = 0
    dit_computed_s: float = 0.0
    dit_reused_s: float = 0.0
    dit_reused_steps: list[int] = field(default_factory=list)

    @classmethod
    def from_records(cls, records: list[tuple[str, int, float]], device: str, *, untimed: tuple[str, ...] = (),
                     **extra: Any) -> "TimingReport":
        """Aggregate `Timer.finish()` records.

        Args:
            records: (name, step, seconds) from `Timer.finish`.
            device: "cuda" or "cpu".
            untimed: regions that ran inside compiled graphs, "attn1" and / or "self_attention": their fields
                (and, for "self_attention", the stages and the attention share) are None instead of 0.
            **extra: the remaining fields (load_s, warmup_s, notes, ...).

        Raises:
            ValueError: an `untimed` name other than "attn1" or "self_attention".
        """
        if not set(untimed) <= {"attn1", "self_attention"}:
            raise ValueError(f"untimed regions must be 'attn1' or 'self_attention', got {untimed}")
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        per_step: dict[int, float] = defaultdict(float)
        for name, step, sec in records:
            total[name] += sec
            count[name] += 1
            if name == "dit":
                per_step[step] += sec
        attention_timed = "self_attention" not in untimed
        stages = {n.split("/", 1)[1]: v for n, v in total.items()
                  if n.startswith("self_attention/") and attention_timed}
        dit = total["dit"]
        experts = sorted(n.split("/", 1)[1] for n in total if n.startswith("dit/"))
        extra.setdefault("dit_by_expert_s", {e: total[f"dit/{e}"] for e in experts})
        extra.setdefault("dit_forwards_by_expert", {e: count[f"dit/{e}"] for e in experts})
        extra.setdefault("all_to_all_s", total["all_to_all"])
        extra.setdefault("cfg_exchange_s", total["cfg_exchange"])
        cached = count["dit_computed"] + count["dit_reused"] > 0
        extra.setdefault("dit_computed_forwards", count["dit_computed"] if cached else count["dit"])
        extra.setdefault("dit_reused_forwards", count["dit_reused"])
        extra.setdefault("dit_computed_s", total["dit_computed"] if cached else total["dit"])
        extra.setdefault("dit_reused_s", total["dit_reused"])
        extra.setdefault("dit_reused_steps", sorted({s for n, s, _ in records if n == "dit_reused"}))
        return cls(
            device=device,
            total_s=total["total"], text_encode_s=total["text_encode"], denoise_s=total["denoise"],
            dit_s=dit, dit_forwards=count["dit"],
            dit_per_step_s=[per_step[s] for s in sorted(per_step)],
            attn1_s=None if "attn1" in untimed else total["attn1"],
            self_attention_s=total["self_attention"] if attention_timed else None, self_attention_stages_s=stages,
            vae_decode_s=total["vae_decode"],
            image_encode_s=total["image_encode"], condition_encode_s=total["condition_encode"],
            attention_share_of_dit=((total["self_attention"] / dit) if dit > 0 else 0.0) if attention_timed else None,
            **extra,
        )

    @property
    def overlap_s(self) -> float:
        """Seconds the streamed decode and the mp4 encode ran at once (0 without a stream)."""
        if not self.decode_write_s:
            return 0.0
        return max(0.0, self.vae_decode_s + self.write_s - self.decode_write_s)

    @property
    def wait_s(self) -> float | None:
        """Seconds from the text encoder to the mp4 written (see the class docstring); None without `total_s`."""
        if self.total_s is None:
            return None
        if self.decode_write_s:
            return self.total_s - self.vae_decode_s + self.decode_write_s
        return self.total_s + self.write_s

    @property
    def attn1_module_s(self) -> float | None:
        """The whole self-attention module (attn1: projections, q/k norms, RoPE, tile order, the backend, output
        projection); None where compiled (`attn1_s` under its JSON name)."""
        return self.attn1_s

    @property
    def attention_backend_s(self) -> float | None:
        """The attention backend calls alone; None where compiled (`self_attention_s` under its JSON name)."""
        return self.self_attention_s

    @property
    def attention_backend_stages_s(self) -> dict[str, float]:
        """The backend's time by the stages it reports (`self_attention_stages_s` under its JSON name)."""
        return self.self_attention_stages_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (all seconds): the fields under the names `DEPRECATED_ALIASES` maps to, each just before
        its old name (kept for one release, listed in "deprecated_aliases"); with per-rank rows, also "ranks_max"
        and "ranks_mean" (`rank_stats`)."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if key in DEPRECATED_ALIASES:
                out[DEPRECATED_ALIASES[key]] = value
            out[key] = value
        out["deprecated_aliases"] = dict(DEPRECATED_ALIASES)
        out.update(self.cache_stats())
        wait = self.wait_s
        out.update(overlap_s=self.overlap_s, wait_s=wait,
                   decode_share_of_wait=self.vae_decode_s / wait if wait and self.vae_decode_s is not None else None,
                   write_share_of_wait=self.write_s / wait if wait else None)
        if self.ranks:
            out.update(rank_stats(self.ranks))
        return out

    def cache_stats(self) -> dict[str, Any]:
        """The step cache's share of the DiT forwards: "dit_reuse_share" (reused / all forwards counted, None without
        forwards) and the mean DiT seconds of a computed and of a reused forward (None where there were none)."""
        n = self.dit_computed_forwards + self.dit_reused_forwards
        return {"dit_reuse_share": self.dit_reused_forwards / n if n else None,
                "dit_per_computed_forward_s": self.dit_computed_s / self.dit_computed_forwards
                if self.dit_computed_forwards else None,
                "dit_per_reused_forward_s": self.dit_reused_s / self.dit_reused_forwards
                if self.dit_reused_forwards else None}

    def rank_row(self, rank: int) -> dict[str, Any]:
        """This rank's line of a multi-process run's per-rank timing: {"rank", "dit_forwards", "dit_s",
        "attention_backend_s" (None where untimed; also as its deprecated alias "self_attention_s"), "all_to_all_s",
        "cfg_exchange_s"} (seconds)."""
        return {"rank": rank, "dit_forwards": self.dit_forwards, "dit_s": self.dit_s,
                "attention_backend_s": self.self_attention_s, "self_attention_s": self.self_attention_s,
                "all_to_all_s": self.all_to_all_s, "cfg_exchange_s": self.cfg_exchange_s}

    def ranks_table(self):  # -> rich.table.Table | None
        """The per-rank rows as a Rich table (rank, DiT, attention backend, all-to-all, CFG exchange; then max and
        mean over the ranks), or None in a one-process run."""
        if not self.ranks:
            return None
        from rich.table import Table

        cols = [("DiT", "dit_s"), ("attention backend", "attention_backend_s"), ("all-to-all", "all_to_all_s"),
                ("CFG exchange", "cfg_exchange_s")]
        t = Table(title="per rank (seconds; the attention backend includes the all-to-all, the DiT both)",
                  title_justify="left")
        t.add_column("rank", overflow="fold")
        for head in ["DiT forwards", *(head for head, _ in cols)]:  # too narrow a terminal folds a number, never cuts
            t.add_column(head, justify="right", overflow="fold")
        fmt = lambda v: "not timed" if v is None else f"{v:.3f}"  # noqa: E731
        for row in self.ranks:
            t.add_row(str(row["rank"]), str(row["dit_forwards"]), *(fmt(row[k]) for _, k in cols))
        stats = rank_stats(self.ranks)
        for label in ("max", "mean"):
            t.add_row(label, "", *(fmt(stats[f"ranks_{label}"][k]) for _, k in cols))
        return t

    def rich_table(self, title: str = "timing", cached: bool = False):  # -> rich.table.Table
        """Render as a Rich table: region, seconds, share of the total, share of DiT time. It fits 80 columns (and
        far fewer): where space runs short the region labels wrap (or fold), the numbers stay whole on their line.
        The DiT forwards computed and reused, and the reuse share, show where a step cache reused a forward or
        `cached` says the run had one (a cache that reused nothing: computed N, reused 0, share 0%)."""
        from rich.table import Table

        t = Table(title=title, title_justify="left")
        t.add_column("region", overflow="fold")
        for head in ("seconds", "% total", "% DiT"):
            t.add_column(head, justify="right", no_wrap=True, overflow="fold")

        def pct(x: float, of: float | None) -> str:
            return f"{100 * x / of:5.1f}" if of else "-"

        def row(name: str, sec: float | None, dit_share: bool = False) -> None:
            if sec is None:  # inside compiled graphs (see the class docstring)
                t.add_row(name, "not timed", "", "")
                return
            t.add_row(name, f"{sec:.3f}", pct(sec, self.total_s), pct(sec, self.dit_s) if dit_share else "")

        # Regions outside the transformer are absent where nobody timed them (`vsagen.apply`'s report: the pipeline
        # call is not wrapped); a real region is never exactly 0 s, so a 0 row is left out rather than shown.
        outer = bool(self.total_s)  # (None where not timed)
        if outer:
            row("text encode", self.text_encode_s)
        if self.image_encode_s:
            row("image encode (CLIP)", self.image_encode_s)
        if self.condition_encode_s:
            row("condition encode (VAE)", self.condition_encode_s)
        if outer:
            row("denoise loop", self.denoise_s)
        steps = len(self.dit_per_step_s)
        row(f"  DiT ({self.dit_forwards} forward{'s' if self.dit_forwards != 1 else ''}, {steps} "
            f"step{'s' if steps != 1 else ''})", self.dit_s, True)
        if steps:
            t.add_row("    per step (mean)", f"{self.dit_s / steps:.3f}", "", "")
        if self.dit_reused_forwards or cached:  # a step cache: what a computed and a reused forward cost
            stats = self.cache_stats()
            for what, n, sec in (("computed", self.dit_computed_forwards, self.dit_computed_s),
                                 ("reused (cache)", self.dit_reused_forwards, self.dit_reused_s)):
                row(f"    {what}: {n} forward{'s' if n != 1 else ''}", sec, True)
                per = stats["dit_per_computed_forward_s" if what == "computed" else "dit_per_reused_forward_s"]
                if per is not None:
                    t.add_row("      per forward", f"{per:.3f}", "", "")
            t.add_row(f"    reuse share {100 * (stats['dit_reuse_share'] or 0):.0f}%", "", "", "")
        if len(self.dit_by_expert_s) > 1:
            for expert, sec in self.dit_by_expert_s.items():
                n = self.dit_forwards_by_expert.get(expert, 0)
                row(f"    expert {expert} ({n} forward{'s' if n != 1 else ''})", sec, True)
        row("    self-attention module (attn1)", self.attn1_s, True)
        row("      attention backend", self.self_attention_s, True)
        for stage, sec in self.self_attention_stages_s.items():
            row(f"        {stage}", sec, True)
        if self.all_to_all_s:
            row("        all-to-all (Ulysses)", self.all_to_all_s, True)
        if self.cfg_exchange_s:
            row("    CFG exchange", self.cfg_exchange_s, True)
        wait = self.wait_s
        share = lambda x: f" ({100 * x / wait:.0f}% of the wait)" if wait and self.write_s else ""  # noqa: E731
        if outer:
            row("VAE decode" + share(self.vae_decode_s), self.vae_decode_s)
            row("total", self.total_s)
        if outer and self.write_s:
            t.add_row("mp4 encode" + share(self.write_s), f"{self.write_s:.3f}", "", "")
            if self.decode_write_s:
                t.add_row("  at once with the decode", f"{self.overlap_s:.3f}", "", "")
            t.add_row("wait: text encode to the mp4 written", f"{wait:.3f}", "", "")
        if self.load_s:
            t.add_row("(load, not in total)", f"{self.load_s:.3f}", "", "")
        if self.warmup_s:
            t.add_row("(warm-up, not in total)", f"{self.warmup_s:.3f}", "", "")
            for part, label in WARMUP_ROWS:
                if self.warmup_parts_s.get(part):
                    t.add_row(label, f"{self.warmup_parts_s[part]:.3f}", "", "")
        return t


# The warm-up's parts as table rows (`WarmUp.parts`), each shown where it is not 0.
WARMUP_ROWS = (("denoise", "  warm-up steps"), ("compile", "    of which torch.compile"),
               ("decode", "  decoder's first call"))


# The per-rank columns that `rank_stats` summarises ("self_attention_s": the deprecated alias of
# "attention_backend_s", kept for one release).
RANK_COLUMNS = ("dit_s", "attention_backend_s", "self_attention_s", "all_to_all_s", "cfg_exchange_s")


def rank_stats(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """{"ranks_max": {column: max}, "ranks_mean": {column: mean}} over the ranks' `TimingReport.rank_row`s for each
    of RANK_COLUMNS (None where no rank timed it). The slowest rank sets the pace of a multi-process run: every
    step ends in exchanges that wait for it."""
    out: dict[str, dict[str, float | None]] = {"ranks_max": {}, "ranks_mean": {}}
    for col in RANK_COLUMNS:
        values = [r[col] for r in rows if r.get(col) is not None]
        out["ranks_max"][col] = max(values) if values else None
        out["ranks_mean"][col] = sum(values) / len(values) if values else None
    return out


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile's compilation so far (Dynamo's tracing and the backend's
    compile, `torch._dynamo.utils.calculate_time_spent()["total_wall_time"]`), 0 where Dynamo was never imported
    (read without importing it). Cumulative: a stage's compile time is the difference across it."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None or not hasattr(utils, "calculate_time_spent"):
        return 0.0
    return float(utils.calculate_time_spent().get("total_wall_time", 0.0))


@dataclass
class WarmUp:
    """Where an untimed warm-up's host seconds went (`Session`'s warm-up; all 0 without one).

    Attributes:
        seconds: the whole warm-up (the steps, the decoder's first call, the wait for an idle device).
        denoise: the warm-up denoising steps (the DiT's first forwards: compilation, kernel loading, allocator).
        compile: torch.compile's compilation inside the warm-up (`compile_seconds`; part of `denoise`).
        compile_before: `compile_seconds()` when the warm-up began.
    """

    seconds: float = 0.0
    denoise: float = 0.0
    compile: float = 0.0
    compile_before: float = 0.0

    def parts(self) -> dict[str, float]:
        """{"denoise", "compile", "decode"} seconds for the run's JSON (`TimingReport.warmup_parts_s`), "decode" the
        rest of the warm-up (the decoder's first call on two latent frames); empty without a warm-up."""
        if not self.seconds:
            return {}
        return {"denoise": self.denoise, "compile": self.compile, "decode": max(0.0, self.seconds - self.denoise)}
