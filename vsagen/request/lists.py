"""Comma-separated options (`--tile-fit`, `--attn`, ...): their entries split and checked in one place, with one
message per fault, shared by the option groups (`options`) and the attention entries (`backends`, which `options`
imports)."""

from __future__ import annotations

from typing import Iterable

from ..errors import BadInput


def split_list(value: str | Iterable[str], flag: str, example: str) -> tuple[str, ...]:
    """A comma-separated option ('a,b' or an iterable of strings) as its stripped entries, in order.

    Raises:
        BadInput: an empty list or entry, or an entry written twice (`check_list`).
    """
    text = value if isinstance(value, str) else ",".join(value)
    items = tuple(x.strip() for x in text.split(","))
    check_list(items, text, flag, example)
    return items


def check_list(items: tuple[str, ...], text: str, flag: str, example: str) -> None:
    """Refuse a comma-separated option `text` whose stripped entries `items` are none, or hold an empty entry or one
    written twice; `example` shows a good list.

    Raises:
        BadInput: "<flag> is empty; ...", "<flag> 'a,,b' has an empty entry; ...", "<flag> lists 'a' twice".
    """
    if not text.strip():
        raise BadInput(f"{flag} is empty; give a comma-separated list (e.g. {example})")
    for x in items:
        if not x:
            raise BadInput(f"{flag} {text!r} has an empty entry; give a comma-separated list (e.g. {example})")
        if items.count(x) > 1:
            raise BadInput(f"{flag} lists {x!r} twice")
