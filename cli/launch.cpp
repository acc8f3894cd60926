// Local rank launcher: fork + exec of /proc/self/exe per rank, a supervisor that stops the job
// as soon as one rank fails, and SIGINT/SIGTERM forwarded to the ranks.
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

}  // namespace

bool inside_job() {
  const char* w = std::getenv("WORLD_SIZE");
  return w != nullptr && *w != '\0';
}

void quiet_unless_rank0(int rank) {
  if (rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
    throw Error(ExitCode::kInternal, "cannot silence rank " + std::to_string(rank) + "'s stdout");
}

int launch_local_ranks(int nproc, int argc, char** argv) {
  if (nproc < 1) throw UsageError("--nproc-per-node must be at least 1");
  const std::string port = std::to_string(free_local_port());
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
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
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
    for (pid_t& p : g_ranks)
      if (p == pid) p = 0;
    const int code = exit_code_of(status);
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
