"""The attention part of a request: `--attn` entries (and `--sparsity`, `--attn-impl`) as `BackendSpec`s, their
options filled by precedence once (`vsagen.attention.spec.resolve_spec`), and `--attn auto`'s choice."""

from __future__ import annotations

from typing import Any, Sequence

from ..attention import BackendSpec, backend_class, backend_names, resolve_spec
from ..attention.auto import AUTO, choose_backend
from ..attention.registry import backend_facts, options_of, named_weights_file
from ..attention.spec import check_flags_apply, check_flags_not_repeated, impls_of
from ..errors import BadInput
from ..layout import covering_tile, parse_tile
from .options import AttentionOptions, split_list


def check_backend_entry(text: str) -> None:
    """Refuse an unknown backend name early (before the model is resolved), naming the registered ones."""
    if text.split(":", 1)[0].strip() not in backend_names():
        raise BadInput(f"unknown --attn {text.split(':', 1)[0].strip()!r}; available: {', '.join(backend_names())}")


def split_attn_list(attn: str) -> tuple[str, ...]:
    """The entries of a comma-separated `--attn` list (`NAME[:KEY=VALUE...]` each, as `vsagen profile` and
    `vsagen compare` take it), in order; options are not read yet (`backend_specs` does, once the model's preset is
    known).

    Raises:
        BadInput: an empty list or entry, an entry written twice, `auto` (one backend chosen for a t2v / i2v run,
            not one of a list), or an unknown backend name.
    """
    entries = split_list(attn, "--attn", "full,vsa:sparsity=0.9")
    for entry in entries:
        if entry.split(":", 1)[0].strip() == AUTO:  # t2v's default, not a backend: say which names a list takes
            raise BadInput(f"--attn {attn!r}: profile and compare run the backends named in --attn (auto picks one "
                           "for a t2v / i2v run); name them, e.g. --attn full,vsa; available: "
                           f"{', '.join(backend_names())} (see `vsagen backends`)")
        check_backend_entry(entry)
    return entries


def known_impls() -> list[str]:
    """Every implementation some registered backend offers ("auto" included)."""
    return sorted({"auto"} | {i for name in backend_names() for i in impls_of(name)})


def check_impl(attn_impl: str, impls: list[str] | tuple[str, ...]) -> None:
    """Refuse an `--attn-impl` that is none of `impls` (every command's one line; `vsagen search` passes its scoring
    backend's)."""
    if attn_impl not in impls:
        raise BadInput(f"--attn-impl {attn_impl} is not an implementation any backend has; choose from "
                       f"{', '.join(impls)}")


def backend_specs(entries: tuple[str, ...], preset_tables: dict[str, dict[str, Any]], sparsity: float | None,
                  attn_impl: str, attn: str) -> tuple[BackendSpec, ...]:
    """The `BackendSpec` of each `--attn` entry (`NAME[:KEY=VALUE...]`), options filled by precedence (entry or
    `--sparsity` / `--attn-impl` (both for one option: refused) > the preset's [attention.NAME] table > the
    backend's default; see `vsagen.attention.spec`). `--attn-impl auto` (its default) counts as not given. A
    weights file an entry names is read now (its header: readable, holding the backend's keys).

    Raises:
        BadInput: an unknown backend or option, a value a backend refuses, a flag no backend in the list takes,
            or a flag and an entry that both set one option (say it once).
    """
    check_impl(attn_impl, known_impls())
    flags = {"--sparsity": sparsity, "--attn-impl": None if attn_impl == "auto" else attn_impl}
    names = [e.split(":", 1)[0].strip() for e in entries]
    check_flags_apply(names, flags, attn)
    check_flags_not_repeated(entries, flags)
    specs = tuple(resolve_spec(e, preset=preset_tables, flags=flags) for e in entries)
    for spec in specs:
        named = named_weights_file(backend_facts(spec.name), spec.options)
        if named is not None:  # its keys are the backend's (the class's `weights`: the backend's module, torch)
            from ..attention.weights import check_weights_file

            try:
                check_weights_file(named, backend_class(spec.name).weights)
            except BadInput as e:  # say which entry named the file
                raise BadInput(f"--attn {spec.name}: {e}") from None
    return specs


