// One process of the user's script serving bisect --cmd's probes (cli/script_server.h).
#include "cli/script_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common/error.h"
#include "common/fd_io.h"
#include "common/switches.h"

namespace rwd::cli {

namespace {

// The descriptors a serving script reads its probes from and writes its replies to
// (spawn_script moves the pipes' ends there).
constexpr int kProbeFd = 3, kReplyFd = 4;

// How often the report of a probe is read while it runs (its steps judged as they come).
constexpr int kPumpMs = 2;

// The steps a script has written to its report so far, read as the file grows: whole lines only.
class ReportTail {
 public:
  explicit ReportTail(const std::string& path) : fd_(open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~ReportTail() {
    if (fd_ >= 0) close(fd_);
  }
  ReportTail(const ReportTail&) = delete;
  ReportTail& operator=(const ReportTail&) = delete;
  // Calls `f` with each step reported since the last call.
  template <class F>
  void read_new(F&& f) {
    char buf[65536];
    ssize_t n;
    while (fd_ >= 0 && (n = read(fd_, buf, sizeof buf)) > 0) bytes_.append(buf, static_cast<size_t>(n));
    size_t begin = 0;
    for (size_t nl; (nl = bytes_.find('\n', begin)) != std::string::npos; begin = nl + 1)
      if (const std::optional<ScriptStep> s = report_step(bytes_.substr(begin, nl - begin))) f(*s);
    bytes_.erase(0, begin);
  }

 private:
  int fd_;
  std::string bytes_;  // read, not yet a whole line
};

}  // namespace

ScriptServer::~ScriptServer() { stop(); }

void ScriptServer::stop() {
  if (to_ >= 0) close(to_);  // the script reads the end of its probes and exits
  if (from_ >= 0 && from_ != to_) close(from_);
  to_ = from_ = -1;
  close_socket();
  if (pid_ > 0) waitpid(pid_, nullptr, WNOHANG);  // collected now if it has ended, else by init
  pid_ = -1;
  replies_.clear();
}

int ScriptServer::wait_ended() {
  const pid_t pid = pid_;
  pid_ = -1;
  try {
    return wait_script(pid, "bisect --cmd");
  } catch (const Error&) {
    return 1;
  }
}

void ScriptServer::close_socket() {
  if (listen_ >= 0) close(listen_);
  listen_ = -1;
  if (!socket_dir_.empty()) {
    unlink((socket_dir_ + "/s").c_str());
    rmdir(socket_dir_.c_str());
    socket_dir_.clear();
  }
}

void ScriptServer::take_connection() {
  const int c = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return;
  close_socket();
  if (to_ >= 0) close(to_);  // the launcher holds the pipes' other ends: they stay unused
  if (from_ >= 0) close(from_);
  to_ = from_ = c;
}

int ScriptServer::read_reply(const std::function<void()>& pump) {
  for (;;) {
    if (listen_ >= 0) {  // the pipe's end (the launcher ended) or rank 0's connection, whichever comes
      pollfd fds[2] = {{from_, POLLIN, 0}, {listen_, POLLIN, 0}};
      const int ready = poll(fds, 2, pump ? kPumpMs : -1);
      if (ready < 0 && errno != EINTR) return -1;
      if (pump) pump();
      if (ready > 0 && (fds[1].revents & POLLIN)) take_connection();
      if (ready <= 0 || !(fds[0].revents & (POLLIN | POLLHUP)) || listen_ < 0) continue;
    }
    const size_t nl = replies_.find('\n');
    if (nl != std::string::npos) {
      const std::string line = replies_.substr(0, nl);
      replies_.erase(0, nl + 1);
      if (line.rfind("exit ", 0) == 0) return std::atoi(line.c_str() + 5);
      if (line == "serving") {
        serving_ = true;
        close_socket();  // it serves over the pipes (over the socket, that is closed already)
      }
      continue;  // or a line of a newer rewind package
    }
    if (pump) {
      pollfd fd = {from_, POLLIN, 0};
      const int ready = poll(&fd, 1, kPumpMs);
      if (ready < 0 && errno != EINTR) return -1;
      pump();
      if (ready <= 0) continue;
    }
    char buf[256];
    const ssize_t n = read(from_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    replies_.append(buf, static_cast<size_t>(n));
  }
}

void ScriptServer::start(const ScriptWindowRequest& r, const std::string& spec, bool serving) {
  int probes[2] = {-1, -1}, replies[2] = {-1, -1};
  if (serving && (pipe2(probes, O_CLOEXEC) != 0 || pipe2(replies, O_CLOEXEC) != 0))
    throw Error(ExitCode::kInternal, r.what + ": pipe failed: " + std::string(std::strerror(errno)));
  std::vector<std::pair<std::string, std::string>> set = env_;
  set.emplace_back("REWIND_REPLAY", spec);
  if (serving) {
    set.emplace_back("REWIND_SERVE", std::to_string(kProbeFd) + "," + std::to_string(kReplyFd));
    close_socket();
    const char* dir = switches::external("TMPDIR");
    std::string tmpl = std::string(dir ? dir : "/tmp") + "/rewind-serve-XXXXXX";
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    if (tmpl.size() + 2 < sizeof addr.sun_path && mkdtemp(tmpl.data()) != nullptr) {
      socket_dir_ = tmpl;
      const std::string path = tmpl + "/s";
      std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
      listen_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (listen_ >= 0 && bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 && listen(listen_, 1) == 0)
        set.emplace_back("REWIND_SERVE_SOCKET", path);
      else
        close_socket();  // no socket: a launcher's ranks run a probe each, as before
    }
  }
  std::signal(SIGPIPE, SIG_IGN);  // a script that died: our write fails instead of killing us
  const pid_t pid = spawn_script(r.cmd, set, r.quiet, r.what, serving ? std::make_pair(probes[0], replies[1])
                                                                      : std::make_pair(-1, -1));
  pid_ = pid;
  serving_ = false;
  ++started_;
  if (serving) {
    close(probes[0]);
    close(replies[1]);
    to_ = probes[1];
    from_ = replies[0];
  }
}

ScriptWindow ScriptServer::run(const ScriptWindowRequest& r, const StepSink& on_step) {
  ReportFile report(r.what);
  const std::string spec = script_window_spec(r, report.path);
  size_t told = 0;        // steps given to on_step
  bool enough = !on_step;  // on_step said so (or there is none)
  const auto tell = [&](const ScriptStep& s) {
    if (enough) return;
    ++told;
    if (!on_step(s)) return;
    enough = true;
    if (to_ >= 0 && stops_) write_all(to_, "stop\n");  // a script that has ended: its reply says so
  };
  // The steps read_script_window found that on_step was not told while the script ran.
  const auto tell_rest = [&](const ScriptWindow& w) {
    for (size_t i = told; i < w.steps.size() && !enough; ++i) tell(w.steps[i]);
    return w;
  };
  if (!serve_) {
    start(r, spec, false);
    const int rc = wait_ended();
    return tell_rest(read_script_window(r, report.path, rc));
  }
  ReportTail tail(report.path);
  if (pid_ < 0) {
    start(r, spec, true);
  } else if (!write_all(to_, spec + "\n")) {
    stop();  // ended after its last probe: start it again for this one
    start(r, spec, true);
  }
  int rc = read_reply(on_step ? std::function<void()>([&] { tail.read_new(tell); }) : std::function<void()>());
  if (rc < 0) {  // it ended inside the probe (killed, os._exit), or it cannot serve (it ran one probe)
    serve_ = serving_;  // one that never served will not: start the script for each probe
    rc = wait_ended();
    stop();
  }
  return tell_rest(read_script_window(r, report.path, rc));
}

}  // namespace rwd::cli
