// Recorder: per-step transactions and the background checkpoint writer.
#include "replay/recorder.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <nlohmann/json.hpp>

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "common/error.h"
#include "common/hash.h"
#include "replay/tensor_io.h"

namespace rwd::replay {

namespace {

// Parses `L2`, `L*`, `L{1,3}`, with optional `.H..` of the same forms, comma separated.
std::vector<int> parse_index_set(const std::string& text, char prefix, int n, const std::string& spec) {
  auto bad = [&](const std::string& why) {
    return UsageError("--capture: " + why + " in '" + spec + "'");
  };
  if (text.empty() || text[0] != prefix) throw bad(std::string("expected ") + prefix + "<n>");
  std::string body = text.substr(1);
  std::vector<int> out;
  if (body == "*") {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  if (body.size() >= 2 && body.front() == '{' && body.back() == '}') body = body.substr(1, body.size() - 2);
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      if (v < 0 || v >= n) throw bad(std::string(1, prefix) + item + " out of range (0.." + std::to_string(n - 1) + ")");
      out.push_back(v);
    } catch (const std::logic_error&) {
      throw bad("bad index '" + item + "'");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

// The background checkpoint writer hashes, shuffles and compresses blobs on threads of its
// own (Store::put_blobs) on the cores training leaves idle (at most 8), unless the caller
// chose a count: a gpt2-small checkpoint is 1.5 GB and one thread needs seconds for it,
// longer than the steps between checkpoints on a GPU.
store::StoreOptions writer_options(store::StoreOptions so) {
  if (so.zstd_workers == 0) {
    const int idle = static_cast<int>(std::thread::hardware_concurrency()) - at::get_num_threads();
    so.zstd_workers = std::clamp(idle, 0, 8);
  }
  return so;
}

// Copies device tensors into their pinned host buffers on a side stream, after the work
// queued so far on the current stream (the last step's update), and makes the trainer's next
// optimizer update wait for the copy on the device. Returns what blocks until the copy is done.
std::function<void()> copy_from_device(const std::vector<std::pair<torch::Tensor*, torch::Tensor>>& copies,
                                       Trainer& trainer) {
#ifdef REWIND_CUDA
  const c10::DeviceIndex dev = copies.front().second.device().index();
  at::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream(dev);
  at::cuda::CUDAStream side = at::cuda::getStreamFromPool(false, dev);
  at::cuda::CUDAEvent state_ready;
  state_ready.record(main);
  state_ready.block(side);
  auto copied = std::make_shared<at::cuda::CUDAEvent>();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    for (const auto& [buf, src] : copies) buf->copy_(src, /*non_blocking=*/true);
  }
  copied->record(side);
  // Waiting again on a finished copy costs nothing, so the hook stays until the next one.
  trainer.set_before_update([copied, dev] { copied->block(at::cuda::getCurrentCUDAStream(dev)); });
  return [copied] { copied->synchronize(); };
#else
  (void)trainer;
  for (const auto& [buf, src] : copies) buf->copy_(src);
  return {};
#endif
}

}  // namespace

CaptureSpec CaptureSpec::parse(const std::string& spec, int n_layer, int n_head) {
  CaptureSpec c;
  if (spec.empty()) return c;
  size_t semi = spec.find(';');
  std::string steps = spec.substr(0, semi);
  if (steps.rfind("steps=", 0) != 0) throw UsageError("--capture: expected 'steps=A:B;L..' in '" + spec + "'");
  steps = steps.substr(6);
  try {
    size_t colon = steps.find(':');
    c.from = std::stoll(steps.substr(0, colon));
    c.to = colon == std::string::npos ? c.from : std::stoll(steps.substr(colon + 1));
  } catch (const std::logic_error&) {
    throw UsageError("--capture: bad step range in '" + spec + "'");
  }
  if (c.to < c.from) throw UsageError("--capture: empty step range in '" + spec + "'");
  std::string targets = semi == std::string::npos ? "L*" : spec.substr(semi + 1);
  size_t pos = 0;
  while (pos < targets.size()) {
    size_t end = targets.find(';', pos);
    std::string t = targets.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t dot = t.find('.');
    std::vector<int> layers = parse_index_set(t.substr(0, dot), 'L', n_layer, spec);
    std::vector<int> heads = dot == std::string::npos
                                 ? parse_index_set("H*", 'H', n_head, spec)
                                 : parse_index_set(t.substr(dot + 1), 'H', n_head, spec);
    for (int l : layers) {
      c.layers.push_back(l);
      c.heads.push_back(heads);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return c;
}

Recorder::Recorder(store::Store& s, const std::string& store_path, int64_t run,
                   const RecordOptions& o, const store::StoreOptions& so)
    : store_(s),
      run_(run),
      opt_(o),
      writer_store_(store::Store::open(store_path, store::Mode::kReadWrite, writer_options(so))),
      thread_([this] { writer_loop(); }) {}

Recorder::~Recorder() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Recorder::writer_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    cv_.notify_all();  // a checkpoint() waiting for room may queue the next one now
    auto t0 = std::chrono::steady_clock::now();
    std::string err;
    try {
      if (job.wait_ready) job.wait_ready();
      write_checkpoint(writer_store_, run_, job.step, job.state);
    } catch (const std::exception& e) {
      err = e.what();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      ckpt_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!err.empty() && error_.empty()) error_ = err;
    }
    cv_.notify_all();
  }
}

void Recorder::checkpoint(int64_t step, Trainer& trainer) {
  // Backpressure: at most one checkpoint waits while another is written, so host memory
  // stays bounded (gpt2-small's state is 1.5 GB) when checkpoints come faster than the writer
  // compresses them; the wait shows in the step's wall time.
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.empty() || !error_.empty(); });
  }
  const auto t1 = Clock::now();
  const NamedTensors state = trainer.state();
  Job job;
  job.step = step;
  std::vector<torch::Tensor>& pinned = pinned_[pinned_next_];
  pinned_next_ ^= 1;
  pinned.resize(state.size());
  std::vector<std::pair<torch::Tensor*, torch::Tensor>> device_copies;  // (pinned buffer, source)
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, t] = state[i];
    torch::Tensor d = t.detach();
    if (d.is_cpu()) {
      job.state.emplace_back(name, d.clone());
      continue;
    }
    torch::Tensor& buf = pinned[i];  // allocated once, again only if a tensor changed shape
    if (!buf.defined() || buf.sizes() != d.sizes() || buf.scalar_type() != d.scalar_type()) {
      buf = torch::empty(d.sizes(), torch::TensorOptions().dtype(d.scalar_type()).pinned_memory(true));
    }
    device_copies.emplace_back(&buf, d);
    job.state.emplace_back(name, buf);
  }
  if (!device_copies.empty()) job.wait_ready = copy_from_device(device_copies, trainer);
  // The CPU generator's state: unused by training (no dropout) but recorded per DESIGN §6.
  auto gen = at::detail::getDefaultCPUGenerator();
  job.state.emplace_back("rng/cpu", gen.get_state().clone());
  // CUDA generator (seed and offset inside its state), when training runs on a GPU.
  if (!state.empty() && state.front().second.is_cuda()) {
    auto cuda_gen = at::globalContext().defaultGenerator(state.front().second.device());
    job.state.emplace_back("rng/cuda", cuda_gen.get_state().clone());
  }
  ++ckpt_count_;
  waited_seconds_ += std::chrono::duration<double>(t1 - t0).count();
  snapshot_seconds_ += std::chrono::duration<double>(Clock::now() - t1).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty()) throw Error(ExitCode::kData, "checkpoint writer failed: " + error_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

Recorder::CheckpointCosts Recorder::checkpoint_costs() {
  CheckpointCosts c;
  c.count = ckpt_count_;
  c.snapshot_seconds = snapshot_seconds_;
  c.waited_seconds = waited_seconds_;
  std::lock_guard<std::mutex> lock(mu_);
  c.writer_seconds = ckpt_seconds_;
  return c;
}

void Recorder::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  if (!error_.empty()) throw Error(ExitCode::kData, "checkpoint writer failed: " + error_);
}

