"""The plan rewind's ops apply now, and the rewind.op names the script has run: what the
recorder (_recording.py) sets, and rewind.op (_ops.py), the instrumented modules
(_instrument.py) and the compiled ops (_compiled.py) read. A module of its own, so that none of
those imports the recorder."""

from __future__ import annotations

from typing import Callable, List, Set

active = ""  # the plan of the running recording's current step; "" outside one
op_names: Set[str] = set()  # the names rewind.op has been called with, stored with the run
listeners: List[Callable[[str], None]] = []  # called with the new plan whenever it changes


def set_active_plan(plan: str) -> None:
    """The plan rewind's ops apply from now on; the listeners hear of a change."""
    global active
    if plan != active:
        active = plan
        for listener in listeners:
            listener(plan)


def active_plan() -> str:
    """The precision plan that rewind.attention, rewind.op and rewind.instrument's model apply
    when given none.

    Returns:
        The plan of the running rewind.record's current step (the recorded one, and in a
        replay with --plan that plan from the window's first step on); "" outside a recording.
    """
    return active