def check_entries(options: AttentionOptions, several: bool) -> tuple[str, ...]:
    """The `--attn` entries as written, checked before the model is known: one entry (`auto` included, without
    options) for a command that runs one backend, a list of distinct known entries for one that runs several.

    Raises:
        BadInput: `auto` with options, an unknown name, a list where one backend runs.
    """
    attn = options.attn
    if several:
        return split_attn_list(attn)
    if "," in attn:
        raise BadInput(f"--attn {attn!r}: this command runs one backend; `vsagen compare` and `vsagen profile` run "
                       "several (comma-separated)")
    name = attn.split(":", 1)[0].strip()
    if name == AUTO:
        if attn != AUTO:
            raise BadInput(f"--attn auto takes no options (got {attn!r}): name the backend to set its options, e.g. "
                           "--attn vsa:sparsity=0.9")
        return (AUTO,)
    check_backend_entry(attn)
    return (attn,)


def attention_specs(entries: tuple[str, ...], options: AttentionOptions, preset_tables: dict[str, dict[str, Any]],
                    ) -> tuple[BackendSpec, ...]:
    """The specs of `check_entries`' entries (not `auto`, which `auto_spec` resolves once the device is known);
    two entries that come to one configuration are refused.

    Raises:
        BadInput: see `backend_specs`; or two entries written differently that are one configuration (e.g. `vsa` and
            `vsa:sparsity=0.875` where the preset's sparsity is 0.875).
    """
    specs = backend_specs(entries, preset_tables, options.sparsity, options.attn_impl, options.attn)
    for i, spec in enumerate(specs):
        if spec in specs[:i]:
            first = entries[specs.index(spec)]
            raise BadInput(f"--attn lists {spec.text()} twice ({first!r} and {entries[i]!r}); give each "
                           "configuration once")
    return specs


def preset_file_notes(entries: tuple[str, ...], specs: tuple[BackendSpec, ...],
                      preset_tables: dict[str, dict[str, Any]], model: str) -> tuple[str, ...]:
    """The run notes for the files a backend takes from the model's preset rather than from its entry (a path
    option of the preset's [attention.NAME] table the entry does not set, e.g. the tiny preset's sparse-vdit pattern
    file): where the file came from, and how to name another; and for an entry whose `tile` differs from the one the
    preset says the checkpoint was trained with, that it runs off its training."""
    import typing
    from pathlib import Path

    from ..attention.spec import parse_spec

    notes = []
    for entry, spec in zip(entries, specs):
        given = parse_spec(entry)[1]
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


def auto_spec(kind: str, location: str, options: AttentionOptions, preset_tables: dict[str, dict[str, Any]],
              random_weights: bool, device: str, trained_for: tuple[str, str] | None = None,
              files: Any = None) -> tuple[BackendSpec, str]:
    """`--attn auto`: the backend the checkpoint was trained for (`vsagen.attention.auto`; `trained_for`: its
    preset's (backend, name) where the preset says; `files`: the transformer files' keys, when the transformer comes
    from files, `vsagen.models.transformer_files.auto_evidence`), its spec and the note.

    Raises:
        BadInput: a flag the chosen backend does not take (e.g. --sparsity when auto chose full), naming the
            choice and how to pick a backend."""
    name, note = choose_backend(kind, location, random_weights, device, trained_for, files)
    try:
        return backend_specs((name,), preset_tables, options.sparsity, options.attn_impl, name)[0], note
    except BadInput as e:
        raise BadInput(f"{e} (--attn auto chose {name} for this checkpoint: name a backend, e.g. --attn vsa)") \
            from None


def crop_tile_of(specs: Sequence[BackendSpec], attention: Any) -> tuple[int, int, int]:
    """The cube a `--tile-fit crop` plan rounds the grid up to: every VSA tile of `specs` covered; with no specs
    (`--attn auto`, chosen later) every tile the preset's `[attention.<name>]` tables name."""
    if specs:
        return covering_tile([s.tile for s in specs if s.tile is not None])
    return covering_tile([parse_tile(t["tile"]) for t in (attention or {}).values() if "tile" in t])
