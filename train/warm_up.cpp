// DeviceWarmUp: CUDA's lazy setup on a thread of its own (see warm_up.h).
#include "train/warm_up.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "common/error.h"
#include "train/trainer.h"

namespace rwd::train {

namespace {

// Whether this process still has to warm `device` up (claims it when so).
bool claim(const torch::Device& device) {
  const char* e = std::getenv("REWIND_WARM_UP");
  const std::string v = e ? e : "";
  if (v == "0") return false;
  if (!device.is_cuda() && v != "1") return false;
  static std::mutex mu;
  static std::set<int> done;
  std::lock_guard<std::mutex> lock(mu);
  return done.insert(device.is_cuda() ? (device.has_index() ? device.index() : 0) : -1).second;
}

// Layer 0 as `plan` has it, layer 1 with every op of every head and every module in FP32.
plan::Plan warm_plan(const plan::Plan& plan) {
  plan::Plan p = plan::Plan::all_fp32(2, plan.n_head);
  if (!plan.layers.empty()) p.layers[0] = plan.layers[0];
  p.head_fp32 = plan.head_fp32;
  p.block_q = plan.block_q;
  p.block_k = plan.block_k;
  return p;
}

}  // namespace

DeviceWarmUp::DeviceWarmUp(const Config& config, const plan::Plan& plan, const TokenFile& data,
                           torch::Device device, AttentionImpl impl) {
  if (!claim(device)) return;
  Config c = config;
  c.n_layer = 2;
  c.gradient_accumulation_steps = 1;
  const plan::Plan p = impl == AttentionImpl::kRewind ? warm_plan(plan) : plan::Plan::defaults(2, plan.n_head);
  thread_ = std::thread([this, c, p, &data, device, impl] {
    try {
      // The default stream, as the restored trainer's: the blocks the allocator caches here
      // serve its steps (a stream of its own would keep them apart).
      Trainer t(c, p, data, device, impl, Trainer::Init::kForLoad);
      t.optimizer_path();  // the fused AdamW's calibration, kept per device (optimizer.cpp)
      t.probe_step(p, {}, nullptr);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void DeviceWarmUp::wait() {
  if (!thread_.joinable()) return;
  thread_.join();
  ran_ = true;
  if (!error_) return;
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rewind: warning: the GPU warm-up failed (%s); the first step sets the GPU up\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "rewind: warning: the GPU warm-up failed; the first step sets the GPU up\n");
  }
  error_ = nullptr;
}

}  // namespace rwd::train
