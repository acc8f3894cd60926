// Reader pins: the pin files under STORE-readers, whether their processes live, and the flock()
// on the directory that orders a reader's pin against a thin (reader_pins.h, design point 3).
#include "store/reader_pins.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "common/fd_io.h"      // defines: write_all
#include "common/proc_stat.h"  // defines: read_proc_stat (state, start time)

namespace rwd::store {
namespace {

constexpr const char* kMagic = "rewind reader pin 1";

struct Pin {
  int64_t pid = 0;
  uint64_t start = 0;  // /proc start ticks; 0 where /proc could not say
  int64_t run = 0;     // 0: every run
  bool all = false;    // every checkpoint of the run
  std::vector<int64_t> steps;
  std::string what;
};

std::string pin_text(const Pin& p) {
  std::string s = std::string(kMagic) + "\npid " + std::to_string(p.pid) + "\nstart " + std::to_string(p.start) +
                  "\nrun " + std::to_string(p.run) + "\nsteps";
  if (p.all) s += " all";
  for (int64_t step : p.steps) s += " " + std::to_string(step);
  return s + "\nwhat " + p.what + "\n";
}

// A pin file's contents, or nullopt for anything else (a foreign or damaged file).
std::optional<Pin> read_pin(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line) || line != kMagic) return std::nullopt;
  Pin p;
  int fields = 0;
  while (std::getline(f, line)) {
    const size_t sp = line.find(' ');
    const std::string key = line.substr(0, sp), value = sp == std::string::npos ? "" : line.substr(sp + 1);
    std::istringstream in(value);
    if (key == "pid" && in >> p.pid) ++fields;
    if (key == "start" && in >> p.start) ++fields;
    if (key == "run" && in >> p.run) ++fields;
    if (key == "what") p.what = value;
    if (key != "steps") continue;
    ++fields;
    std::string word;
    while (in >> word) {
      char* end = nullptr;
      const long long v = std::strtoll(word.c_str(), &end, 10);
      if (word == "all") p.all = true;
      else if (end && *end == '\0') p.steps.push_back(v);
      else return std::nullopt;
    }
  }
  if (fields != 4) return std::nullopt;
  return p;
}

// Whether process `pid`, started at `start` ticks (0: unknown), still runs: it exists (kill(pid, 0)
// succeeds, or is refused for another user's process), is no zombie, and started when the pin says.
bool alive(int64_t pid, uint64_t start) {
  if (pid <= 0 || pid > INT_MAX) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  const std::optional<ProcStat> now = read_proc_stat(std::to_string(pid));
  if (!now) return true;  // no /proc to ask: kill's word stands
  if (now->state == 'Z' || now->state == 'X') return false;
  return start == 0 || now->start_ticks == start;  // else another process took the pid since
}

// The name a pin gives its reader: rewind's subcommand ("bisect" for `rewind bisect` and its
// `bisect __probe` workers), else the program's file name ("python3").
std::string reader_name() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < all.size();) {
    const size_t end = std::min(all.find('\0', at), all.size());
    args.push_back(all.substr(at, end - at));
    at = end + 1;
  }
  if (args.empty() || args[0].empty()) return "a reader";
  const std::string prog = args[0].substr(args[0].rfind('/') + 1);
  if (prog == "rewind" && args.size() > 1 && !args[1].empty() && args[1][0] != '-') return args[1];
  return prog;
}

bool same_file(int fd, const std::string& path) {
  struct stat held, there;
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &there) == 0 && held.st_ino == there.st_ino &&
         held.st_dev == there.st_dev;
}

// flock(op) on the directory `dir`, made when missing and checked, once locked, to be the one at
// that path (an empty one is removed under LOCK_EX, and may be made again meanwhile). -1 when
// the directory cannot be made or opened, or a LOCK_NB lock is held elsewhere.
int lock_dir(const std::string& dir, int op) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) return -1;
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) continue;
    if (fd < 0) return -1;
    int rc = 0;
    while ((rc = ::flock(fd, op)) != 0 && errno == EINTR) {
    }
    if (rc == 0 && same_file(fd, dir)) return fd;
    ::close(fd);
    if (rc != 0) return -1;
  }
  return -1;
}