void Recorder::record_step(const StepResult& r, const std::string& digest, const TokenFile& data,
                           int block_size) {
  auto tx = store_.begin_step();
  store::StepRecord rec;
  rec.run = run_;
  rec.step = r.step;
  rec.lr = r.lr;
  rec.loss_bits = store::float_bits(r.loss);
  rec.grad_norm_bits = store::float_bits(r.grad_norm);
  if (!digest.empty()) rec.param_digest = digest;
  rec.batch_hash = hex64(r.batch_hash);
  nlohmann::json extra;
  extra["offsets"] = r.offsets;
  extra["seconds"] = r.seconds;
  rec.extra = extra.dump();
  if (opt_.full_batches) {
    std::vector<uint16_t> tokens;
    for (const auto& micro : r.offsets)
      for (int64_t off : micro) tokens.insert(tokens.end(), data.data() + off, data.data() + off + block_size + 1);
    rec.batch_ref = store_.put_blob(tokens.data(), tokens.size() * 2);
  }
  store_.put_step(rec);
  std::vector<std::pair<std::string, double>> metrics = {{"lr", r.lr}, {"step_seconds", r.seconds}};
  metrics.reserve(2 + 5 * r.monitors.size());
  for (const HeadMonitor& m : r.monitors) {
    const std::string p = "L" + std::to_string(m.layer) + ".H" + std::to_string(m.head) + ".";
    metrics.emplace_back(p + "wq_sn", m.wq_sn);
    metrics.emplace_back(p + "max_logit", m.max_logit);
    metrics.emplace_back(p + "repmax_rate", m.repmax_rate);
    metrics.emplace_back(p + "pbar_one", m.pbar_one);
    if (m.stable_guard > 0) metrics.emplace_back(p + "stable_guard", m.stable_guard);
  }
  store_.put_metrics(run_, r.step, metrics);
  for (size_t i = 0; i < opt_.capture.layers.size(); ++i) {
    const int layer = opt_.capture.layers[i];
    auto it = r.captures.find(layer);
    if (it == r.captures.end() || !it->second) continue;
    const kernels::AttentionCapture& c = *it->second;
    const std::pair<const char*, const torch::Tensor*> items[] = {
        {"q", &c.q}, {"k", &c.k}, {"v", &c.v}, {"o", &c.o}, {"lse", &c.lse}, {"do", &c.d_o}, {"delta", &c.delta}};
    if (c.x.defined()) {  // the layer input, shared by all heads: head -1
      torch::Tensor t = c.x.contiguous().to(torch::kCPU);  // (B,T,C)
      store::TensorKey key{run_, r.step, layer, -1, "x"};
      store_.put_tensor(key, store_dtype(t), shape_of(t), t.data_ptr(), t.numel() * t.element_size());
    }
    for (int head : opt_.capture.heads[i]) {
      for (const auto& [name, tensor] : items) {
        if (!tensor->defined()) continue;
        torch::Tensor t = tensor->select(1, head).contiguous().to(torch::kCPU);  // (B,T,D) or (B,T)
        store::TensorKey key{run_, r.step, layer, head, name};
        store_.put_tensor(key, store_dtype(t), shape_of(t), t.data_ptr(), t.numel() * t.element_size());
      }
    }
  }
  tx.commit();
}

}  // namespace rwd::replay
