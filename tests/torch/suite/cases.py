"""What the driver changes so that torch's suite, written for gloo, nccl and mpi, tests denseccl
(data only: no torch import, shared by driver.py and test_torch_suite.py)."""

from __future__ import annotations

from typing import Dict, FrozenSet

_ALL_TO_ALL = "Only MPI supports all_to_all"
_ALL_TO_ALL_SINGLE = "Only MPI supports CPU all_to_all_single"

#: test -> the skip reason that names a backend (decided when torch's module is imported) which
#: denseccl overrides because it provides the feature on CPU tensors. gloo's run skips these, so
#: they are not in the baseline; on denseccl they must pass wherever the world size allows them.
UNSKIP: Dict[str, str] = {
    "test_all_to_all": _ALL_TO_ALL,
    "test_all_to_all_complex": _ALL_TO_ALL,
    "test_all_to_all_full_group": _ALL_TO_ALL,
    "test_all_to_all_group": _ALL_TO_ALL,
    "test_all_to_all_single_equal_split": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_equal_split_complex": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_equal_split_full_group": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_equal_split_group": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_unequal_split": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_unequal_split_complex": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_unequal_split_full_group": _ALL_TO_ALL_SINGLE,
    "test_all_to_all_single_unequal_split_group": _ALL_TO_ALL_SINGLE,
}

#: tests whose body chooses its CPU code path with ``BACKEND in ("mpi", "gloo")`` and has none
#: for another name (``_test_accumulate_gradients_no_sync``); their body sees "gloo".
BODY_AS_GLOO: FrozenSet[str] = frozenset(
    {
        "test_accumulate_gradients_no_sync",
        "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
        "test_accumulate_gradients_no_sync_grad_is_view",
    }
)