// Removes `dir` when it holds no pin and no one has it locked; never waits.
void remove_if_empty(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && same_file(fd, dir)) ::rmdir(dir.c_str());
  ::close(fd);
}

// The names in `dir`, sorted ("" entries and . and .. left out).
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string readers_dir(const std::string& store_path) {
  char* real = ::realpath(store_path.c_str(), nullptr);
  const std::string path = real ? real : store_path;
  std::free(real);
  return path + "-readers";
}

ReaderPin::ReaderPin(const std::string& store_path, int64_t run, const std::vector<int64_t>& from_steps,
                     const std::string& what) {
  // An in-memory database or a URI has no place beside it.
  if (store_path.empty() || store_path[0] == ':' || store_path.rfind("file:", 0) == 0) return;
  dir_ = readers_dir(store_path);
  static std::atomic<int> serial{0};
  Pin p;
  p.pid = ::getpid();
  if (const std::optional<ProcStat> self = read_proc_stat("self")) p.start = self->start_ticks;
  p.run = run;
  p.all = from_steps.empty();
  p.steps = from_steps;
  p.what = what.empty() ? reader_name() : what;
  std::replace(p.what.begin(), p.what.end(), '\n', ' ');
  const std::string name = std::to_string(p.pid) + "-" + std::to_string(serial++);
  const int dir_fd = lock_dir(dir_, LOCK_SH);
  if (dir_fd < 0) return;
  // Written under a temporary name and renamed: `store info` reads pins without the lock.
  const std::string tmp = dir_ + "/." + name + ".tmp", final_name = dir_ + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write_all(fd, pin_text(p));
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (ok && ::rename(tmp.c_str(), final_name.c_str()) == 0) {
    file_ = final_name;
  } else {
    ::unlink(tmp.c_str());
  }
  ::close(dir_fd);
  if (file_.empty()) remove_if_empty(dir_);
}

ReaderPin::~ReaderPin() {
  if (file_.empty()) return;
  ::unlink(file_.c_str());  // dropping a pin needs no lock: it only ever lets a thin remove more
  remove_if_empty(dir_);
}

std::map<int64_t, std::string> reader_pins(const std::string& store_path, int64_t run,
                                           const std::vector<int64_t>& checkpoints) {
  const std::string dir = readers_dir(store_path);
  std::map<int64_t, std::string> need;  // checkpoint step -> the first reason found
  for (const std::string& name : entries(dir)) {
    if (name[0] == '.') continue;  // being written
    const std::optional<Pin> p = read_pin(dir + "/" + name);
    if (!p || (p->run != 0 && p->run != run) || !alive(p->pid, p->start)) continue;
    const std::string why = "in use by " + p->what + " (process " + std::to_string(p->pid) + ")";
    if (p->all)
      for (int64_t c : checkpoints) need.emplace(c, why);
    for (int64_t from : p->steps) {
      const auto it = std::upper_bound(checkpoints.begin(), checkpoints.end(), from);
      if (it != checkpoints.begin()) need.emplace(*(it - 1), why);
    }
  }
  return need;
}

ReadersLock::ReadersLock(const std::string& store_path) : dir_(readers_dir(store_path)) {
  fd_ = lock_dir(dir_, LOCK_EX);
  if (fd_ < 0) return;
  // No reader is writing now: every file is whole. Those of dead processes go.
  for (const std::string& name : entries(dir_)) {
    const bool tmp = name[0] == '.';
    char* end = nullptr;
    const long long pid = std::strtoll(name.c_str() + (tmp ? 1 : 0), &end, 10);
    if (!end || *end != '-') continue;  // not a pin's name
    const std::optional<Pin> p = tmp ? std::nullopt : read_pin(dir_ + "/" + name);
    if (!alive(pid, p ? p->start : 0)) ::unlink((dir_ + "/" + name).c_str());
  }
}

ReadersLock::~ReadersLock() {
  if (fd_ < 0) return;
  ::rmdir(dir_.c_str());  // only when no pin is left; we hold LOCK_EX, so no reader is adding one
  ::close(fd_);
}

}  // namespace rwd::store
