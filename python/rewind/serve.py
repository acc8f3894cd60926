"""`rewind bisect --cmd` probes served by one Python process (cli/script_server.h): the script
is started once, with the first probe in REWIND_REPLAY and REWIND_SERVE="R,W" (the probe pipe's
read end, the reply pipe's write end). Its first rewind.record call does not return: it writes
"serving" and runs the script again, as `python3 script.py args` would (runpy, __name__ ==
"__main__", the same sys.argv), once per probe, the first from REWIND_REPLAY and each next one
from a line of the probe pipe, writing "exit N" (the script's exit code) after each. A probe
then costs its model, its restore and its steps; Python, LibTorch, the CUDA context, the
kernels' first-use setup and the checkpoint's read are paid once. At the end of the probes the
process exits.

The first process's own model and optimizer stay in memory, unused, while it serves."""
import gc
import os
import runpy
import sys
import traceback

SERVE_ENV = "REWIND_SERVE"
_START_DIR = os.getcwd()  # where the script was started (`import rewind` comes before any chdir of its own)

_serving = False
_checkpoint = None  # (key, {name: tensor}): the checkpoint the last served probe restored


def serving():
    """Whether this process serves a bisect's probes (each a run of the script in it)."""
    return _serving


def read_checkpoint(replay, store, run, step):
    """{name: tensor} of run `run`'s checkpoint at `step` (CPU tensors), through `replay` (a
    _C.ScriptReplay of `store`). A serving process reads it once and hands the same tensors to
    every probe that restores it (the probes of one window do): treat them as read-only."""
    global _checkpoint
    key = (os.path.realpath(store), int(run), int(step))
    if _checkpoint is not None and _checkpoint[0] == key:
        return dict(_checkpoint[1])
    _checkpoint = None  # the old one's memory goes before the new one is read
    state = dict(replay.checkpoint(run, step))
    if _serving:
        _checkpoint = (key, state)
    return dict(state)


def _exit_code(e):
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1


def _run(script, argv):
    os.chdir(_START_DIR)  # as a new process would start, whatever the last run changed to
    sys.argv = list(argv)
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:  # rec.step ends the window with sys.exit(0)
        return _exit_code(e)
    except BaseException:  # as an uncaught error in a script of its own: printed, status 1
        traceback.print_exc()
        return 1


def serve_if_asked(replay_env, begin_probe):
    """Called by a replaying rewind.record: serves the probes and exits if REWIND_SERVE asks
    and the script can run again here; returns otherwise (the process replays the one window
    of the environment's `replay_env`, and rewind starts the script anew for each later probe).
    begin_probe() is called before each run of the script."""
    fds = os.environ.pop(SERVE_ENV, None)
    if fds is None:
        return
    probes_fd, replies_fd = (int(x) for x in fds.split(","))
    script = os.path.join(_START_DIR, sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-") else ""
    if not os.path.isfile(script):  # python3 -c, stdin: nothing to run again
        os.close(probes_fd)
        os.close(replies_fd)
        return
    for fd in (probes_fd, replies_fd):  # not for the script's own child processes
        os.set_inheritable(fd, False)
    global _serving
    _serving = True
    argv = list(sys.argv)
    probes = os.fdopen(probes_fd, "r")
    replies = os.fdopen(replies_fd, "w", buffering=1)
    replies.write("serving\n")
    spec = os.environ[replay_env]
    while spec:
        os.environ[replay_env] = spec
        begin_probe()
        code = _run(script, argv)
        gc.collect()  # the probe's model, optimizer and batches: their memory goes back before the next
        sys.stdout.flush()
        sys.stderr.flush()
        replies.write(f"exit {code}\n")
        spec = probes.readline().strip()
    os._exit(0)  # the first process's frames hold its model: nothing of it is to run
