"""Errors of loading a BMv2 JSON program."""


class ProgramError(ValueError):
    """The JSON is malformed or inconsistent."""


class UnsupportedConstruct(ProgramError):
    """A construct of the BMv2 JSON that this switch does not implement."""
