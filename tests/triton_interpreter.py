"""Speed-ups of the Triton interpreter for the test suite (conftest.py applies them when TRITON_INTERPRET=1): each
one leaves what a kernel computes, and what a test can see, exactly as the interpreter gives it, and checks the
interpreter's source or options before it patches (a Triton whose interpreter differs is left alone)."""

from __future__ import annotations


def _patch_the_language_once_per_launch() -> None:
    """Make the Triton interpreter patch `triton.language` once per kernel launch, not again at every helper call.

    A launch (`GridExecutor.__call__`) patches the language's builtins to interpreted ones (`_patch_lang`) and
    restores them when its programs are done; every call of a `@triton.jit` helper from inside the kernel
    (`InterpretedFunction.__call__`) patched them again, listing every member of `tl`, `tl.tensor` and `tl.math`
    with `inspect.getmembers` to find builtins that the launch (or an earlier helper of it) had already replaced,
    and dropping what it set: a quarter of a profiled kernel test's time; test_linear_marginal, test_k2q and
    test_tile_plan took 40% less CPU without it. While a launch runs, a helper whose module sees no language module
    other than those patched in this launch now runs on them as they are; any other call patches as before. Left as it is where the interpreter's code is not the one this was written
    against (another Triton)."""
    import inspect

    try:
        import triton.language as tl
        from triton.runtime import interpreter

        launch = inspect.getsource(interpreter.GridExecutor.__call__)
        helper = inspect.getsource(interpreter.InterpretedFunction.__call__)
    except (ImportError, AttributeError, TypeError, OSError):
        return
    if not ("patch_scope = _patch_lang(self.fn)" in launch and "patch_scope.restore()" in launch
            and "\n        _patch_lang(self.fn)\n" in helper):
        return
    patch, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state: dict = {}  # "patched": the language modules the launch in progress has patched

    class Unpatched:
        def restore(self) -> None:
            pass

    def patch_lang(fn):
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        patched = state.get("patched")
        if patched is not None and all(any(lang is done for done in patched) for lang in langs):
            return Unpatched()  # a helper inside the launch: the language is patched already
        scope = patch(fn)
        if state.get("starting"):  # the launch's own patch
            state.update(starting=False, patched=langs)
        elif patched is not None:  # a helper that sees another one (`triton.language.standard` sees tl.core)
            patched.extend(langs)
        return scope

    def launch_patching_once(self, *args, **kwargs):
        state.update(starting=True, patched=None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.update(starting=False, patched=None)

    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = launch_patching_once


def _skip_the_overflow_checks_that_assert_nothing() -> None:
    """Leave out the interpreter's integer-overflow checks, which compute and assert nothing.

    The interpreter's options say `sanitize_overflow=True, debug=False`, so every int32 add, sub and mul of a
    kernel re-ran itself in int64, compared the result with the int32 range and handed that to `device_assert`,
    which returns at once without debug (on the GPU the same check is only compiled in with debug): eight extra
    interpreted operations per integer one, none of which can fail: a third of the time of a VSA forward launch in
    an end-to-end test. Left as it is where the interpreter would assert (debug on) or checks otherwise (another
    Triton)."""
    import dataclasses
    import inspect

    try:
        from triton.language.semantic import TritonSemantic
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        sanitize = inspect.getsource(TritonSemantic.binary_op_sanitize_overflow_impl)
        asserting = inspect.getsource(TritonSemantic.device_assert)
    except (ImportError, AttributeError, TypeError, OSError):
        return
    if ("not self.builder.options.sanitize_overflow" in sanitize and "self.device_assert(" in sanitize
            and "if not self.builder.options.debug:\n            return" in asserting
            and not builder.options.debug and dataclasses.is_dataclass(builder.options)):
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


def _remember_the_interpreters_numpy_dtypes() -> None:
    """Look a Triton type's numpy dtype up once. The interpreter's `_get_np_dtype` built its table of 19 types
    anew at every call (a dict of hashed Triton types, once or more per interpreted operation): 8% of a kernel
    test's time. The answer depends on the type alone (equal types, equal answers), so it is kept per type."""
    try:
        from triton.runtime import interpreter

        real = interpreter._get_np_dtype
    except (ImportError, AttributeError):
        return
    known: dict = {}

    def np_dtype(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            known[tt_dtype] = found = real(tt_dtype)
            return found
        except TypeError:  # an unhashable type: as before
            return real(tt_dtype)

    interpreter._get_np_dtype = np_dtype


def apply() -> None:
    """All three, in order."""
    _patch_the_language_once_per_launch()
    _skip_the_overflow_checks_that_assert_nothing()
    _remember_the_interpreters_numpy_dtypes()
