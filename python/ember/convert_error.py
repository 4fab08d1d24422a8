"""The one error type of ember-convert: its message is printed as a one-line error, no traceback."""


class ConvertError(Exception):
    """Bad input to the converter (missing file, unsupported architecture, malformed tensor...)."""
