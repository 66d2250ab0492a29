"""The `spike` logger: one stderr handler, added once."""

from __future__ import annotations

import logging


def get_logger(name: str = "spike", level: int = logging.WARNING) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logger.handlers:  # however often it is asked for
        logger.setLevel(level)
        handler = logging.StreamHandler()
        handler.setLevel(level)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    return logger
