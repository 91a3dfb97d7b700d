"""backends/gloo/held.py: a gloo call's tensors stay held in Python while anything else still
references them (gloo's threads), and are let go of once nothing else does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from denseccl.backends.gloo import held as held_module  # noqa: E402
from denseccl.backends.gloo.held import Held  # noqa: E402


def test_tensors_stay_held_while_another_reference_lives() -> None:
    held = Held()
    first, second = torch.ones(3), torch.ones(3)
    other = first.view(-1)  # a view references its base: as gloo's Work references a tensor
    held.hold((first,))
    held.hold((second,))
    assert len(held) == 2  # the oldest is still referenced: nothing behind it is let go of either
    del other
    held.hold(())
    assert len(held) == 0


def test_drain_waits_then_keeps_what_is_never_let_go_of() -> None:
    held = Held()
    tensor = torch.ones(2)
    other = tensor.view(-1)
    held.hold((tensor,))
    before = len(held_module._STUCK)
    held.drain(0.01)
    assert len(held) == 0 and len(held_module._STUCK) == before + 1
    assert held_module._STUCK[-1][0] is tensor  # kept for the process's life, never released
    del other, held_module._STUCK[-1]


def test_what_gloo_let_go_of_behind_a_stuck_call_is_released() -> None:
    held = Held()
    stuck = torch.ones(1)
    other = stuck.view(-1)  # a call gloo never completes
    held.hold((stuck,))
    for _ in range(held_module.SWEEP_AFTER):
        held.hold((torch.ones(1),))
    assert len(held) == 1  # the stuck call's tensors alone
    del other
    held.drain(0.01)
    assert len(held) == 0
