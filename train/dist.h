// Data-parallel ranks on LibTorch's c10d (Gloo on CPUs, NCCL on CUDA devices) and the few
// collectives the trainer needs, each reduced in a fixed order so an N-rank run is bitwise
// repeatable with the same N.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rwd::train {

// Where this process sits in a data-parallel job: torchrun's variables (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), which rewind's own launcher sets too; under Slurm
// without them, SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID with the MASTER_ADDR the user
// exports. world == 1 without any. RANK is the global rank (rank 0 alone writes the store),
// LOCAL_RANK the GPU on this node.
struct DistEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where rank 0 serves the rendezvous: MASTER_PORT, except under torchrun's agent store
  // (TORCHELASTIC_USE_AGENT_STORE=True), whose own TCP store holds MASTER_PORT and speaks
  // PyTorch 2's protocol, not LibTorch 1.13's: MASTER_PORT + 1 there.
  int rendezvous_port = 29500;

  bool active() const { return world > 1; }
  // Reads the environment; a malformed or inconsistent variable is a UsageError.
  static DistEnv from_env();
  // Whether this process is one rank of a job: WORLD_SIZE is set (torchrun, rewind's
  // launcher), or Slurm's task variables are, with MASTER_ADDR.
  static bool in_job();
};

// A process group of `world` ranks. Every collective is called by all ranks in the same order
// (the trainer's step does that by construction). Deterministic reductions: each rank's
// contribution is gathered, then summed in rank order (r0 + r1 + ...) on every rank, so every
// replica gets the same bits whatever the transport's own reduction order would be.
class Comm {
 public:
  virtual ~Comm() = default;
  // Connects through a TCP rendezvous at env.master_addr:master_port (rank 0 serves it).
  // device: where the collectives' tensors live (CPU: Gloo; CUDA: NCCL). `timeout` bounds
  // every collective, so a dead peer ends the job instead of hanging it.
  static std::unique_ptr<Comm> connect(const DistEnv& env, const torch::Device& device,
                                       std::chrono::seconds timeout);

  virtual const DistEnv& env() const = 0;
  int rank() const { return env().rank; }
  int world() const { return env().world; }
  // Every rank's `t` (same shape and dtype on all ranks), in rank order.
  virtual std::vector<torch::Tensor> allgather(const torch::Tensor& t) = 0;
  // Every rank's `t` laid end to end in rank order, flat (world x t.numel() elements): on NCCL
  // straight into one buffer, without the copy out of a list that allgather makes.
  virtual torch::Tensor allgather_flat(const torch::Tensor& t) { return torch::cat(allgather(t.reshape({-1}))); }
  // Rank r receives chunk `rank` of rank r's `t` as its chunk r (t's first dimension split into
  // `world` equal chunks; every rank's t has the same shape).
  virtual torch::Tensor all_to_all(const torch::Tensor& t) = 0;
  // Sum over the ranks in rank order: identical bits on every rank. Large tensors go sharded:
  // an all-to-all gives rank r shard r of every rank's tensor, rank r sums them in
  // rank order, an allgather returns the summed shards. Each element is still r0 + r1 + ...,
  // so the bits are those of gathering everything, but a rank receives 2(N-1)/N of the tensor
  // instead of (N-1) times it. REWIND_GRAD_EXCHANGE=allgather keeps the whole-tensor allgather.
  torch::Tensor sum_in_rank_order(const torch::Tensor& t);
  // Every rank's 64-bit value, in rank order (on the host).
  std::vector<int64_t> allgather_int64(int64_t v);
  // The same through the rendezvous's TCP store, without a collective on the device: nothing
  // waits for the GPU work queued so far, so a rank can compare a value while its next step
  // runs (the replicas' parameter digests). Every rank calls it in the same order.
  virtual std::vector<int64_t> host_allgather_int64(int64_t v) = 0;
  // Rank 0's `text` on every rank (the others' argument is ignored): how rank 0 tells the
  // others what to run next (bisect probes).
  std::string broadcast_text(const std::string& text);
};

// The device a rank computes on: "cuda" or "cuda:N" becomes "cuda:<LOCAL_RANK>" in a job of
// several ranks (one GPU per rank); anything else is returned as is.
std::string rank_device(const std::string& device, const DistEnv& env);
// The job's process group, or nullptr for a single process. Collectives time out after
// REWIND_DIST_TIMEOUT seconds (default 300), so a dead rank or an unreachable node ends the
// others with one line instead of hanging them. On CPUs Gloo listens on GLOO_SOCKET_IFNAME
// (PyTorch's variable; a comma-separated list for several) or else on the address this host
// reaches MASTER_ADDR from, which is right across hosts and network namespaces alike.
std::unique_ptr<Comm> connect_ranks(const DistEnv& env, const std::string& device);

}  // namespace rwd::train
