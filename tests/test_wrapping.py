"""vsagen.wrapping: a method replaced on one instance only, the wrapper given the method it replaces, and the undo
giving back exactly what the instance had (nothing of its own, or its own attribute; nested wrappers undone in reverse
order)."""

from __future__ import annotations

import pytest

from vsagen.wrapping import wrap_method


class Thing:
    def __init__(self, value: int) -> None:
        self.value = value

    def get(self, add: int = 0) -> int:
        return self.value + add


def doubled(original):
    return lambda *args, **kwargs: 2 * original(*args, **kwargs)


def test_wraps_one_instance_and_undo_shows_the_class_method_again():
    a, b = Thing(3), Thing(5)
    undo = wrap_method(a, "get", doubled)
    assert (a.get(1), b.get(1)) == (8, 6)  # the original gets the arguments; the other instance is untouched
    assert "get" in vars(a) and "get" not in vars(b)
    undo()
    assert a.get(1) == 4 and "get" not in vars(a)


def test_undo_restores_the_instances_own_attribute():
    a = Thing(3)
    own = lambda add=0: 100 + add  # noqa: E731 - an attribute of the instance, not a method of the class
    a.get = own
    undo = wrap_method(a, "get", doubled)
    assert a.get(1) == 202
    undo()
    assert vars(a)["get"] is own


def test_nested_wrappers_undone_in_reverse_order():
    a = Thing(1)
    undo_inner = wrap_method(a, "get", doubled)
    undo_outer = wrap_method(a, "get", lambda original: (lambda: original() + 10))
    assert a.get() == 12  # 2 x 1, then + 10
    undo_outer()
    assert a.get() == 2
    undo_inner()
    assert a.get() == 1 and "get" not in vars(a)


def test_a_missing_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError):
        wrap_method(Thing(1), "nothing", doubled)
