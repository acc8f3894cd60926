// WriterLock: an exclusive, non-blocking flock() on STORE-lock, checked to be the file that is
// at that path (a holder removes it when it releases the lock).
#include "store/writer_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "store/store_error.h"

namespace rwd::store {
namespace {

// What the holder wrote into the lock file: "WHAT, pid N", or "" when unreadable.
std::string holder_text(int fd) {
  char buf[256] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

WriterLock::WriterLock(const std::string& store_path, const std::string& what) : path_(lock_path(store_path)) {
  const std::string where = "store " + store_path + ": ";
  // A holder removes the file before it lets go of the lock, so a lock taken on a file that is
  // no longer at the path is no lock: try again with the file now there.
  for (int attempt = 0; fd_ < 0; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw data_error(where + "cannot create its lock file " + path_ + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = err == EWOULDBLOCK ? holder_text(fd) : "";
      ::close(fd);
      if (err != EWOULDBLOCK) throw data_error(where + "cannot lock " + path_ + ": " + std::strerror(err));
      throw data_error(where + (holder.empty() ? std::string("another process") : holder) +
                       " is writing it; try again once that has finished");
    }
    struct stat held, there;
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &there) == 0 && held.st_ino == there.st_ino &&
        held.st_dev == there.st_dev) {
      fd_ = fd;
    } else {
      ::close(fd);
      if (attempt >= 100) throw data_error(where + "cannot lock " + path_ + ": it keeps being replaced");
    }
  }
  const std::string text = what + ", pid " + std::to_string(::getpid()) + "\n";
  // The lock is what matters; its text only names the holder (a full disk may refuse it).
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t written = ::pwrite(fd_, text.data(), text.size(), 0);
    (void)written;
  }
}

WriterLock::~WriterLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace rwd::store
