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


def test_two_threads_holding_at_once_never_drop_what_gloo_still_holds() -> None:
    import sys
    import threading

    held = Held()
    views = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes

    def calls(n: int) -> None:
        for i in range(n):
            tensor = torch.ones(1)
            if i % 3 == 0:
                views.append(tensor.view(-1))  # this call's tensor is still referenced elsewhere
            held.hold((tensor,))

    try:
        threads = [threading.Thread(target=calls, args=(3000,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    still = sum(1 for entry in held._held if not held_module._released(entry))
    assert still == len(views) == 2000  # none of them let go of while referenced
    views.clear()
    held.drain(0.01)
    assert len(held) == 0
