// Writing to a pipe whose reader may be gone (a worker or script process that ended).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <string>

namespace rwd {

// Writes all of `text` to `fd`; false when the reader is gone (with SIGPIPE ignored) or the
// write fails otherwise.
inline bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace rwd
