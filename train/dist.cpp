// c10d process groups for data-parallel training: Gloo over TCP on CPUs, NCCL on CUDA devices.
// Only allgather is used: it moves bytes and never reduces, so the sums that follow (in rank
// order, on every rank) are bitwise the same on every replica and from run to run.
#include "train/dist.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef REWIND_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO  // the header declares the group only under LibTorch's own build flag
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/cuda.h>
#include <torch/version.h>
#if defined(REWIND_CUDA) && defined(REWIND_NCCL)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
// The groups' base class (GroupBase below), which TCPStore.hpp no longer brings in (LibTorch
// 2.15) and the groups' headers only do where Gloo or NCCL is found.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/switches.h"

namespace rwd::train {

namespace {

// The groups derive from ProcessGroup in LibTorch 1.x and from Backend in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using GroupBase = c10d::Backend;
#else
using GroupBase = c10d::ProcessGroup;
#endif

int env_int(const char* name, int fallback) {
  const char* v = switches::external(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1 << 20)
    throw UsageError(std::string("environment variable ") + name + "='" + v + "' is not a count");
  return static_cast<int>(x);
}

const char* env_str(const char* name) { return switches::external(name); }

// Slurm's task variables stand for torchrun's when no launcher set WORLD_SIZE and the user
// exported MASTER_ADDR (srun starts one task a rank and names no rendezvous host itself).
bool slurm_ranks() {
  return env_str("WORLD_SIZE") == nullptr && env_str("SLURM_PROCID") != nullptr &&
         env_str("SLURM_NTASKS") != nullptr && env_str("MASTER_ADDR") != nullptr;
}

// LibTorch's messages run on with a C++ backtrace; the error is their first line.
std::string first_line(const std::string& what) { return what.substr(0, what.find('\n')); }

std::string what_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return first_line(c->what_without_backtrace());
  return first_line(e.what());
}

// The local address this host reaches `host` from, as its routing picks it (connect() of a UDP
// socket sends nothing). Empty when `host` does not resolve or has no route.
std::string route_source(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string out;
  for (addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[INET6_ADDRSTRLEN] = "";
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* bytes = local.ss_family == AF_INET6
                              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, bytes, text, sizeof text) != nullptr) out = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return out;
}

// c10d's group over the host (Gloo) or the GPUs (NCCL), behind rank-ordered collectives.
class C10dComm : public Comm {
 public:
  C10dComm(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<GroupBase> pg, DistEnv env,
           torch::Device device, std::chrono::seconds timeout, std::function<void()> shutdown = {})
      : store_(std::move(store)), pg_(std::move(pg)), env_(std::move(env)), device_(device), timeout_(timeout),
        shutdown_(std::move(shutdown)) {}
  // A normal end shuts NCCL's group down first (what destroy_process_group does in Python);
  // otherwise its destructor warns "destroy_process_group() was not called" on every job.
  // Not while an error unwinds: a dead peer's group is left to the process's end.
  ~C10dComm() override {
    if (!shutdown_ || std::uncaught_exceptions() > 0) return;
    try {
      shutdown_();
    } catch (const std::exception&) {
      // the group's end is best effort: the process ends next
    }
  }

