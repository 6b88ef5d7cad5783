"""Errors that the CLI turns into one line and an exit code (2: bad input, 1: failure while running)."""


class VsagenError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1


class BadInput(VsagenError):
    """The user asked for something invalid; nothing was written."""

    exit_code = 2


class ModelNotFound(BadInput):
    """A checkpoint could not be found or loaded from where the user pointed."""


class RunFailure(VsagenError):
    """Something broke while running a valid request."""

    exit_code = 1
