"""`BackendSpec`: one attention backend as a value, from the command line to the processor.

A spec is a registered backend name plus an instance of that backend's frozen `Options` dataclass. It is written
on the command line as `NAME[:KEY=VALUE[:KEY=VALUE...]]`, e.g. `vsa`, `vsa:sparsity=0.9`, `vsa:sparsity=0.9:impl=torch`
(`vsagen profile --attn full,vsa:sparsity=0.85,vsa:sparsity=0.9` compares two configurations of one backend).

An entry's text is parsed once (`parse_entry`: a `BackendEntry`, the options it sets typed); its spec is filled from
it (`spec_of`). Precedence of an option's value, implemented once in `spec_of`: the spec's own `KEY=VALUE` > a
dedicated flag that maps to the option (`--sparsity` -> `sparsity`, `--attn-impl` -> `impl`) > the model preset's
`[attention.<name>]` table > the Options dataclass default.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import BadInput
from .shared import KNOBS, TILE_FIELD, option_names, options_dict
from .registry import backend_class, backend_names, options_of

if TYPE_CHECKING:
    from .base import AttentionBackend

# Dedicated command-line flags and the option each one sets (for the backends whose Options have that field).
FLAG_OPTIONS = {"--sparsity": "sparsity", "--attn-impl": "impl"}


@dataclass(frozen=True)
class BackendSpec:
    """A backend name and its options (an instance of the backend's `Options`)."""

    name: str
    options: Any

    def build(self) -> AttentionBackend:
        """A fresh backend object."""
        return backend_class(self.name)(self.options)

    @property
    def sparsity(self) -> float | None:
        """The `sparsity` option of sparse backends, None for the others."""
        return getattr(self.options, "sparsity", None)

    @property
    def tile(self) -> tuple[int, int, int] | None:
        """The `tile` option of VSA's backends as (tt, th, tw), None for the others."""
        from ..layout import parse_tile

        text = getattr(self.options, "tile", None)
        return None if text is None else parse_tile(text)

    @property
    def impl(self) -> str:
        """The `impl` option ("auto" for backends without one)."""
        return getattr(self.options, "impl", "auto")

    @property
    def label(self) -> str:
        """Name and sparsity, a cube other than the default 4x4x4, a fine-stage precision other than bf16, VSA's
        top-k count other than tiles and the quality knobs set, e.g. "vsa 0.875", "vsa 0.875 tile 4x4x8", "vsa 0.875
        int8", "vsa 0.8 topk tokens", "vsa 0.875 dense_steps=2" (reports)."""
        precision = getattr(self.options, "precision", "bf16")
        count = getattr(self.options, "topk_count", "tiles")
        knobs = "".join(f" {k}={_fmt(getattr(self.options, k))}" for k in KNOBS
                        if getattr(self.options, k, None) is not None)
        return (self.name + (f" {self.sparsity:g}" if self.sparsity is not None else "")
                + tile_label(getattr(self.options, "tile", None)) + (f" {precision}" if precision != "bf16" else "")
                + (f" topk {count}" if count != "tiles" else "") + knobs)

    def text(self) -> str:
        """The spec as it would be written on the command line, every option spelled out."""
        parts = [self.name] + [f"{k}={_fmt(v)}" for k, v in options_dict(self.options).items() if v is not None]
        return ":".join(parts)

    def command_text(self, preset: Mapping[str, Mapping[str, Any]] | None = None) -> str:
        """The spec as `--attn` takes it back: the name and each option the command line sets (`text_options`) whose
        value differs from the one the bare name gets (the model preset's `[attention.NAME]` table in `preset`, else
        the backend's default), paths whole, e.g. `vsa:sparsity=0.9:dense_steps=2`: `resolve_spec` of it with the
        same `preset` gives these options again."""
        cls = type(self.options)
        table = {k: v for k, v in (preset or {}).get(self.name, {}).items() if k in option_names(cls)}
        base = {k: _fmt(v) for k, v in options_dict(make_options(self.name, table) if table else cls()).items()}
        settable = text_options(cls)
        return ":".join([self.name, *(f"{k}={_fmt(v)}" for k, v in options_dict(self.options).items()
                                      if k in settable and base.get(k) != _fmt(v))])

    def short_text(self) -> str:
        """The spec with only the options that differ from the backend's defaults (`vsa:sparsity=0.9`, or the bare
        name), for labels; a path option shows its file name only."""
        return _short_text(self.name, options_dict(self.options))

    def summary(self) -> dict[str, Any]:
        """JSON-ready: {"name", "sparsity", "impl", **the other options set}; `sparsity` (None for dense backends)
        and `impl` ("auto" where the backend has no choice) are there for every backend, as in earlier reports."""
        return {"name": self.name, "sparsity": self.sparsity, "impl": self.impl, **options_dict(self.options)}


def short_spec_text(text: str) -> str:
    """`NAME:KEY=VALUE...` text (as `BackendSpec.text` writes it, e.g. a report row's `spec`) without the options at
    their defaults, for labels; a path option shows its file name only (`sparse-vdit:patterns=h22.json`); reads no
    file."""
    entry = parse_entry(text)
    return _short_text(entry.name, entry.options)


def _short_text(name: str, values: Mapping[str, Any]) -> str:
    """`NAME[:KEY=VALUE...]` of the `values` that differ from backend `name`'s defaults (compared as text writes
    them); a path option as its file name."""
    options = options_of(name)
    defaults = {k: _fmt(v) for k, v in options_dict(options()).items()}
    hints = _hints(options)

    def shown(key: str, value: Any) -> str:
        kind = hints.get(key)
        is_path = kind is Path or Path in typing.get_args(kind)
        return Path(str(value)).name if is_path and str(value) else _fmt(value)

    return ":".join([name, *(f"{k}={shown(k, v)}" for k, v in values.items()
                             if v is not None and defaults.get(k) != _fmt(v))])


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)


