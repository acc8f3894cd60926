// rewind's own launcher: `--nproc-per-node K` ranks on this machine, and with `--nnodes N
// --node-rank R --master-addr A` the ranks of node R of a job of N such nodes (torchrun's flags,
// torchrun's meanings and environment).
#pragma once

#include <cxxopts.hpp>
#include <string>

namespace rwd::cli {

// Where the launcher puts a command's ranks: K ranks on each of N nodes, this one node R; rank
// R*K + l is local rank l here, WORLD_SIZE is N*K.
struct LaunchSpec {
  int nproc = 1;            // --nproc-per-node K
  int nnodes = 1;           // --nnodes N
  int node_rank = 0;        // --node-rank R
  std::string master_addr;  // node 0's address, which every node reaches; on one node 127.0.0.1
  int master_port = 0;      // 0 on one node: a free local port; 29500 (torchrun's) on several

  int world() const { return nproc * nnodes; }
};

// Adds --nproc-per-node (`nproc_help` says what it defaults to), --nnodes, --node-rank,
// --master-addr and --master-port.
void add_launch_options(cxxopts::Options& opts, const std::string& nproc_help);
// The launch flags of `cmd`, checked: a node rank outside the job, several nodes without
// --master-addr, or flags that contradict the job this process already is a rank of, are
// UsageErrors. `ranks`: the job's size without --nproc-per-node, split evenly over the nodes
// (the recording's for replay and bisect); 0: one rank a node (a new run).
LaunchSpec launch_spec(const cxxopts::ParseResult& r, const std::string& cmd, int ranks);

// True when this process is already one rank of a job (WORLD_SIZE set by a launcher or torchrun,
// or Slurm's task variables with MASTER_ADDR).
bool inside_job();
// True when this process is to start ranks itself: not a rank yet, and more than one in the job.
inline bool launches(const LaunchSpec& s) { return !inside_job() && s.world() > 1; }
// In a job, ranks other than 0 print nothing on stdout (their step lines repeat rank 0's);
// errors still reach stderr.
void quiet_unless_rank0(int rank);

// Re-executes this binary with `args` (argv of the subcommand, args[0] its name) as this node's
// s.nproc ranks with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR, MASTER_PORT), and waits. When one rank fails (non-zero exit or a
// signal) the node's others are stopped (SIGTERM, then SIGKILL); ranks on other nodes see the
// collectives fail (a peer that ended, or the REWIND_DIST_TIMEOUT), so a job never hangs on a
// dead peer. Returns the exit code of the first rank that failed, or 0 (a rank killed by
// signal S counts as 128 + S).
int launch_ranks(const LaunchSpec& s, int argc, char** argv);

}  // namespace rwd::cli
