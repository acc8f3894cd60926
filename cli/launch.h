// `--nproc-per-node N`: run a command as N local data-parallel ranks (torchrun's environment).
#pragma once

namespace rwd::cli {

// True when this process is already one rank of a job (WORLD_SIZE set by a launcher or torchrun).
bool inside_job();
// In a job, ranks other than 0 print nothing on stdout (their step lines repeat rank 0's);
// errors still reach stderr.
void quiet_unless_rank0(int rank);

// Re-executes this binary with `args` (argv of the subcommand, args[0] its name) as `nproc` local
// ranks with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, and waits.
// When one rank fails (non-zero exit or a signal) the others are stopped (SIGTERM, then SIGKILL),
// so a job never hangs on a dead peer. Returns the exit code of the first rank that failed, or 0
// (a rank killed by signal S counts as 128 + S).
int launch_local_ranks(int nproc, int argc, char** argv);

}  // namespace rwd::cli
