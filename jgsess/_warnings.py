"""jgsess's one warning category, and warnings said once per cause."""

from __future__ import annotations

import threading
import warnings


class JgsessFallbackWarning(RuntimeWarning):
    """jgsess does less than it could, and says why: the pipeline failed on a program (run as
    plain `jax.jit` would), `jgsess.jit` left its first road, or a decision could not be
    measured, probed or cached (the cost model, or this process's memory, took its place)."""


_said: set[str] = set()
_lock = threading.Lock()


def warn_once(cause: str, text: str, stacklevel: int = 2) -> None:
    """Warn `text` (JgsessFallbackWarning) the first time this process meets `cause`."""
    with _lock:
        if cause in _said:
            return
        _said.add(cause)
    warnings.warn(text, JgsessFallbackWarning, stacklevel=stacklevel + 1)
