"""`rewind bisect --cmd` probes served by one Python process (cli/script_server.h): the script
is started once, with the first probe in REWIND_REPLAY and REWIND_SERVE="R,W" (the probe pipe's
read end, the reply pipe's write end). Its first rewind.record call does not return: it writes
"serving" and runs the script again, as `python3 script.py args` would (runpy, __name__ ==
"__main__", the same sys.argv), once per probe, the first from REWIND_REPLAY and each next one
from a line of the probe pipe, writing "exit N" (the script's exit code) after each. A "stop"
line on the probe pipe while a probe runs (its verdict is decided: stop_asked) ends that run of
the script at its next rec.batch or rec.step, as the end of its window would. A probe
then costs its model (built without torch.nn.init's writes: the restore overwrites them), its
restore and its steps; Python, LibTorch, the CUDA context, the kernels' first-use setup and the
checkpoint's read are paid once. At the end of the probes the process exits.

The first process's own model and optimizer stay in memory, unused, while it serves."""
import gc
import os
import runpy
import select
import socket
import stat
import sys
import traceback
import weakref

import torch

SERVE_ENV = "REWIND_SERVE"
SERVE_SOCKET_ENV = "REWIND_SERVE_SOCKET"  # a launcher's rank 0 connects here (the pipes do not reach it)
_START_DIR = os.getcwd()  # where the script was started (`import rewind` comes before any chdir of its own)

_serving = False
_probes_fd = -1    # the probe pipe's read end, while serving
_probe_bytes = b""  # read from it, not yet a whole line
_stop = False       # "stop" came for the probe being run
_checkpoint = None  # (key, {name: tensor}): the checkpoint the last served probe restored


def serving():
    """Whether this process serves a bisect's probes (each a run of the script in it)."""
    return _serving


def _read_probe_pipe(block):
    """Reads what the probe pipe holds (waits for something if `block`); False at its end."""
    global _probe_bytes
    if not block and not select.select([_probes_fd], [], [], 0)[0]:
        return True
    data = os.read(_probes_fd, 65536)
    _probe_bytes += data
    return bool(data)


def _next_probe():
    """The next probe's spec from the probe pipe ("" at its end), past any "stop" left from a
    probe that had ended before the stop came."""
    global _probe_bytes
    while True:
        while b"\n" not in _probe_bytes:
            if not _read_probe_pipe(block=True):
                return ""
        line, _probe_bytes = _probe_bytes.split(b"\n", 1)
        line = line.decode().strip()
        if line and line != "stop":
            return line


def stop_asked():
    """Whether rewind asked the probe being served to end: its verdict is decided on the steps
    reported so far (or a race with other probes is). One select() with no wait a call."""
    global _stop, _probe_bytes
    if not _serving or _stop or _probes_fd < 0:  # (ranks other than 0 hear it from rank 0: Recorder.step)
        return _stop
    if not _read_probe_pipe(block=False):
        _stop = True  # rewind has gone: nothing reads this probe's steps
    lines = _probe_bytes.split(b"\n")
    if any(line.strip() == b"stop" for line in lines[:-1]):
        _stop = True
        kept = [line for line in lines[:-1] if line.strip() != b"stop"]  # (a probe comes only after "exit")
        _probe_bytes = b"".join(line + b"\n" for line in kept) + lines[-1]
    return _stop


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


# torch.nn.init's in-place initializers. During a served probe's run of the script, until its
# rewind.record restores the checkpoint (which overwrites every parameter and buffer of the
# model's state_dict), they leave the tensor as torch.empty made it: drawing gpt2-small's
# weights took 6.7-7.0 s on the dev VM's 2 cores, zero-filling them 4.4-5.6 s (the first touch
# of 500 MB), leaving them 0.1 s. A served probe on an H200 host spent 1.2 of its 2.5 s between
# its start and rewind.record. REWIND_KEEP_INIT=1 keeps the initializers.
_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_real_inits = {}
_skipped = []  # weak references to the tensors the skipping initializers were given


def _skip_init():
    if os.environ.get("REWIND_KEEP_INIT") or _real_inits:
        return
    for name in _INITS:
        real = getattr(torch.nn.init, name, None)
        if real is None:
            continue
        _real_inits[name] = real

        def skip(tensor, *args, **kwargs):
            _skipped.append(weakref.ref(tensor))
            return tensor
        setattr(torch.nn.init, name, skip)


def _restore_inits():
    for name, real in _real_inits.items():
        setattr(torch.nn.init, name, real)
    _real_inits.clear()


def end_skipped_init(state_tensors):
    """The initializers are torch's own again. Raises RuntimeError (a message for the user)
    if a tensor one of them was given is still in use and is none of `state_tensors` (what the
    restore overwrote): the script initializes something its checkpoint does not hold."""
    _restore_inits()
    alive = [t for t in (r() for r in _skipped) if t is not None]
    _skipped.clear()
    restored = {(t.device, t.data_ptr()) for t in state_tensors}
    for t in alive:
        if (t.device, t.data_ptr()) not in restored:
            raise RuntimeError(f"rewind: served probes skip torch.nn.init, and this script initializes a "
                               f"{tuple(t.shape)} tensor that its checkpoint does not restore; set "
                               f"REWIND_KEEP_INIT=1 or use bisect --script-per-probe")


