"""`carry_on`: how the monitor's parts go on past a failure (monitoring must keep going).

Its own module so that the monitor's submodules (sampler.py) use it without importing the
monitor package's `Monitor`, which imports them. May call: the store's `StoreUnavailable`
(looked up only when a failure happens).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("jupyter_gpujobs")


@contextmanager
def carry_on(what: str, logger: logging.Logger = log) -> Iterator[None]:
    """Go on past a failure of the block (monitoring must keep going), logging it as
    "gpujobs: <what> failed"; a full or read-only store is not logged here: the engine says
    so once a minute while it lasts."""
    try:
        yield
    except Exception as err:
        from ..store import StoreUnavailable  # (loaded by then: the store raised it)

        if not isinstance(err, StoreUnavailable):
            logger.exception("gpujobs: %s failed", what)
