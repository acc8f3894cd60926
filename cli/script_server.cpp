// One process of the user's script serving bisect --cmd's probes (cli/script_server.h).
#include "cli/script_server.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/fd_io.h"

namespace rwd::cli {

ScriptServer::~ScriptServer() { stop(); }

void ScriptServer::stop() {
  if (to_ >= 0) close(to_);  // the script reads the end of its probes and exits
  if (from_ >= 0) close(from_);
  to_ = from_ = -1;
  if (pid_ > 0) waitpid(pid_, nullptr, WNOHANG);  // collected now if it has ended, else by init
  pid_ = -1;
  replies_.clear();
}

int ScriptServer::wait_ended() {
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0)
    if (errno != EINTR) return 1;
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}

int ScriptServer::read_reply() {
  for (;;) {
    const size_t nl = replies_.find('\n');
    if (nl != std::string::npos) {
      const std::string line = replies_.substr(0, nl);
      replies_.erase(0, nl + 1);
      if (line.rfind("exit ", 0) == 0) return std::atoi(line.c_str() + 5);
      serving_ |= line == "serving";
      continue;  // or a line of a newer rewind package
    }
    char buf[256];
    const ssize_t n = read(from_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    replies_.append(buf, static_cast<size_t>(n));
  }
}

ScriptWindow ScriptServer::run(const ScriptWindowRequest& r) {
  if (!serve_) return run_script_window(r);
  ReportFile report(r.what);
  const std::string spec = script_window_spec(r, report.path);
  if (pid_ < 0) {
    int probes[2], replies[2];
    if (pipe(probes) != 0 || pipe(replies) != 0)
      throw Error(ExitCode::kInternal, r.what + ": pipe failed: " + std::string(std::strerror(errno)));
    std::signal(SIGPIPE, SIG_IGN);  // a script that died: our write fails instead of killing us
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) throw Error(ExitCode::kInternal, r.what + ": fork failed: " + std::string(std::strerror(errno)));
    if (pid == 0) {
      close(probes[1]);
      close(replies[0]);
      setenv("REWIND_REPLAY", spec.c_str(), 1);
      setenv("REWIND_SERVE", (std::to_string(probes[0]) + "," + std::to_string(replies[1])).c_str(), 1);
      if (r.quiet) {
        const int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDOUT_FILENO);
      }
      execl("/bin/sh", "sh", "-c", r.cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(probes[0]);
    close(replies[1]);
    fcntl(probes[1], F_SETFD, FD_CLOEXEC);
    fcntl(replies[0], F_SETFD, FD_CLOEXEC);
    pid_ = pid;
    to_ = probes[1];
    from_ = replies[0];
    serving_ = false;
    ++started_;
  } else if (!write_all(to_, spec + "\n")) {
    stop();  // ended after its last probe: start it again for this one
    return run(r);
  }
  int rc = read_reply();
  if (rc < 0) {  // it ended inside the probe (killed, os._exit), or it cannot serve (it ran one probe)
    serve_ = serving_;  // one that never served will not: start the script for each probe
    rc = wait_ended();
    stop();
  }
  return read_script_window(r, report.path, rc);
}

}  // namespace rwd::cli
