"""How the suite's tests are shared between pytest-xdist's workers (hooks that tests/conftest.py imports): the files
marked as one xdist group go whole to one worker, and the long single tests start first."""

from __future__ import annotations

import os
import re


# Tests of over ~10 s (pytest --durations on the 2-core machine, 2026-12-07) that no xdist group holds: run first.
# xdist hands out the grouped files first (most tests first) and then single tests in collection order, so a 27 s
# test collected near the end ran while the other worker had finished: the suite's last half minute on one core.
# (The compiled t2v test, the suite's one Inductor run since its block case moved to aot_eager, started at 91% of a
# full run: tests/test_compile.py is collected late.)
LONG_SINGLE_TESTS = ("tests/test_readme.py::test_readme_cpu_commands_run_as_pasted",
                     "tests/test_compile.py::test_compiled_t2v_gives_the_frames_of_eager",
                     "tests/test_interrupts.py::test_a_signal_at_any_instant_of_the_write_leaves_all_or_nothing",
                     "tests/models/test_compile_caches.py::test_second_process_finds_the_compiled_graph",
                     "tests/cli/test_app.py::test_bad_input_answers_fast_in_one_line_writing_nothing",
                     "tests/serve/test_ray_serve.py::test_two_replicas_on_a_local_ray_cluster_make_a_video_each")


def pytest_collection_modifyitems(config, items):
    """The long single tests (`LONG_SINGLE_TESTS`) first, the rest in their order (every worker reorders alike)."""
    first = [item for item in items if item.nodeid.split("[", 1)[0] in LONG_SINGLE_TESTS]
    if first:
        rest = [item for item in items if item.nodeid.split("[", 1)[0] not in LONG_SINGLE_TESTS]
        items[:] = first + rest


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (pyproject.toml) that also works where pytest-xdist cannot mark the tests: the test files
    marked `pytestmark = pytest.mark.xdist_group("NAME")` with the same NAME (their module or session fixtures spawn
    processes or run the tiny pipeline) go whole to one worker, so those fixtures run once instead of once in each
    worker (the three files of the group "gloo" share one spawn of 2 processes: tests/ulysses_worker.py); every
    other test goes alone to the next free worker. xdist 3.8 tags a marked test by rewriting `item._nodeid`, which
    pytest 9 no longer reads (its ids live in `_id`), so the files and their group's name are found here by their
    mark's line instead (a mark whose name is no string literal: the file is a group of its own).
    `None` (xdist's own scheduler) for any other `--dist`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    groups = marked_files(os.path.dirname(os.path.abspath(__file__)), str(config.rootpath))

    class WholeMarkedGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return groups[file] if file in groups else super()._split_scope(nodeid)

    return WholeMarkedGroups(config, log)


def marked_files(tests: str, root: str) -> dict[str, str]:
    """{test file under the folder `tests`, relative to `root` with "/": its xdist scope} for every file with a line
    `pytestmark = pytest.mark.xdist_group(...)`: "xdist_group:NAME" for a literal NAME (`"NAME"`, `'NAME'` or
    `name="NAME"`), the file itself otherwise."""
    mark = re.compile(r"^pytestmark = pytest\.mark\.xdist_group\((.*)$", re.M)
    literal = re.compile(r"""^(?:name=)?(["'])([^"']+)\1\)""")
    files = {}
    for folder, _, names in os.walk(tests):
        for name in names:
            path = os.path.join(folder, name)
            if name.startswith("test_") and name.endswith(".py"):
                with open(path, encoding="utf-8") as f:
                    found = mark.search(f.read())
                if found:
                    file = os.path.relpath(path, root).replace(os.sep, "/")
                    group = literal.match(found.group(1))
                    files[file] = f"xdist_group:{group.group(2)}" if group else file
    return files

