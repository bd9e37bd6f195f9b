"""The one error type of model loading: a one-line message that names the file at fault."""


class ModelLoadError(Exception):
    """A model reference could not be turned into a loaded model (user-facing, no traceback)."""
