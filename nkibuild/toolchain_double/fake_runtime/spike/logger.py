"""The `spike` logger, as spike's `logger.py` configures it (one stderr handler)."""

from __future__ import annotations

import logging


def get_logger(name: str = "spike", level: int = logging.WARNING) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logger.handlers:  # configured once, however often it is asked for
        logger.setLevel(level)
        handler = logging.StreamHandler()
        handler.setLevel(level)
        handler.setFormatter(
            logging.Formatter(fmt="%(asctime)s - %(name)s - %(message)s", datefmt="%H:%M:%S")
        )
        logger.addHandler(handler)
    return logger
