"""vsagen.request.lists: a comma-separated option split into its stripped entries, and the one check of them (no
entry, an empty entry, an entry written twice), one line each, naming the flag."""

from __future__ import annotations

import pytest

from vsagen.errors import BadInput
from vsagen.request.lists import check_list, split_list


def test_split_list_strips_and_keeps_the_order():
    assert split_list(" a , b ", "--x", "a,b") == ("a", "b") and split_list(["b", "a"], "--x", "a,b") == ("b", "a")
    assert split_list("a", "--x", "a,b") == ("a",)


@pytest.mark.parametrize("text,line", [
    ("", "--x is empty; give a comma-separated list (e.g. a,b)"),
    ("  ", "--x is empty; give a comma-separated list (e.g. a,b)"),
    ("a,,b", "--x 'a,,b' has an empty entry; give a comma-separated list (e.g. a,b)"),
    (" , ", "--x ' , ' has an empty entry; give a comma-separated list (e.g. a,b)"),
    ("a, b ,a", "--x lists 'a' twice"),
])
def test_a_bad_list_is_one_line_naming_the_flag(text, line):
    with pytest.raises(BadInput) as info:
        split_list(text, "--x", "a,b")
    assert str(info.value) == line
    with pytest.raises(BadInput) as again:  # the check alone, on entries split elsewhere (`--attn`'s pieces)
        check_list(tuple(p.strip() for p in text.split(",")), text, "--x", "a,b")
    assert str(again.value) == line
