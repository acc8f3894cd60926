// Shared by the end-to-end tests: run the built `rewind` binary through the shell and capture
// its output and exit code. The binary path comes from the REWIND_BIN compile definition.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace rwd::testing {

struct Cmd {
  int code = -1;
  std::string out;  // stdout and stderr
};

// Runs a shell command line, stderr folded into stdout.
inline Cmd run_shell(const std::string& line) {
  Cmd c;
  FILE* p = popen((line + " 2>&1").c_str(), "r");
  if (!p) return c;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  int st = pclose(p);
  c.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return c;
}

// Runs `rewind ARGS`; ARGS are pasted verbatim (quote them yourself).
inline Cmd rewind_cmd(const std::string& args) { return run_shell(std::string(REWIND_BIN) + " " + args); }

// Starts a shell command line without waiting for it; the returned pid is the command's own
// (the shell execs it), for tests that kill it mid-run.
inline pid_t spawn_shell(const std::string& line) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + line).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

inline std::string temp_dir(const std::string& tag) {
  std::string t = "/tmp/rewind_" + tag + "_XXXXXX";
  if (!mkdtemp(t.data())) std::abort();
  return t;
}

inline void remove_tree(const std::string& dir) {
  if (std::system(("rm -rf '" + dir + "'").c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", dir.c_str());
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace rwd::testing
