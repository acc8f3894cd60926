// Background store threads yield the CPU to training: the step and checkpoint writers, their
// compression workers (created by them, so they inherit it) and the WAL checkpointer lower
// their own priority by REWIND_WRITER_NICE nice levels (default 10; 0 keeps it). A training
// step is partly host-bound (the host queues the GPU's work), so a core taken by compression
// can stretch the step while a checkpoint is written.
#pragma once

#include <algorithm>
#include <cerrno>

#include "common/error.h"
#include "common/switches.h"

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rwd::store {

// On Linux the nice value is per thread: this changes the calling thread only. Failures
// (a sandbox refusing setpriority) leave the priority as it was.
inline void yield_to_training() {
#if defined(__linux__)
  int by = 0;
  try {
    by = static_cast<int>(switches::integer(switches::Switch::kWriterNice));
  } catch (const Error&) {
    return;  // a writer thread cannot report it; the process's start refused it (check_all)
  }
  if (by <= 0) return;
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  (void)setpriority(PRIO_PROCESS, tid, std::min(19, now + by));
#endif
}

}  // namespace rwd::store