def format_option(v: Any) -> str:
    """An option value as `NAME:KEY=VALUE` text writes it (floats as %g, booleans lower case)."""
    return _fmt(v)


def _hints(options_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(options_cls)


_TEXT_TYPES = (bool, int, float, str, Path)


def _settable(kind: Any) -> bool:
    """Whether an Options field of this type can be written as text: a scalar, a Path, a Literal of strings, or an
    Optional of one of them."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return len(args) == 1 and _settable(args[0])
    return kind in _TEXT_TYPES or typing.get_origin(kind) is typing.Literal


def text_options(options_cls: type) -> list[str]:
    """The options of a backend that the command line can set (`NAME:KEY=VALUE`)."""
    hints = _hints(options_cls)
    return [n for n in option_names(options_cls) if _settable(hints[n])]


def python_options(options_cls: type) -> list[str]:
    """The options of a backend that only Python sets (`vsagen.apply(..., KEY=value)`: an object such as vsa's
    `tuning`), not the command line."""
    return [n for n in option_names(options_cls) if n not in text_options(options_cls)]


def no_option(name: str, key: str, known: Sequence[str]) -> str:
    """The words of a refused option, shared by `--attn`, `--cache` and `vsagen.apply`: "NAME has no option 'KEY';
    its options: ..." (or "NAME takes no options")."""
    return f"{name} has no option {key!r}; " + (f"its options: {', '.join(known)}" if known else
                                                f"{name} takes no options")


def tile_label(tile: str | None) -> str:
    """" tile 4x4x8" for a VSA cube other than the default 4x4x4 (labels of reports); "" for the default or None."""
    return f" tile {tile}" if tile is not None and tile != TILE_FIELD["default"] else ""


def _convert(options_cls: type, key: str, text: str, where: str) -> Any:
    """The text of option `key` as the type its Options field declares (float, int, bool, str, Path, or Optional
    of one of them; "none" gives None for Optional fields)."""
    kind = _hints(options_cls)[key]
    if not _settable(kind):
        raise BadInput(f"{where}: option {key!r} is set from Python, not on the command line")
    args = typing.get_args(kind)
    optional = (typing.get_origin(kind) in (typing.Union, types.UnionType)) and type(None) in args
    if optional:
        if text.strip().lower() == "none":
            return None
        kind = next(a for a in args if a is not type(None))
    try:
        if kind is bool:
            low = text.strip().lower()
            if low in ("1", "true", "on", "yes"):
                return True
            if low in ("0", "false", "off", "no"):
                return False
            raise ValueError
        if kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        if kind is int:
            return int(text)
        if kind is Path:
            if not text.strip():  # Path("") would be the current folder
                raise ValueError
            return Path(text).expanduser()
        if typing.get_origin(kind) is typing.Literal:
            if text not in typing.get_args(kind):
                raise ValueError
            return text
        return kind(text)
    except (TypeError, ValueError):
        if typing.get_origin(kind) is typing.Literal:
            raise BadInput(f"{where}: {key} must be one of {', '.join(map(str, typing.get_args(kind)))}, "
                           f"got {text!r}") from None
        what = {float: "a number", int: "an integer", bool: "true or false", Path: "a file path"}.get(
            kind, getattr(kind, "__name__", kind))
        raise BadInput(f"{where}: {key}={text!r} is not {what}") from None


def convert_option(options_cls: type, key: str, text: str, where: str) -> Any:
    """The text of option `key` of any frozen Options dataclass as its field's type (`--attn` and `--cache` alike).

    Raises:
        BadInput: a value that is not of the field's type, or a field set from Python only; `where` opens the line.
    """
    return _convert(options_cls, key, text, where)


@dataclass(frozen=True)
class BackendEntry:
    """One `NAME[:KEY=VALUE...]` entry, parsed (`parse_entry`): a registered backend name, the options the entry
    sets as their typed values (in the order written; the rest come from flags, the preset and the defaults when
    the spec is filled, `spec_of`), and the entry as written, for messages."""

    name: str
    given: tuple[tuple[str, Any], ...] = ()
    text: str = ""

    @property
    def options(self) -> dict[str, Any]:
        """{key: typed value} of the options the entry sets."""
        return dict(self.given)


def parse_entry(text: str, where: str = "--attn") -> BackendEntry:
    """Parse one `NAME[:KEY=VALUE...]` entry: its name checked against the registry, each key against the
    backend's options, each value converted to its field's type (`convert_option`). The one place entry text is
    read; the Options' own validation runs when the spec is filled (`spec_of`), over the preset's values too.

    Raises:
        BadInput: an unknown name (the message lists the registered ones), an entry that is not KEY=VALUE, an
            unknown key (the message lists the backend's options), a key given twice, or a value that is not of
            its field's type; `where` opens the line.
    """
    name, *pairs = [p.strip() for p in text.strip().split(":")]
    if name not in backend_names():
        raise BadInput(f"unknown {where} {name!r}; available: {', '.join(backend_names())}")
    cls = options_of(name)
    known = text_options(cls)

    def check_key(key: str) -> None:
        if key not in known:
            listed = ", ".join(known) if known else "none"
            if key in option_names(cls):
                raise BadInput(f"{where} {text!r}: option {key!r} is set from Python, not on the command line; "
                               f"options here: {listed}")
            python = python_options(cls)
            also = f"; from Python only (vsagen.apply): {', '.join(python)}" if python else ""
            raise BadInput(f"{where} {text!r}: {no_option(name, key, known)}{also}")

    raw = option_pairs(text, pairs, where, check_key)
    given = tuple((key, _convert(cls, key, value, f"{where} {text!r}")) for key, value in raw.items())
    return BackendEntry(name, given, text.strip())


def option_pairs(text: str, pairs: Sequence[str], where: str, check_key: Any) -> dict[str, str]:
    """The `KEY=VALUE` parts of a `NAME:KEY=VALUE...` entry `text` (`--attn`, `--cache`) as {key: value text}, each
    key checked by `check_key` (which raises BadInput for a key the name does not take).

    Raises:
        BadInput: a part that is not KEY=VALUE, or a key given twice; `check_key`'s refusals.
    """
    raw: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise BadInput(f"{where} {text!r}: options are written NAME:KEY=VALUE, got {pair!r}")
        check_key(key)
        if key in raw:
            raise BadInput(f"{where} {text!r}: option {key!r} given twice")
        raw[key] = value.strip()
    return raw


def make_options(name: str, values: Mapping[str, Any], where: str = "--attn") -> Any:
    """The Options instance of backend `name` from `values` (already typed); validation is the dataclass's.

    Raises:
        BadInput: a key the backend does not have (the message lists its options), or a value its Options
            refuse.
    """
    cls = options_of(name)
    known = option_names(cls)
    python = python_options(cls)
    for key in values:
        if key not in known:
            listed = ", ".join(k + (" (Python only)" if k in python else "") for k in known)
            raise BadInput(f"{where} {name}: no option {key!r}; its options: {listed or 'none'}")
    try:
        return cls(**values)
    except (BadInput, TypeError) as e:  # the Options' own validation; TypeError: a value of a wrong type
        raise BadInput(f"{where} {name}: {e}") from None


def spec_of(entry: BackendEntry, *, preset: Mapping[str, Mapping[str, Any]] | None = None,
            flags: Mapping[str, Any] | None = None, where: str = "--attn") -> BackendSpec:
    """The `BackendSpec` of a parsed entry, its options filled by precedence (entry > flag > preset table >
    default) and validated by the backend's Options.

    Args:
        entry: the parsed entry (`parse_entry`).
        preset: the model preset's per-backend tables ({"vsa": {"sparsity": 0.875}, ...}).
        flags: dedicated flags that were given (not None), by flag name (`FLAG_OPTIONS`); a flag whose option the
            backend lacks is ignored here (`check_flags_apply` refuses flags that apply to no backend).

    Raises:
        BadInput: see `make_options`.
    """
    known = option_names(options_of(entry.name))
    values: dict[str, Any] = {k: v for k, v in (preset or {}).get(entry.name, {}).items() if k in known}
    for flag, value in (flags or {}).items():
        key = FLAG_OPTIONS[flag]
        if value is not None and key in known:
            values[key] = value
    values.update(entry.given)
    return BackendSpec(entry.name, make_options(entry.name, values, where))


def resolve_spec(text: str, *, preset: Mapping[str, Mapping[str, Any]] | None = None,
                 flags: Mapping[str, Any] | None = None, where: str = "--attn") -> BackendSpec:
    """`spec_of(parse_entry(text))`: one `NAME[:KEY=VALUE...]` entry as a spec, for callers holding text (Python
    callers, tests); the commands parse `--attn` once, when its option group is built
    (`vsagen.request.options.AttentionOptions`).

    Raises:
        BadInput: see `parse_entry` and `make_options`.
    """
    return spec_of(parse_entry(text, where), preset=preset, flags=flags, where=where)


def check_flags_apply(names: list[str], flags: Mapping[str, Any], attn: str) -> None:
    """Refuse a dedicated flag (given, i.e. not None; `--attn-impl auto` counts as not given) that no backend in
    `names` takes, in one line naming the flag and the backends.

    Raises:
        BadInput: e.g. "--sparsity applies to sparse backends, and --attn full lists none".
    """
    for flag, value in flags.items():
        if value is None or (flag == "--attn-impl" and value == "auto"):
            continue
        key = FLAG_OPTIONS[flag]
        takers = [n for n in names if key in option_names(options_of(n))]
        if takers:
            continue
        if flag == "--sparsity":
            raise BadInput(f"--sparsity applies to sparse backends, and --attn {attn} lists none")
        offered = sorted({"auto"} | {i for n in names for i in impls_of(n)})
        raise BadInput(f"{flag} {value} does not apply to --attn {attn}; choose from {', '.join(offered)}")


def check_flags_not_repeated(entries: Sequence[BackendEntry], flags: Mapping[str, Any]) -> None:
    """Refuse a dedicated flag (given, not None) next to an entry that sets the same option itself: which one was
    meant is not clear, so it is said once.

    Raises:
        BadInput: e.g. "--sparsity 0.7 and --attn entry 'vsa:sparsity=0.5' both set vsa's sparsity; give it once".
    """
    for entry in entries:
        for flag, value in flags.items():
            if value is not None and FLAG_OPTIONS[flag] in entry.options:
                raise BadInput(f"{flag} {value} and --attn entry {entry.text!r} both set {entry.name}'s "
                               f"{FLAG_OPTIONS[flag]}; give it once")


def option_help(options_cls: type) -> list[tuple[str, str, str]]:
    """(key, default, accepted values) of each option the command line can set (`text_options`), as text: the default
    as `KEY=VALUE` writes it ("none" for an unset optional input), the values as a short phrase ("a number",
    "auto | triton | torch", "a file, or none", ...), for listings such as `vsagen backends`."""
    defaults = {f.name: f.default for f in fields(options_cls)}
    metadata = {f.name: f.metadata for f in fields(options_cls)}
    hints = _hints(options_cls)
    out = []
    for key in text_options(options_cls):
        kind = hints[key]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) < len(typing.get_args(kind))
        base = args[0] if optional else kind
        if "values" in metadata[key]:  # a field's own phrase (e.g. vsa's tile: "TxHxW: 4x4x4 | 4x4x8 | 4x8x8")
            values = metadata[key]["values"]
        elif typing.get_origin(base) is typing.Literal:
            values = " | ".join(map(str, typing.get_args(base)))
        else:
            values = {float: "a number", int: "an integer", bool: "true | false", Path: "a file"}.get(base, "text")
        default = defaults[key]
        out.append((key, "none" if default is None else _fmt(default), values + (", or none" if optional else "")))
    return out


def impls_of(name: str) -> tuple[str, ...]:
    """The implementations backend `name` offers (its `impl` option's Literal values; () without the option)."""
    hint = _hints(options_of(name)).get("impl")
    return typing.get_args(hint) if hint is not None else ()
