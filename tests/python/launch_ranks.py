"""A stand-in for `torchrun --standalone --nproc_per_node N` in the CPU tests (Debian's torchrun
of torch 1.13 fails on Python 3.11 before it starts a rank): starts N copies of a command with
torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), and as torchrun does, stops the others when one fails and exits with its status.

    python3 launch_ranks.py 2 python3 train_gpt.py --store run.db
"""
import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    n, cmd = int(sys.argv[1]), sys.argv[2:]
    env = {**os.environ, "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    ranks = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(n)]
    status = 0
    while ranks:
        for p in list(ranks):
            rc = p.poll()
            if rc is None:
                continue
            ranks.remove(p)
            if rc != 0 and status == 0:
                status = rc if rc > 0 else 1
                for q in ranks:
                    q.terminate()
        time.sleep(0.01)
    sys.exit(status)


if __name__ == "__main__":
    main()