def _exit_code(e):
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1


def _run(script, argv):
    os.chdir(_START_DIR)  # as a new process would start, whatever the last run changed to
    sys.argv = list(argv)
    _skip_init()
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:  # rewind.WindowDone (code 0) at the window's end, or the script's own exit
        return _exit_code(e)
    except BaseException:  # as an uncaught error in a script of its own: printed, status 1
        traceback.print_exc()
        return 1
    finally:
        _restore_inits()  # where the script never restored: torch's own initializers again
        _skipped.clear()


def serve_if_asked(replay_env, begin_probe, ranks=None):
    """Called by a replaying rewind.record: serves the probes and exits if REWIND_SERVE asks
    and the script can run again here; returns otherwise (the process replays the one window
    of the environment's `replay_env`, and rewind starts the script anew for each later probe).
    begin_probe() is called before each run of the script. `ranks` (ranks.Ranks): the ranks of
    a data-parallel script, which serve together (rank 0 over REWIND_SERVE_SOCKET) or not at all."""
    fds = os.environ.pop(SERVE_ENV, None)
    socket_path = os.environ.pop(SERVE_SOCKET_ENV, None)
    script = os.path.join(_START_DIR, sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-") else ""
    # The pipes, where this process has them: a launcher (torchrun) closes them, and the numbers
    # may be other files of this process's now.
    pipes = [int(x) for x in fds.split(",")] if fds else []
    if not all(_is_pipe(fd) for fd in pipes):
        pipes = []
    runnable = os.path.isfile(script)  # not so for python3 -c or a script on stdin: nothing to run again
    if ranks is not None:  # rank 0 connects to the socket, where every rank can serve
        channel = _connect(socket_path) if ranks.root() and socket_path and runnable else None
        can = channel is not None if ranks.root() else bool(socket_path) and runnable
        if not all(ranks.all_objects(can)):
            if channel:
                channel[1].close()
            return
        _serve(replay_env, begin_probe, script, channel, ranks)
    if not runnable:
        for fd in pipes:
            os.close(fd)
        return
    if pipes:
        for fd in pipes:  # not for the script's own child processes
            os.set_inheritable(fd, False)
        _serve(replay_env, begin_probe, script, (pipes[0], os.fdopen(pipes[1], "w", buffering=1)))
    channel = _connect(socket_path) if socket_path else None  # one process under a launcher
    if channel:
        _serve(replay_env, begin_probe, script, channel)


def _is_pipe(fd):
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def _connect(path):
    """(probes fd, replies file, socket) of a connection to rewind's socket; None where it cannot
    be made (this process then replays its one window, and rewind starts it for each probe)."""
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        channel.connect(path)
    except OSError:
        channel.close()
        return None
    channel.set_inheritable(False)
    replies = os.fdopen(os.dup(channel.fileno()), "w", buffering=1)  # line-buffered, as the pipe's (makefile is not)
    os.set_inheritable(replies.fileno(), False)
    return channel.fileno(), replies, channel


def _serve(replay_env, begin_probe, script, channel, ranks=None):
    """Runs the script for each probe until the probes end, then exits the process. `channel`:
    (probes fd, replies file, ...), None on ranks other than 0. Ranks: every rank runs each
    probe; rank 0 reads the probes and replies, and hands each probe on."""
    global _serving, _probes_fd, _stop
    _serving = True
    _probes_fd, replies = channel[:2] if channel else (-1, None)
    argv = list(sys.argv)
    if replies:
        replies.write("serving\n")
    if ranks is not None:
        _keep_process_group()
    spec = os.environ[replay_env]
    while spec:
        os.environ[replay_env] = spec
        _stop = False
        begin_probe()
        code = _run(script, argv)
        gc.collect()  # the probe's model, optimizer and batches: their memory goes back before the next
        sys.stdout.flush()
        sys.stderr.flush()
        if ranks is not None and code != 0:  # the others may wait in a collective: the launcher ends them
            os._exit(code)
        if replies:
            replies.write(f"exit {code}\n")
        spec = _next_probe() if replies else None
        if ranks is not None:  # every rank has ended the probe; rank 0's next one, for all
            spec = ranks.all_objects(spec)[0]
    os._exit(0)  # the first process's frames hold its model: nothing of it is to run


def _keep_process_group():
    """A served rank runs the script again in a process whose default process group exists: its
    init_process_group (and destroy_process_group) calls do nothing from now on."""
    dist = torch.distributed

    def keep(*args, **kwargs):
        return None
    dist.init_process_group = keep
    dist.destroy_process_group = keep
