"""Optional packages a flag needs: checked when the flag is parsed, so a missing one is a
one-line error naming the install command before any work, not a traceback at the end."""

import importlib
import sys


def require(module: str, requirement: str, flag: str, command: str) -> None:
    """Exit with one line when `module` cannot be imported; the line installs `requirement`
    into the Python running mlxd (whichever environment that is)."""
    try:
        importlib.import_module(module)
    except ImportError:
        sys.exit(
            f"mlxd {command}: {flag} needs {module}, which is not installed: "
            f"{sys.executable} -m pip install '{requirement}'"
        )
