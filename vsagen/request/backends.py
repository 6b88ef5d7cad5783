"""The attention part of a request: `--attn` parsed once into its entries (`AttnList`, built with its option group,
`vsagen.request.options.AttentionOptions`), their specs with options filled by precedence
(`vsagen.attention.spec.spec_of`) with `--sparsity` and `--attn-impl`, and `--attn auto`'s choice."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence

from ..attention import BackendSpec, backend_class, backend_names
from ..attention.auto import AUTO, auto_choice
from ..attention.registry import named_weights_file, options_of
from ..attention.spec import (BackendEntry, check_flags_apply, check_flags_not_repeated, impls_of, parse_entry, spec_of,
                              text_options)
from ..errors import BadInput
from ..layout import covering_tile, parse_tile
from .lists import check_list

LIST_EXAMPLE = "full,vsa:sparsity=0.9"


@dataclass(frozen=True)
class AttnList:
    """`--attn` as parsed once: the text as given (stripped) and one entry per comma-separated piece, in order: a
    backend's `BackendEntry` (its name, the options it sets, typed), `auto` as an entry of that name (kept as
    written: it takes no options), or None for an empty piece. Whether a list or `auto` is taken is the command's
    (`one`, `several`), so a piece refused only by one kind of command is kept here.

    Attributes:
        text: the `--attn` text as given (`Request.attn_requested`, messages).
        entries: the pieces, parsed.
    """

    text: str
    entries: tuple[BackendEntry | None, ...]

    def one(self) -> BackendEntry:
        """The entry of a command that runs one backend (`auto` allowed, without options).

        Raises:
            BadInput: a list, `auto` with options, an empty text (an unknown name '').
        """
        if len(self.entries) > 1:
            raise BadInput(f"--attn {self.text!r}: this command runs one backend; `vsagen compare` and `vsagen "
                           "profile` run several (comma-separated)")
        entry = self.entries[0]
        if entry is None:
            raise BadInput(f"unknown --attn ''; available: {', '.join(backend_names())}")
        if entry.name == AUTO and entry.text != AUTO:
            raise BadInput(f"--attn auto takes no options (got {self.text!r}): name the backend to set its options, "
                           "e.g. --attn vsa:sparsity=0.9")
        return entry

    def several(self) -> tuple[BackendEntry, ...]:
        """The entries of a command that runs several backends (`vsagen profile`, `vsagen compare`), in order.

        Raises:
            BadInput: an empty list or entry, an entry written twice, `auto` (one backend chosen for a t2v / i2v
                run, not one of a list).
        """
        check_list(tuple(e.text if e is not None else "" for e in self.entries), self.text, "--attn", LIST_EXAMPLE)
        for entry in self.entries:
            if entry.name == AUTO:  # t2v's default, not a backend: say which names a list takes
                raise BadInput(f"--attn {self.text!r}: profile and compare run the backends named in --attn (auto "
                               "picks one for a t2v / i2v run); name them, e.g. --attn full,vsa; available: "
                               f"{', '.join(backend_names())} (see `vsagen backends`)")
        return self.entries  # type: ignore[return-value]  # no None: check_list refused empty pieces


def parse_attn(text: str) -> AttnList:
    """`--attn` text (one entry, `auto`, or a comma-separated list) as its `AttnList`: each piece's name checked
    against the registry and its options typed (`vsagen.attention.spec.parse_entry`), once.

    Raises:
        BadInput: an unknown backend name, a malformed option, an unknown key, a value not of its option's type.
    """
    entries: list[BackendEntry | None] = []
    for piece in _pieces(text):
        if not piece:
            entries.append(None)
        elif piece.split(":", 1)[0].strip() == AUTO:
            entries.append(BackendEntry(AUTO, (), piece))
        else:
            entries.append(parse_entry(piece))
    return AttnList(text, tuple(entries))


def _pieces(text: str) -> list[str]:
    """The entries of `--attn` text split at its commas, except that a piece of block indices (`29`, `0-2`) goes on
    with the entry before it: the commas of `dense_layers=0,1,29` (no backend name is a number)."""
    pieces: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        head = piece.split(":", 1)[0].replace("-", "")
        if pieces and head.isdigit() and pieces[-1].rsplit(":", 1)[-1].startswith("dense_layers="):
            pieces[-1] += "," + piece
        else:
            pieces.append(piece)
    return pieces


def known_impls() -> list[str]:
    """Every implementation some registered backend offers ("auto" included)."""
    return sorted({"auto"} | {i for name in backend_names() for i in impls_of(name)})


def check_impl(attn_impl: str, impls: list[str] | tuple[str, ...]) -> None:
    """Refuse an `--attn-impl` that is none of `impls` (every command's one line; `vsagen search` passes its scoring
    backend's)."""
    if attn_impl not in impls:
        raise BadInput(f"--attn-impl {attn_impl} is not an implementation any backend has; choose from "
                       f"{', '.join(impls)}")


def backend_specs(entries: Sequence[BackendEntry], preset_tables: dict[str, dict[str, Any]], sparsity: float | None,
                  attn_impl: str, attn: str) -> tuple[BackendSpec, ...]:
    """The `BackendSpec` of each parsed `--attn` entry, options filled by precedence (entry or `--sparsity` /
    `--attn-impl` (both for one option: refused) > the preset's [attention.NAME] table > the backend's default; see
    `vsagen.attention.spec`). `--attn-impl auto` (its default) counts as not given; `attn` is the `--attn` text, for
    messages. A weights file an entry names is read now (its header: readable, holding the backend's keys).

    Raises:
        BadInput: an option value a backend refuses, a flag no backend in the list takes, or a flag and an entry
            that both set one option (say it once).
    """
    flags = {"--sparsity": sparsity, "--attn-impl": None if attn_impl == "auto" else attn_impl}
    check_flags_apply([e.name for e in entries], flags, attn)
    check_flags_not_repeated(entries, flags)
    specs = tuple(spec_of(e, preset=preset_tables, flags=flags) for e in entries)
    for spec in specs:
        named = named_weights_file(backend_class(spec.name), spec.options)
        if named is not None:  # its keys are the backend's (the class's `weights`)
            from ..attention.weights import check_weights_file

            try:
                check_weights_file(named, backend_class(spec.name).weights)
            except BadInput as e:  # say which entry named the file
                raise BadInput(f"--attn {spec.name}: {e}") from None
    return specs


def attention_specs(entries: tuple[BackendEntry, ...], options: Any,
                    preset_tables: dict[str, dict[str, Any]]) -> tuple[BackendSpec, ...]:
    """The specs of the entries a command runs (`AttnList.one` / `several`; not `auto`, which `auto_spec` resolves
    once the device is known), with `options` (`AttentionOptions`) giving `--sparsity` and `--attn-impl`; two
    entries that come to one configuration are refused.

    Raises:
        BadInput: see `backend_specs`; or two entries written differently that are one configuration (e.g. `vsa` and
            `vsa:sparsity=0.875` where the preset's sparsity is 0.875).
    """
    specs = backend_specs(entries, preset_tables, options.sparsity, options.attn_impl, options.attn.text)
    for i, spec in enumerate(specs):
        if spec in specs[:i]:
            first = entries[specs.index(spec)]
            raise BadInput(f"--attn lists {spec.text()} twice ({first.text!r} and {entries[i].text!r}); give each "
                           "configuration once")
    return specs


def preset_file_notes(entries: Sequence[BackendEntry], specs: tuple[BackendSpec, ...],
                      preset_tables: dict[str, dict[str, Any]], model: str) -> tuple[str, ...]:
    """The run notes for the files a backend takes from the model's preset rather than from its entry (a path
    option of the preset's [attention.NAME] table the entry does not set, e.g. the tiny preset's sparse-vdit pattern
    file): where the file came from, and how to name another; and for an entry whose `tile` differs from the one the
    preset says the checkpoint was trained with, that it runs off its training."""
    import typing
    from pathlib import Path

    notes = []
    for entry, spec in zip(entries, specs):
        given = entry.options
        hints = typing.get_type_hints(options_of(spec.name))
        for key in preset_tables.get(spec.name, {}):
            hint = hints.get(key)
            if key not in given and (hint is Path or Path in typing.get_args(hint)):
                value = getattr(spec.options, key)
                notes.append(f"{spec.name}: {key}={value} is the {model} preset's (its [attention.{spec.name}] "
                             f"table); --attn {spec.name}:{key}=FILE names another")
        trained = preset_tables.get(spec.name, {}).get("tile")
        if trained is not None and spec.tile is not None and spec.tile != parse_tile(trained):
            notes.append(f"{spec.name}: {model} was trained with tile {trained}; tile={spec.options.tile} runs it off "
                         f"its training (vsagen compare --model {model} --attn {spec.name},{spec.name}:tile="
                         f"{spec.options.tile} shows what it costs)")
    return tuple(notes)


def auto_spec(kind: str, location: str, options: Any, preset_tables: dict[str, dict[str, Any]],
              random_weights: bool, device: str | Callable[[], str], trained_for: tuple[str, str] | None = None,
              files: Any = None) -> tuple[BackendSpec, str]:
    """`--attn auto`: the backend the checkpoint was trained for (`vsagen.attention.auto`; `trained_for`: its
    preset's (backend, name) where the preset says; `files`: the transformer files' keys, when the transformer comes
    from files, `vsagen.models.transformer_files.auto_evidence`), its spec and the note; `options` is the request's
    `AttentionOptions` (its `--sparsity` and `--attn-impl` apply to the choice); `device` the run's ("cuda" | "cpu"),
    or a function giving it, called once the choice is checked (`--device auto` imports torch to ask for CUDA: a
    flag the choice does not take is refused before that).

    Raises:
        BadInput: a flag the chosen backend does not take (e.g. --sparsity when auto chose full), naming the
            choice and how to pick a backend."""
    name, note_on = auto_choice(kind, location, random_weights, trained_for, files)
    try:
        spec = backend_specs((BackendEntry(name, (), name),), preset_tables, options.sparsity, options.attn_impl,
                             name)[0]
    except BadInput as e:
        raise BadInput(f"{e} (--attn auto chose {name} for this checkpoint: name a backend, e.g. --attn vsa)") \
            from None
    return spec, note_on(device() if callable(device) else device)


def crop_tile_of(specs: Sequence[BackendSpec], attention: Any) -> tuple[int, int, int]:
    """The cube a `--tile-fit crop` plan rounds the grid up to: every VSA tile of `specs` covered; with no specs
    (`--attn auto`, chosen later) every tile the preset's `[attention.<name>]` tables name."""
    if specs:
        return covering_tile([s.tile for s in specs if s.tile is not None])
    return covering_tile([parse_tile(t["tile"]) for t in (attention or {}).values() if "tile" in t])


def per_run_options(name: str) -> tuple[str, ...]:
    """The options of backend `name` that a loaded pipeline can change from one run to the next without loading
    anything again (`vsagen serve`'s per-video `attn`; `vsagen compare` runs such variants on one session): the
    options the command line sets (`vsagen.attention.spec.text_options`) but the cube (`tile`: the crop plan rounds
    the grid to it, and a checkpoint is trained with one) and the files (a weights file, a pattern file: read when
    the backend's weights are attached or the run is prepared)."""
    import typing
    from pathlib import Path

    hints = typing.get_type_hints(options_of(name))
    return tuple(k for k in text_options(options_of(name))
                 if k != "tile" and hints[k] is not Path and Path not in typing.get_args(hints[k]))


def per_run_spec(loaded: BackendSpec, text: str, started: str) -> BackendSpec:
    """The backend one run of a loaded pipeline takes from an `--attn`-style entry `text` (parsed by the command
    line's parser, `parse_attn`): the loaded spec with the options the entry sets, which must be options of the
    same backend that change per run (`per_run_options`: e.g. vsa's sparsity, sla's topk); `started` is the
    `--attn` text the pipeline was loaded with, for the messages.

    Raises:
        BadInput: what `--attn` refuses (an unknown name or option, a list, a value not of its type), `auto`, another
            backend, an option fixed at load, a value the backend's Options refuse; each line names what the
            pipeline was loaded with.
    """
    entry = parse_attn(text.strip()).one()
    keys = per_run_options(loaded.name)
    loaded_with = f"this server was started with --attn {started} and runs {loaded.text()}"
    may = (f"a video may change {loaded.name}'s {', '.join(keys)}" if keys else
           f"a video may not change {loaded.name}'s options")
    if entry.name == AUTO:
        raise BadInput(f"attn 'auto' chooses a backend when the model loads; {loaded_with}; {may}")
    if entry.name != loaded.name:
        raise BadInput(f"attn {entry.text!r} needs the {entry.name} backend; {loaded_with} (another backend needs "
                       f"another server); {may}")
    fixed = [k for k in entry.options if k not in keys]
    if fixed:
        raise BadInput(f"attn {entry.text!r}: {fixed[0]} is fixed when the model loads; {loaded_with}; {may}")
    try:
        return BackendSpec(loaded.name, replace(loaded.options, **entry.options))
    except (BadInput, TypeError) as e:  # the Options' own validation
        raise BadInput(f"attn {entry.text!r}: {e}") from None


def fixed_changes(loaded: BackendSpec, spec: BackendSpec) -> list[str]:
    """The options in which `spec` differs from `loaded` that a run cannot change on the loaded pipeline (all of
    them, as "backend", for another backend); [] where `spec` can run there (`per_run_options`)."""
    if spec.name != loaded.name:
        return ["backend"]
    keys = per_run_options(loaded.name)
    return [f.name for f in fields(loaded.options)
            if f.name not in keys and getattr(loaded.options, f.name) != getattr(spec.options, f.name)]
