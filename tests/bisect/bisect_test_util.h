// Helpers for the end-to-end bisect tests: run the built `rewind` binary, record small faulty
// runs, read report.json. The binary path comes from the REWIND_BIN compile definition.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace rwd::bisect::testing {

struct Cmd {
  int code = -1;
  std::string out;  // stdout and stderr
};

// Runs `rewind ARGS` through the shell; ARGS are pasted verbatim (quote them yourself).
inline Cmd rewind_cmd(const std::string& args) {
  const std::string line = std::string(REWIND_BIN) + " " + args + " 2>&1";
  Cmd c;
  FILE* p = popen(line.c_str(), "r");
  if (!p) return c;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) c.out.append(buf, n);
  int st = pclose(p);
  c.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return c;
}

inline std::string temp_dir(const std::string& tag) {
  std::string t = "/tmp/rewind_" + tag + "_XXXXXX";
  if (!mkdtemp(t.data())) std::abort();
  return t;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// The tiny model every test records: 2 layers x 4 heads, width 64, sequence 64, vocab 64.
// Calibrated faults (lr 0.01, fault switched on at step 20 with --plan-from, window 20:39):
// the clean run keeps max(loss) <= 2.25, while o=fault(strength=4096) on one head reaches
// 3.8-5.0 and pv/delta=fault(strength=25600) 3.6-4.2, so `max(loss) > 3` separates them.
// Smaller strengths (o < 1024, pv < 2560) and every qk/softmax fault barely move the loss.
inline std::string train_args(const std::string& data, const std::string& store, int steps,
                              int ckpt_every, const std::string& extra) {
  return "train --data " + data + " --record " + store + " --steps " + std::to_string(steps) +
         " --checkpoint-every " + std::to_string(ckpt_every) + " --vocab-size 64 --log-every 1000 " + extra;
}

}  // namespace rwd::bisect::testing
