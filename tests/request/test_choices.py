"""vsagen.request.choices: the closed sets of option values, as `vsagen.request.options` re-exports them."""

from __future__ import annotations

import pytest

from vsagen.errors import BadInput
from vsagen.request import choices, options
from vsagen.request.choices import Choice, Device, Quant, ReportFormat, check_choice


def test_check_choice():
    check_choice("--fit", "crop", ("crop", "resize"))
    with pytest.raises(BadInput, match=r"^--fit must be one of crop, resize, got 'x'$"):
        check_choice("--fit", "x", ("crop", "resize"))


def test_a_choice_is_its_string_and_parses_members_and_strings():
    assert Device.parse("cpu", "--device") is Device.CPU and Device.parse(Device.CUDA, "--device") is Device.CUDA
    assert str(Quant.FP8) == "fp8" and Quant.FP8 == "fp8" and ReportFormat.values() == ("table", "markdown", "csv",
                                                                                       "json")
    with pytest.raises(BadInput, match=r"^--quant must be one of auto, none, fp8, int8, got 'fp4'$"):
        Quant.parse("fp4", "--quant")


def test_options_re_exports_every_choice():
    for name, value in vars(choices).items():
        if isinstance(value, type) and issubclass(value, Choice):
            assert getattr(options, name) is value, name
    assert options.check_choice is check_choice
