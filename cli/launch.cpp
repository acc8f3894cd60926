// Rank launcher: fork + exec of /proc/self/exe per local rank, a supervisor that stops this
// node's ranks as soon as one fails, and SIGINT/SIGTERM forwarded to the ranks.
#include "cli/launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/local_port.h"
#include "train/dist.h"

namespace rwd::cli {

namespace {

std::vector<pid_t> g_ranks;  // the supervisor's children, for the signal handler

void forward_signal(int sig) {
  for (pid_t p : g_ranks)
    if (p > 0) kill(p, sig);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// torchrun's default rendezvous port, for a job of several nodes given no --master-port.
constexpr int kDefaultMasterPort = 29500;

}  // namespace

void add_launch_options(cxxopts::Options& opts, const std::string& nproc_help) {
  opts.add_options()
      ("nproc-per-node", "K, the data-parallel ranks on this machine (Gloo on CPU, NCCL with --device cuda); " +
                             nproc_help,
       cxxopts::value<int>())
      ("nnodes", "machines of the job; each starts its ranks with the same flags and its own --node-rank "
                 "(torchrun's meaning)", cxxopts::value<int>()->default_value("1"))
      ("node-rank", "this machine's index, 0..nnodes-1: its ranks are R*K .. R*K+K-1 of nnodes*K",
       cxxopts::value<int>()->default_value("0"))
      ("master-addr", "node 0's address, which every node reaches (needed with --nnodes above 1; "
                      "default 127.0.0.1)", cxxopts::value<std::string>())
      ("master-port", "the rendezvous port on node 0 (default: a free port on one node, 29500 on several)",
       cxxopts::value<int>());
}

LaunchSpec launch_spec(const cxxopts::ParseResult& r, const std::string& cmd, int ranks) {
  LaunchSpec s;
  s.nnodes = r["nnodes"].as<int>();
  s.node_rank = r["node-rank"].as<int>();
  if (s.nnodes < 1) throw UsageError(cmd + ": --nnodes must be at least 1");
  if (s.node_rank < 0 || s.node_rank >= s.nnodes)
    throw UsageError(cmd + ": --node-rank " + std::to_string(s.node_rank) + " is not a node of --nnodes " +
                     std::to_string(s.nnodes) + " (0.." + std::to_string(s.nnodes - 1) + ")");
  const bool given = r.count("nproc-per-node") > 0;
  if (given) {
    s.nproc = r["nproc-per-node"].as<int>();
    if (s.nproc < 1) throw UsageError(cmd + ": --nproc-per-node must be at least 1");
  } else if (!inside_job() && ranks > 0) {
    if (ranks % s.nnodes != 0)
      throw UsageError(cmd + ": the recording's " + std::to_string(ranks) +
                       " ranks do not split evenly over --nnodes " + std::to_string(s.nnodes) +
                       "; give --nproc-per-node");
    s.nproc = ranks / s.nnodes;
  }
  if (r.count("master-addr")) s.master_addr = r["master-addr"].as<std::string>();
  if (r.count("master-port")) {
    s.master_port = r["master-port"].as<int>();
    if (s.master_port < 1 || s.master_port > 65535) throw UsageError(cmd + ": --master-port must be 1..65535");
  }
  if (s.nnodes > 1 && s.master_addr.empty())
    throw UsageError(cmd + ": --nnodes " + std::to_string(s.nnodes) +
                     " needs --master-addr, node 0's address, which every node reaches");
  if (s.nnodes > 1 && s.master_port == 0) s.master_port = kDefaultMasterPort;
  // A rank of a job (started by this launcher, torchrun or srun) takes its place from the
  // environment; flags that say otherwise are a mistake, not something to override.
  if (inside_job() && given) {
    const train::DistEnv env = train::DistEnv::from_env();
    if (env.world != s.world() || env.rank / s.nproc != s.node_rank)
      throw UsageError(cmd + ": --nnodes " + std::to_string(s.nnodes) + " --node-rank " + std::to_string(s.node_rank) +
                       " --nproc-per-node " + std::to_string(s.nproc) + " do not describe this process, rank " +
                       std::to_string(env.rank) + " of a job of " + std::to_string(env.world) +
                       " that a launcher started (torchrun, srun or rewind's own); leave them to the launcher");
  }
  return s;
}

bool inside_job() { return train::DistEnv::in_job(); }

void quiet_unless_rank0(int rank) {
  if (rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    throw Error(ExitCode::kInternal, "cannot silence rank " + std::to_string(rank) + "'s stdout");
}

int launch_ranks(const LaunchSpec& s, int argc, char** argv) {
  const int nproc = s.nproc;
  const std::string addr = s.master_addr.empty() ? "127.0.0.1" : s.master_addr;
  const std::string port = std::to_string(s.master_port != 0 ? s.master_port : free_local_port());
  std::vector<std::string> args{"rewind"};
  for (int i = 0; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  g_ranks.assign(static_cast<size_t>(nproc), 0);
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      forward_signal(SIGKILL);
      throw Error(ExitCode::kInternal, "launch: fork failed for rank " + std::to_string(r));
    }
    if (pid == 0) {
      setenv("RANK", std::to_string(s.node_rank * nproc + r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(s.world()).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(s.node_rank).c_str(), 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      execv("/proc/self/exe", cargs.data());
      std::fprintf(stderr, "rewind: error: launch: exec failed for rank %d: %s\n", r, std::strerror(errno));
      _exit(1);
    }
    g_ranks[static_cast<size_t>(r)] = pid;
  }
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  int result = 0, alive = nproc;
  bool stopping = false;
  auto stop_at = std::chrono::steady_clock::time_point::max();
  while (alive > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pid == 0) {  // stopping: give the ranks a moment to end on SIGTERM, then kill them
      if (std::chrono::steady_clock::now() > stop_at) forward_signal(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    --alive;
    int local = 0;
    for (int r = 0; r < nproc; ++r)
      if (g_ranks[static_cast<size_t>(r)] == pid) {
        local = r;
        g_ranks[static_cast<size_t>(r)] = 0;
      }
    const int code = exit_code_of(status);
    if (code != 0 && result == 0 && WIFSIGNALED(status))  // a rank that exits on an error says why itself
      std::fprintf(stderr, "rewind: error: rank %d was killed by signal %d (%s); stopping this node's other ranks\n",
                   s.node_rank * nproc + local, WTERMSIG(status), strsignal(WTERMSIG(status)));
    if (code != 0 && result == 0) {
      result = code;
      stopping = true;
      stop_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      forward_signal(SIGTERM);
    }
  }
  g_ranks.clear();
  return result;
}

}  // namespace rwd::cli
