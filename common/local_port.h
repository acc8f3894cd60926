// A TCP port free on the loopback right now, for a rendezvous that rank 0 binds next.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>

#include "common/error.h"

namespace rwd {

// Drawn below Linux's ephemeral range (32768-60999), not handed out by the kernel: between our
// check and rank 0's bind, any connecting socket (NCCL's, a previous job's ranks) may be given an
// ephemeral port, and on a 4-GPU host one did take the kernel's pick (EADDRINUSE at the
// rendezvous).
inline int free_local_port() {
  std::random_device rd;
  std::mt19937 gen(rd());
  std::uniform_int_distribution<int> pick(20000, 32767);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw Error(ExitCode::kInternal, "launch: socket() failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int port = pick(gen);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (ok) return port;
  }
  throw Error(ExitCode::kInternal, "launch: cannot find a free TCP port on 127.0.0.1 in 20000-32767");
}

}  // namespace rwd
