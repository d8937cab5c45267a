"""Exception types: every error DeepInfer raises on purpose derives from DeepInferError.

Callers (the engine, the server, the CLI) catch DeepInferError to report a clear message for one
request or one command without mistaking it for a bug.
"""

from __future__ import annotations


class DeepInferError(Exception):
    """Base class of the errors DeepInfer raises deliberately."""


class PluginNotFoundError(DeepInferError, LookupError):
    """No installed distribution registers the requested plugin name."""


class PluginConflictError(DeepInferError):
    """Two distributions register the same plugin name in one group."""


class PluginLoadError(DeepInferError, ImportError):
    """A plugin is registered but importing its entry point failed."""


class BackendUnavailableError(DeepInferError, RuntimeError):
    """A backend is installed but cannot run on this machine (no device, missing SDK)."""


class InvalidRequestError(DeepInferError, ValueError):
    """A request or its sampling parameters are invalid; raised at submit time.

    ``field`` names the offending parameter so servers can map it onto an API error;
    ``index`` is the prompt's position when the request was one of a batch (``generate``).
    """

    def __init__(self, field: str, reason: str, index: int | None = None) -> None:
        where = f"prompt {index}: " if index is not None else ""
        super().__init__(f"{where}{field}: {reason}")
        self.field = field
        self.reason = reason
        self.index = index

    def at(self, index: int) -> InvalidRequestError:
        """The same error, naming the prompt of a batch it belongs to."""
        return InvalidRequestError(self.field, self.reason, index)
