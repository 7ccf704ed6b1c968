"""What one test leaves behind in the process does not reach the next (tests/conftest.py's autouse fixtures)."""

from __future__ import annotations

import logging
import sys

LEFT: dict[str, object] = {}


def test_a_cli_that_configures_logging_in_process():
    """What train_sentiment.main does when a test runs it in-process: a root handler on the captured stderr."""
    LEFT["level"] = logging.getLogger().level
    logging.basicConfig(level=logging.DEBUG, force=True)
    LEFT["handler"] = next(handler for handler in logging.getLogger().handlers
                           if type(handler) is logging.StreamHandler and handler.stream is sys.stderr)
    assert logging.getLogger().level == logging.DEBUG


def test_the_next_test_finds_the_root_logger_as_it_was():
    root = logging.getLogger()
    assert LEFT["handler"] not in root.handlers  # its stream is closed by now: logging through it would fail
    assert root.level == LEFT["level"]  # as the first test found it
    logging.getLogger("botocore.credentials").warning("a log line after it: no 'Logging error' on stderr")
