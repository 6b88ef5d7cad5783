"""Method wrapping with an undo: replace a method on one instance (a pipeline, a scheduler, a transformer), leaving its
class and every other instance alone, and give the instance back exactly what it had. Used by `vsagen.apply`'s
sampler, `vsagen.pipeline`'s conditioning timers and CFG parallel (`vsagen.parallel.cfg`); it imports nothing of
vsagen, so every layer can use it.
"""

from __future__ import annotations

from typing import Any, Callable


def wrap_method(obj: Any, name: str, make: Callable[[Callable], Callable]) -> Callable[[], None]:
    """Replace `obj.name` on this instance by `make(original)`, where `original` is what `obj.name` gave before (the
    bound method of its class, or the instance's own attribute, a wrapper installed earlier included).

    Returns:
        The undo: it gives the instance back what it had (its own attribute, or none, so the class's method shows
        again). Undo wrappers of one method in reverse order of wrapping.

    Raises:
        AttributeError: `obj` has no attribute `name`, or (undo) the attribute was deleted meanwhile.
    """
    own = name in vars(obj)
    saved = vars(obj).get(name)
    setattr(obj, name, make(getattr(obj, name)))

    def undo() -> None:
        if own:
            setattr(obj, name, saved)
        else:
            delattr(obj, name)

    return undo
