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

    ``field`` names the offending parameter so servers can map it onto an API error.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
