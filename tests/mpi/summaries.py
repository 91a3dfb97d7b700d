"""The reader of the rank programs' summary lines, under the name the MPI tests import it by
(it lives beside the Checker that writes them, tests/support/checker.py)."""

from tests.support.checker import expect_summaries

__all__ = ["expect_summaries"]
