// What /proc/PID/stat says of a process: its state and its start time (Linux; nothing elsewhere).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>

namespace rwd {

struct ProcStat {
  char state = '?';          // 'R', 'S', ... 'Z' (a zombie: dead, not yet reaped)
  uint64_t start_ticks = 0;  // start time, clock ticks (sysconf(_SC_CLK_TCK)) since boot
};

// `pid`: a process id, or "self". nullopt where /proc has no such process or cannot be read.
inline std::optional<ProcStat> read_proc_stat(const std::string& pid) {
  std::ifstream f("/proc/" + pid + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  ProcStat out;
  for (int i = 3; i <= 22 && rest >> field; ++i) {  // fields 3 (state) .. 22 (starttime)
    if (i == 3) out.state = field.empty() ? '?' : field[0];
    if (i == 22) {
      out.start_ticks = std::strtoull(field.c_str(), nullptr, 10);
      return out;
    }
  }
  return std::nullopt;
}

}  // namespace rwd
