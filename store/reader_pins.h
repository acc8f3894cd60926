// Reader pins: a replay's or a bisect's claim on the checkpoints it is about to read,
// kept outside the store file, so that `store thin` (and a recording's retention) keeps them.
//
// Design, once:
// 1. A pin is a small text file STORE-readers/PID-N beside the store (like STORE-lock and
//    SQLite's -wal): the reader's pid and start time, its name, its run and the steps it
//    replays from. The store file itself is never written: a reader may be read-only.
// 2. A reader writes its pin before it reads a checkpoint and removes it when it ends. The pin
//    of a process that has died (kill -9 included) holds nothing: its pid is gone, a zombie,
//    or another process's now (its start time differs).
// 3. Store::thin holds ReadersLock, an exclusive flock() on the STORE-readers directory, from
//    planning to commit; a reader writes its pin under a shared one. So a pin is either seen
//    by the thin or written after the thin committed, when the reader finds the store thinned.
// 4. Pinning is best effort: where the directory cannot be written (read-only mount, full
//    disk), the reader reads unpinned and nothing fails.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rwd::store {

// STORE-readers: the directory of the pins of the store at `store_path` (symlinks resolved).
std::string readers_dir(const std::string& store_path);

class ReaderPin {
 public:
  // Pins the checkpoint at or before each of `from_steps` in run `run` (what replaying from
  // that step needs); no steps: every checkpoint of the run; run 0: of every run. `what` names
  // the reader in thin's line ("in use by bisect (process 4242)"); "" takes it from the command
  // line (rewind's subcommand, else the program's name). Waits while a thin is deleting.
  ReaderPin(const std::string& store_path, int64_t run, const std::vector<int64_t>& from_steps,
            const std::string& what = "");
  ~ReaderPin();  // removes the pin, and the directory when no pin is left
  ReaderPin(const ReaderPin&) = delete;
  ReaderPin& operator=(const ReaderPin&) = delete;

  bool held() const { return !file_.empty(); }  // false: the pin could not be written
  const std::string& file() const { return file_; }

 private:
  std::string dir_;
  std::string file_;
};

// The checkpoints of `run` (`checkpoints`, ascending) that live pins need, each with the first
// reason found: "in use by bisect (process 4242)". Pins of dead processes and unreadable files
// are ignored. Reads only.
std::map<int64_t, std::string> reader_pins(const std::string& store_path, int64_t run,
                                           const std::vector<int64_t>& checkpoints);

// Held by Store::thin from planning to commit (design point 3): blocks while a reader writes
// its pin, and removes the pins of dead processes. Without a writable directory it holds
// nothing (no reader can have pinned there either).
class ReadersLock {
 public:
  explicit ReadersLock(const std::string& store_path);
  ~ReadersLock();  // removes the directory when no pin is left
  ReadersLock(const ReadersLock&) = delete;
  ReadersLock& operator=(const ReadersLock&) = delete;

 private:
  std::string dir_;
  int fd_ = -1;
};

}  // namespace rwd::store
