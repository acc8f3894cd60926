// Progress reporting for long loops: a rewritten line on a terminal, plain periodic lines
// otherwise (logs, CI). No LibTorch.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace rwd {

class Progress {
 public:
  Progress(std::string label, int64_t total, double plain_every_s = 10.0)
      : label_(std::move(label)), total_(total), every_(plain_every_s),
        tty_(isatty(fileno(stderr))), t0_(std::chrono::steady_clock::now()), last_(t0_) {}

  // `done` units finished; `extra` is appended (e.g. "loss 3.21").
  void update(int64_t done, const std::string& extra = "") {
    auto now = std::chrono::steady_clock::now();
    const double el = std::chrono::duration<double>(now - t0_).count();
    if (done > total_) total_ = done;  // the total was an estimate that turned out low
    const bool final = done >= total_;
    if (!tty_ && !final && std::chrono::duration<double>(now - last_).count() < every_) return;
    last_ = now;
    const double rate = el > 0.5 ? done / el : 0.0;  // no rate from the first instants
    const double eta = rate > 0 ? (total_ - done) / rate : 0.0;
    std::fprintf(stderr, "%s%s %lld/%lld  %.2f/s  elapsed %.0fs  ETA %.0fs  %s%s", tty_ ? "\r\033[K" : "",
                 label_.c_str(), static_cast<long long>(done), static_cast<long long>(total_), rate, el,
                 eta, extra.c_str(), tty_ ? "" : "\n");
    if (tty_ && final) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  int64_t total_;
  double every_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_, last_;
};

}  // namespace rwd
