"""What rewind.record does in this process, read once from the environment that rewind's CLI
sets when it starts the script, and the exception that ends a run of the script rewind started
for a window of steps."""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import types
from typing import Any, Mapping

from . import _C

# Set by `rewind replay|bisect --cmd` (cli/script_window.cpp): a JSON object with store, run,
# from, to, plans (the plan of each step from the first one's step on, replacing the recorded
# schedule there: [[step, spec], ...], empty for the recorded plans) and report (the file this
# process writes its per-step lines to).
REPLAY_ENV = "REWIND_REPLAY"
# Set by `rewind doctor --cmd` (cli/cmd_doctor.cpp): a JSON object with steps (how many loop
# steps to hash) and report (the file this process writes its lines to).
DOCTOR_ENV = "REWIND_DOCTOR"


class Mode(enum.Enum):
    """What a `rewind.Recorder` does with the loop's steps (`rec.mode`), fixed when it is made.

    RECORD: the script runs on its own; every step is written to a new store.
    REPLAY: `rewind replay --cmd` or `rewind bisect --cmd` started the script; a window of a
        recording is replayed from its nearest checkpoint with the recorded batches, and the
        steps are reported to rewind instead of stored.
    DOCTOR: `rewind doctor --cmd` started the script; the first steps' tensors are hashed and
        nothing is recorded.
    """
    RECORD = "record"
    REPLAY = "replay"
    DOCTOR = "doctor"


@dataclasses.dataclass(frozen=True)
class Launch:
    """The mode of this process's recorder and the CLI's settings for it (the JSON object of
    REWIND_REPLAY or REWIND_DOCTOR; empty when recording)."""
    mode: Mode
    spec: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Launch:
        # REWIND_DOCTOR first: a REWIND_REPLAY that the doctor's command inherits must not turn
        # its runs into replays.
        for mode, name in ((Mode.DOCTOR, DOCTOR_ENV), (Mode.REPLAY, REPLAY_ENV)):
            text = environ.get(name)
            if text is None:
                continue
            try:
                spec = json.loads(text)
            except ValueError:
                spec = None
            if not isinstance(spec, dict):
                raise _C.RewindError(f"{name} is set but is not the JSON object rewind's CLI sets ({text[:60]!r}); "
                                     f"unset it to record")
            return cls(mode, types.MappingProxyType(spec))
        return cls(Mode.RECORD)


class WindowDone(SystemExit):
    """The steps rewind started this run of the script for have all run: raised by `rec.batch`
    or `rec.step` after the last step of a replayed window (`rewind replay --cmd`'s `--to`, a
    bisect probe's verdict, a NaN loss that ends a probe) or of `rewind doctor`'s steps.

    A `SystemExit` with code 0, so that a script that does not catch it ends as one whose loop
    ran out: status 0, no traceback, and `except Exception` blocks let it through. A script
    that must do something after its loop in a replay too can catch it (`except
    rewind.WindowDone`); every later `rec.batch` or `rec.step` of that recorder raises it
    again, since the window has no more steps.

    Attributes:
        mode: `rewind.Mode.REPLAY` or `rewind.Mode.DOCTOR`.
        last_step: the last step that ran.
    """

    def __init__(self, mode: Mode, last_step: int):
        super().__init__(0)
        self.mode, self.last_step = mode, last_step

    def __str__(self) -> str:
        return f"rewind {self.mode.value}: the window's steps have run (the last: step {self.last_step})"

    def __reduce__(self):
        return type(self), (self.mode, self.last_step)