  const DistEnv& env() const override { return env_; }

  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    std::vector<torch::Tensor> in{t.to(device_).contiguous()};
    std::vector<std::vector<torch::Tensor>> out(1);
    for (int r = 0; r < env_.world; ++r) out[0].push_back(torch::empty_like(in[0]));
    guarded([&] { pg_->allgather(out, in)->wait(); });
    return out[0];
  }

  torch::Tensor allgather_flat(const torch::Tensor& t) override {
    if (!device_.is_cuda()) return Comm::allgather_flat(t);  // Gloo of LibTorch 1.x: no _allgather_base
    torch::Tensor in = t.to(device_).contiguous().view({-1});
    torch::Tensor out = torch::empty({in.numel() * env_.world}, in.options());
    guarded([&] { pg_->_allgather_base(out, in)->wait(); });
    return out;
  }

  torch::Tensor all_to_all(const torch::Tensor& t) override {
    torch::Tensor in = t.to(device_).contiguous();
    torch::Tensor out = torch::empty_like(in);
    std::vector<int64_t> equal;  // empty counts: equal chunks of the first dimension
    guarded([&] { pg_->alltoall_base(out, in, equal, equal)->wait(); });
    return out;
  }

  std::vector<int64_t> host_allgather_int64(int64_t v) override {
    // Keys of their own per call; a rank deletes its key of kKeep calls ago, which every rank
    // has read: none can be in this call before all set their keys of the call before.
    constexpr uint64_t kKeep = 4;
    const uint64_t call = host_calls_++;
    auto key = [](uint64_t c, int r) { return "rwd/host/" + std::to_string(c) + "/" + std::to_string(r); };
    std::vector<uint8_t> mine(sizeof v);
    std::memcpy(mine.data(), &v, sizeof v);
    store_->set(key(call, env_.rank), mine);
    std::vector<int64_t> out(static_cast<size_t>(env_.world));
    for (int r = 0; r < env_.world; ++r) {
      const std::vector<uint8_t> b = guarded([&] { return store_->get(key(call, r)); });  // the store's timeout
      if (b.size() != sizeof v) throw Error(ExitCode::kInternal, "host allgather: a rank sent " + std::to_string(b.size()) + " bytes");
      std::memcpy(&out[static_cast<size_t>(r)], b.data(), sizeof v);
    }
    if (call >= kKeep) store_->deleteKey(key(call - kKeep, env_.rank));
    return out;
  }

 private:
  // A collective that fails, because a peer ended or none answered within the timeout (a node
  // gone from the network), ends this rank with one line saying so; the launcher then stops
  // the node's other ranks. rewind's own errors pass through.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error&) {
      throw;
    } catch (const c10::OutOfMemoryError&) {
      throw;  // main names the rank and the allocation
    } catch (const std::exception& e) {
      throw Error(ExitCode::kInternal,
                  "rank " + std::to_string(env_.rank) + " lost the other ranks: one ended, or none answered within " +
                      std::to_string(timeout_.count()) + " s (REWIND_DIST_TIMEOUT): " + what_of(e));
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;  // the rendezvous; kept alive with the group
  uint64_t host_calls_ = 0;                // host_allgather_int64 calls so far
  c10::intrusive_ptr<GroupBase> pg_;
  DistEnv env_;
  torch::Device device_;
  std::chrono::seconds timeout_;
  std::function<void()> shutdown_;
};

}  // namespace

DistEnv DistEnv::from_env() {
  DistEnv e;
  const bool slurm = slurm_ranks();
  const char* world = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  const char* rank = slurm ? "SLURM_PROCID" : "RANK";
  e.world = env_int(world, 1);
  e.rank = env_int(rank, 0);
  e.local_rank = env_int(slurm ? "SLURM_LOCALID" : "LOCAL_RANK", e.rank);
  if (e.world < 1) throw UsageError(std::string(world) + " must be at least 1");
  if (e.rank >= e.world)
    throw UsageError(std::string(rank) + " " + std::to_string(e.rank) + " is not below " + world + " " +
                     std::to_string(e.world));
  if (const char* a = env_str("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", e.master_port);
  if (e.master_port == 0 || e.master_port > 65535) throw UsageError("MASTER_PORT must be 1..65535");
  e.rendezvous_port = e.master_port;
  if (const char* agent = env_str("TORCHELASTIC_USE_AGENT_STORE"); agent != nullptr && std::string(agent) == "True") {
    if (e.master_port == 65535)
      throw UsageError("MASTER_PORT 65535: under torchrun rewind's rendezvous takes MASTER_PORT + 1");
    e.rendezvous_port = e.master_port + 1;
  }
  return e;
}

bool DistEnv::in_job() { return env_str("WORLD_SIZE") != nullptr || slurm_ranks(); }

std::unique_ptr<Comm> Comm::connect(const DistEnv& env, const torch::Device& device,
                                    std::chrono::seconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.rendezvous_port);
  so.isServer = env.rank == 0;
  so.numWorkers = env.world;
  so.waitWorkers = true;
  so.timeout = timeout;
  const std::string rank = "rank " + std::to_string(env.rank);
  const std::string at = env.master_addr + ":" + std::to_string(env.rendezvous_port);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    // Rank 0 fails to bind the port or to see every rank arrive; the others fail to connect.
    throw Error(ExitCode::kInternal, rank + ": cannot " + (env.rank == 0 ? "serve" : "reach") + " the rendezvous at " +
                                         at + " (REWIND_DIST_TIMEOUT " + std::to_string(timeout.count()) +
                                         " s): " + what_of(e));
  }
  c10::intrusive_ptr<GroupBase> pg;
  std::function<void()> shutdown;
  if (device.is_cuda()) {
#if defined(REWIND_CUDA) && defined(REWIND_NCCL)
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world, o);
    shutdown = [nccl] { nccl->shutdown(); };
    pg = nccl;
#else
    throw UsageError("multi-rank training on CUDA needs a CUDA build with NCCL (ProcessGroupNCCL)");
#endif
  } else {
#ifdef REWIND_GLOO
    auto o = c10d::ProcessGroupGloo::Options::create();
    o->timeout = timeout;
    // GLOO_SOCKET_IFNAME picks the interfaces as in PyTorch. Otherwise Gloo listens on the
    // address this host reaches the rendezvous from: loopback on one host, the right interface
    // across hosts, and inside a network namespace too, where Gloo's own default (the address
    // the hostname resolves to) may not exist or be the host's loopback.
    std::string listen;
    if (const char* names = env_str("GLOO_SOCKET_IFNAME")) {
      std::stringstream list(names);
      for (std::string name; std::getline(list, name, ',');)
        if (!name.empty()) o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      listen = std::string("GLOO_SOCKET_IFNAME=") + names;
    } else if (listen = route_source(env.master_addr, env.rendezvous_port); !listen.empty()) {
      o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(listen));
    } else {
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      listen = "the address the hostname resolves to";
    }
    try {
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world, o);
    } catch (const std::exception& e) {
      throw Error(ExitCode::kInternal, rank + ": Gloo, listening on " + listen +
                                           ", cannot connect to the other ranks (GLOO_SOCKET_IFNAME names the "
                                           "interface they reach): " + what_of(e));
    }
#else
    throw UsageError("multi-rank training on CPUs needs Gloo: this build found no gloo headers");
#endif
  }
  return std::make_unique<C10dComm>(store, pg, env, device, timeout, std::move(shutdown));
}

std::string rank_device(const std::string& device, const DistEnv& env) {
  if (!env.active() || device.rfind("cuda", 0) != 0) return device;
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus > 0 && env.local_rank >= gpus)
    throw UsageError("rank " + std::to_string(env.rank) + " needs GPU cuda:" + std::to_string(env.local_rank) +
                     ", but this machine has " + std::to_string(gpus) + " (at most --nproc-per-node " +
                     std::to_string(gpus) + " with --device cuda)");
  return "cuda:" + std::to_string(env.local_rank);
}

std::unique_ptr<Comm> connect_ranks(const DistEnv& env, const std::string& device) {
  if (!env.active()) return nullptr;
  const int timeout = static_cast<int>(switches::integer(switches::Switch::kDistTimeout));
  return Comm::connect(env, torch::Device(rank_device(device, env)), std::chrono::seconds(std::max(1, timeout)));
}

torch::Tensor Comm::sum_in_rank_order(const torch::Tensor& t) {
  const int n = world();
  const int64_t numel = t.numel();
  const bool gather_all = switches::text(switches::Switch::kGradExchange) == "allgather";
  if (gather_all || n == 1 || numel < int64_t{4096} * n) {
    std::vector<torch::Tensor> all = allgather(t);
    torch::Tensor acc = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) acc.add_(all[r]);
    return acc;
  }
  const int64_t shard = (numel + n - 1) / n;
  torch::Tensor flat = t.reshape({-1});
  if (shard * n != numel) flat = torch::cat({flat, torch::zeros({shard * n - numel}, flat.options())});
  const torch::Tensor parts = all_to_all(flat).view({n, shard});
  torch::Tensor acc = parts[0].clone();
  for (int r = 1; r < n; ++r) acc.add_(parts[r]);
  return allgather_flat(acc).slice(0, 0, numel).view(t.sizes());
}

std::vector<int64_t> Comm::allgather_int64(int64_t v) {
  std::vector<torch::Tensor> all = allgather(torch::full({1}, v, torch::kInt64));
  std::vector<int64_t> out;
  for (const auto& t : all) out.push_back(t.to(torch::kCPU).item<int64_t>());
  return out;
}

std::string Comm::broadcast_text(const std::string& text) {
  // Allgather moves equal shapes only: every rank sends rank 0's length worth of bytes.
  const int64_t n = allgather_int64(rank() == 0 ? static_cast<int64_t>(text.size()) : 0)[0];
  torch::Tensor mine = torch::zeros({std::max<int64_t>(n, 1)}, torch::kUInt8);
  if (rank() == 0) std::copy(text.begin(), text.end(), mine.data_ptr<uint8_t>());
  const torch::Tensor first = allgather(mine)[0].to(torch::kCPU).contiguous();
  return std::string(reinterpret_cast<const char*>(first.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

}  // namespace rwd::train
