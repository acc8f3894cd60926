// rewind._C.ScriptRecording / ScriptReplay / param_digest: the store side of rewind.record
// (python/rewind/record.py) — a user's own PyTorch loop written into, and read back from, the
// same store format rewind's trainer writes (runs, steps, blobs, checkpoints, metrics).
#include "python/record_ext.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "common/error.h"
#include "common/hash.h"
#include "common/switches.h"
#include "python/monitors.h"
#include "store/content_hash.h"
#include "store/store.h"
#include "store/store_worker.h"
#include "store/writer_lock.h"
#include "train/checkpoint_schedule.h"
#include "train/first_checkpoint_gate.h"
#include "train/state_stager.h"
#include "train/tensor_io.h"
#include "train/trainer.h"

namespace rwd::python {

namespace py = pybind11;

namespace {

// splitmix64 (common/hash.h) on int64 tensors, on whatever device they live: the same bits as
// on uint64, since + and * wrap in two's complement and a logical shift is the arithmetic one
// with the sign-extended bits masked off.
torch::Tensor splitmix64(torch::Tensor x) {
  auto srl = [](const torch::Tensor& v, int k) { return v.__rshift__(k).bitwise_and((int64_t{1} << (64 - k)) - 1); };
  x = x + static_cast<int64_t>(0x9e3779b97f4a7c15ull);
  x = (x ^ srl(x, 30)) * static_cast<int64_t>(0xbf58476d1ce4e5b9ull);
  x = (x ^ srl(x, 27)) * static_cast<int64_t>(0x94d049bb133111ebull);
  return x ^ srl(x, 31);
}

// Words per slice of the tensor path: its temporaries are a few int64 tensors of this length
// (32 MiB each).
constexpr int64_t kDigestChunk = int64_t{1} << 22;

// The wrapping sum of digest_term(w_i, i) over the 32-bit words of contiguous `c`, as a 0-dim
// int64 tensor on c's device: tensor ops, so a GPU's parameters never cross to the host.
torch::Tensor word_sum_tensor(const torch::Tensor& c, int64_t words) {
  const torch::Tensor w = c.reshape({-1}).view(torch::kInt32);
  const auto opts = torch::TensorOptions().dtype(torch::kInt64).device(c.device());
  torch::Tensor acc = torch::zeros({}, opts);
  for (int64_t b = 0; b < words; b += kDigestChunk) {
    const int64_t e = std::min(words, b + kDigestChunk);
    const torch::Tensor word = w.slice(0, b, e).to(torch::kInt64).bitwise_and(int64_t{0xffffffff});
    acc += splitmix64(torch::arange(b, e, opts).__lshift__(32).bitwise_or(word)).sum();
  }
  return acc;
}

// The d2 parameter digest (common/hash.h: digest_term) of the tensors in order: the same bits
// as Trainer::param_digest for the same parameters, so `store info` and replay read one format.
// Host tensors are summed in a plain loop; device tensors (or all, with `tensor_path`, which the
// tests compare with the loop) by word_sum_tensor, one device-to-host copy for all the sums.
// The sum over words does not depend on the order of additions.
std::string param_digest(const std::vector<torch::Tensor>& params, bool tensor_path) {
  std::vector<int64_t> words(params.size());
  std::vector<uint64_t> sums(params.size(), 0);
  std::vector<std::pair<size_t, torch::Tensor>> pending;  // (index, 0-dim sum on the device)
  for (size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor c = params[k].detach().contiguous();
    const int64_t bytes = c.numel() * static_cast<int64_t>(c.element_size());
    if (bytes % 4 != 0)
      throw Error(ExitCode::kUsage, "param digest: parameter " + std::to_string(k) + " holds " + std::to_string(bytes) +
                                        " bytes, not a whole number of 32-bit words");
    words[k] = bytes / 4;
    if (tensor_path || !c.is_cpu()) {
      pending.emplace_back(k, word_sum_tensor(c, words[k]));
      continue;
    }
    const auto* w = static_cast<const uint32_t*>(c.data_ptr());
    for (int64_t i = 0; i < words[k]; ++i) sums[k] += digest_term(w[i], static_cast<uint64_t>(i));
  }
  if (!pending.empty()) {
    std::vector<torch::Tensor> parts;
    bool one_device = true;
    for (const auto& p : pending) {
      parts.push_back(p.second);
      one_device = one_device && p.second.device() == pending.front().second.device();
    }
    if (!one_device)
      for (torch::Tensor& t : parts) t = t.to(torch::kCPU);
    const torch::Tensor host = torch::stack(parts).to(torch::kCPU);  // one copy (per device)
    for (size_t j = 0; j < pending.size(); ++j)
      sums[pending[j].first] = static_cast<uint64_t>(host[static_cast<int64_t>(j)].item<int64_t>());
  }
  uint64_t h = kFnvOffset;
  for (size_t k = 0; k < params.size(); ++k) {
    h = fnv1a64(&words[k], sizeof words[k], h);
    h = fnv1a64(&sums[k], sizeof sums[k], h);
  }
  return "d2:" + hex64(h);
}

// The batch tensors' bytes, one after another (host, C order); their dtypes and shapes go into
// the step's extra JSON (the Python side writes it), so the blob alone is the batch.
std::vector<uint8_t> batch_bytes(const std::vector<torch::Tensor>& batch) {
  std::vector<uint8_t> out;
  for (const torch::Tensor& t : batch) {
    const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    out.insert(out.end(), p, p + c.numel() * c.element_size());
  }
  return out;
}

// A copy of `t` on the host, queued: from a GPU into pinned memory without waiting (read it
// after queue_fence's wait); a host tensor is cloned.
torch::Tensor to_host(const torch::Tensor& t) {
  const torch::Tensor d = t.detach();
  if (!d.is_cuda()) return d.clone();
  torch::Tensor h = torch::empty(d.sizes(), d.options().device(torch::kCPU).pinned_memory(true));
  h.copy_(d, /*non_blocking=*/true);
  return h;
}

// A function that waits until the work queued so far on the current CUDA stream (the copies
// to pinned memory among it) is done; one that returns at once where `cuda` is false.
std::function<void()> queue_fence(bool cuda) {
#ifdef REWIND_CUDA
  if (cuda) {
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(at::cuda::getCurrentCUDAStream());
    return [done] { done->synchronize(); };
  }
#else
  if (cuda) throw Error(ExitCode::kInternal, "rewind.record: CUDA tensors need a REWIND_CUDA build of rewind._C");
#endif
  return [] {};
}

// A scalar of rec.step: a one-element tensor (the loop's FP32 value, read as float) or a number.
using Scalar = std::variant<torch::Tensor, double>;

double scalar_value(const Scalar& v) {
  if (const double* d = std::get_if<double>(&v)) return *d;
  return static_cast<double>(std::get<torch::Tensor>(v).item<float>());
}

py::list named_list(const train::NamedTensors& state) {
  py::list out;
  for (const auto& [name, t] : state) out.append(py::make_tuple(name, t));
  return out;
}

}  // namespace

// A recording made by a Python script, written like rewind train's (train::Recorder): it holds
// the store's writer lock (a second recording or `store thin` is refused in one line), and two
// background threads, each on a connection of its own (store::StoreWorker), commit the steps
// (one transaction each, in order; those after the first checkpoint once it is committed) and
// the checkpoints (all rows of one in one transaction, after the steps before it), so the loop
// waits neither for compression nor for SQLite. A killed script loses the steps still queued,
// never the store's consistency.
class ScriptRecording {
 public:
  ScriptRecording(const std::string& path, const std::string& config_json, const std::string& plan,
                  const std::string& meta_json)
      : lock_(std::make_unique<store::WriterLock>(path, "a recording (rewind.record)")) {
    run_ = store::Store::create(path).add_run(config_json, plan, meta_json);
    store::StoreOptions so;
    so.wal_autocheckpoint = 0;  // the writers copy the WAL into the file on their own schedule
    steps_ = std::make_unique<store::StoreWorker>(path, so, kMaxQueuedSteps, "step writer");
    checkpoints_ = std::make_unique<store::StoreWorker>(path, so, 1, "checkpoint writer");
  }
  // Members go in reverse order: the checkpoint writer (whose jobs wait for the step writer)
  // stops first, each after running what is queued, and the lock is let go last. No GIL is
  // needed by the writers, so this may run while Python holds it.

  int64_t run() const { return run_; }

  // When checkpoints are taken (train::CheckpointSchedule, as rewind train's): at steps 0, K,
  // 2K, ...; one due while the checkpoint writer is busy or the stager's second buffer set is
  // still being allocated is taken at the first later step where neither is so, unless `wait`.
  void schedule_checkpoints(int every, bool wait) { schedule_ = train::CheckpointSchedule(every, wait); }
  bool checkpoint_due(int64_t step) { return schedule_.due(step, checkpoints_->has_room() && stager_.ready()); }
  // Checkpoints taken late, due ones folded into them, the most steps one was late, and the
  // step of one deferred and never taken (the loop ended while the writer was busy) or -1.
  std::tuple<int, int, int64_t, int64_t> checkpoint_lateness() const {
    return {schedule_.late(), schedule_.folded(), schedule_.max_late(), schedule_.pending()};
  }

  // The parameters whose digest each step records (the model's, in order).
  void set_params(std::vector<torch::Tensor> params) { params_ = std::move(params); }

  // Records step `step`, written by the step writer once the device has done the step's work:
  // `scalars` are loss, grad_norm, then rec.step's keywords in order (tensors are copied to the
  // host behind the step's work, numbers kept as they are); `batch` the host copies of what
  // get_batch returned (rec.batch queued them); the per-head monitors are those of the
  // attention() calls since the last take; the parameter digest is queued here (on a GPU its
  // kernels, on the CPU the sum itself). Nothing here waits for the device: the step writer
  // waits for the copies (`cuda`: an event on the current stream) and reads them. `ops`, when
  // not empty, is stored as the run's kv "ops" (the rewind.op names the script ran).
  // `rng`: the generators' states as bytes, or as a uint8 tensor that the device fills behind
  // the work queued so far (a data-parallel recording's gathered states: python/rewind/_ranks.py).
  void queue_step(int64_t step, double lr, double seconds, std::vector<std::pair<std::string, Scalar>> scalars,
                  std::vector<torch::Tensor> batch, const std::variant<py::bytes, torch::Tensor>& rng,
                  const std::string& extra, const std::string& ops, bool cuda) {
    require_open();
    if (scalars.size() < 2) throw Error(ExitCode::kInternal, "queue_step: loss and grad_norm come first");
    for (auto& [name, v] : scalars)
      if (auto* t = std::get_if<torch::Tensor>(&v)) *t = to_host(t->detach().to(torch::kFloat32).reshape({}));
    LayerStats stats = take_monitor_stats();
    for (auto& [layer, raw] : stats)
      for (torch::Tensor& r : raw) r = to_host(r);
    std::function<std::string()> digest = train::queue_param_digest(params_);
    std::function<void()> fence = queue_fence(cuda);
    std::string rng_state;
    std::vector<torch::Tensor> rng_tensor;  // empty, or the one tensor to read after the fence
    if (const auto* b = std::get_if<py::bytes>(&rng))
      rng_state = *b;
    else
      rng_tensor.push_back(to_host(std::get<torch::Tensor>(rng).to(torch::kUInt8)));
    py::gil_scoped_release nogil;
    steps_->push([run = run_, step, lr, seconds, scalars = std::move(scalars), batch = std::move(batch),
                  rng_state = std::move(rng_state), rng_tensor = std::move(rng_tensor), extra, ops,
                  stats = std::move(stats), digest = std::move(digest), fence = std::move(fence),
                  first = first_checkpoint_.ticket()](store::Store& s) mutable {
      fence();
      train::FirstCheckpointGate::pass(first);
      if (!rng_tensor.empty()) {
        const std::vector<uint8_t> bytes = batch_bytes(rng_tensor);
        rng_state.assign(bytes.begin(), bytes.end());
      }
      store::StepRecord rec;
      rec.run = run;
      rec.step = step;
      rec.lr = lr;
      rec.loss_bits = store::float_bits(static_cast<float>(scalar_value(scalars[0].second)));  // exact
      rec.grad_norm_bits = store::float_bits(static_cast<float>(scalar_value(scalars[1].second)));
      std::vector<std::pair<std::string, double>> metrics = {{"lr", lr}, {"step_seconds", seconds}};
      for (size_t k = 2; k < scalars.size(); ++k) metrics.emplace_back(scalars[k].first, scalar_value(scalars[k].second));
      for (auto& m : monitors_from_stats(stats)) metrics.push_back(std::move(m));
      const std::string d = digest();
      if (!d.empty()) rec.param_digest = d;
      const std::vector<uint8_t> tokens = batch_bytes(batch);
      rec.batch_hash = store::content_hash(tokens.data(), tokens.size());
      if (!extra.empty()) rec.extra = extra;
      auto tx = s.begin_step();
      rec.batch_ref = s.put_blob(tokens.data(), tokens.size());
      if (!rng_state.empty()) rec.rng_ref = s.put_blob(rng_state.data(), rng_state.size());
      s.put_step(rec);
      s.put_metrics(rec.run, rec.step, metrics);
      if (!ops.empty()) s.put_kv(rec.run, "ops", ops);
      s.check_in_place();  // a deleted or moved store would take the step without an error
      tx.commit();
      if ((rec.step + 1) % kWalCheckpointSteps == 0) s.checkpoint_wal();
    });
  }

  // The state before step `step` runs, copied here (the loop goes on changing it) and written
  // by the checkpoint writer once the steps queued before it are committed
  // (train::write_checkpoint: all rows in one transaction). Waits while one checkpoint is
  // being written and another waits behind it (which checkpoint_due avoids unless the schedule
  // waits for the writer).
  void put_checkpoint(int64_t step, const std::vector<std::pair<std::string, torch::Tensor>>& state) {
    require_open();
    schedule_.taken(step);
    double room_s = 0;
    {
      py::gil_scoped_release nogil;
      checkpoints_->wait_for_room(&room_s);  // before staging: the stager's buffers of two checkpoints ago are free
    }
    // As train::Recorder: host tensors cloned, device ones copied into a device snapshot that
    // the writer copies to the host (or, where none fits, into reused pinned buffers on a side
    // stream that the loop's stream waits for on the device). The loop's thread does not wait
    // for the bytes.
    const auto t0 = std::chrono::steady_clock::now();
    train::StateStager::Staged staged = stager_.stage(train::NamedTensors(state.begin(), state.end()));
    if (switches::listed(switches::Switch::kTimes, "record")) {  // where a checkpoint's time on the loop's thread goes
      const double stage_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "rewind: checkpoint at step %lld: waited for the writer %.1f ms, staged in %.1f ms "
                   "(buffers %.1f ms)\n", static_cast<long long>(step), 1e3 * room_s, 1e3 * stage_s,
                   1e3 * staged.buffer_seconds);
    }
    py::gil_scoped_release nogil;
    const uint64_t steps_before = steps_->pushed();
    store::StoreWorker* steps = steps_.get();
    checkpoints_->push([steps, steps_before, run = run_, step, take = std::move(staged.take),
                        written = first_checkpoint_.arm()](store::Store& s) {
      try {
        steps->wait_done(steps_before);
        const train::NamedTensors host = take();  // the host copies, once they hold the bytes
        s.check_in_place();
        train::write_checkpoint(s, run, step, host);
        s.checkpoint_wal();
      } catch (...) {
        if (written) written->set_exception(std::current_exception());
        throw;
      }
      if (written) written->set_value();
    });
  }

  // Commits everything queued (rethrowing a write that failed) and lets go of the lock.
  void close() {
    if (!steps_) return;
    {
      py::gil_scoped_release nogil;
      steps_->flush();
      checkpoints_->flush();
      checkpoints_.reset();
      steps_.reset();
    }
    lock_.reset();
  }

 private:
  // As train::Recorder: at most this many steps wait for the step writer; the WAL is copied
  // into the main file every this many steps (and after each checkpoint).
  static constexpr size_t kMaxQueuedSteps = 256;
  static constexpr int64_t kWalCheckpointSteps = 1024;

  void require_open() const {
    if (!steps_) throw Error(ExitCode::kUsage, "rewind.record: the recording is closed");
  }

  std::unique_ptr<store::WriterLock> lock_;
  int64_t run_ = 0;
  train::CheckpointSchedule schedule_{1, true};
  train::StateStager stager_;  // before the writers: their queued checkpoints hold its buffers
  train::FirstCheckpointGate first_checkpoint_;  // before the writers: their last jobs use it
  std::unique_ptr<store::StoreWorker> steps_;
  std::unique_ptr<store::StoreWorker> checkpoints_;
  std::vector<torch::Tensor> params_;
};

// The read side of a replay driven by `rewind replay --cmd`: one read-only connection.
class ScriptReplay {
 public:
  explicit ScriptReplay(const std::string& path)
      : store_(store::Store::open(path, store::Mode::kReadOnly)) {}

  // {"id", "config", "plan", "meta"} of run `run` (0: the last one).
  py::dict run(int64_t run) {
    const std::vector<store::RunInfo> runs = store_.runs();
    if (runs.empty()) throw Error(ExitCode::kData, "store '" + store_.path() + "' holds no run");
    const store::RunInfo* r = run == 0 ? &runs.back() : nullptr;
    for (const store::RunInfo& x : runs)
      if (x.id == run) r = &x;
    if (!r) throw Error(ExitCode::kUsage, "store '" + store_.path() + "' has no run " + std::to_string(run));
    py::dict d;
    d["id"] = r->id;
    d["config"] = r->config;
    d["plan"] = r->plan;
    d["meta"] = r->meta;
    return d;
  }

  std::optional<int64_t> nearest_checkpoint(int64_t run, int64_t step) { return store_.nearest_checkpoint(run, step); }

  py::list checkpoint(int64_t run, int64_t step) { return named_list(train::read_checkpoint(store_, run, step)); }

  // A recorded step: {"batch": bytes, "rng": bytes, "extra": str, "batch_hash": str,
  // "loss_bits": int, "digest": str ("" where none was recorded)}, or None.
  py::object step(int64_t run, int64_t step) {
    const std::optional<store::StepRecord> rec = store_.get_step(run, step);
    if (!rec) return py::none();
    py::dict d;
    d["batch_hash"] = rec->batch_hash;
    d["loss_bits"] = rec->loss_bits;
    d["digest"] = rec->param_digest.value_or("");
    d["extra"] = rec->extra.value_or("");
    d["batch"] = blob(rec->batch_ref);
    d["rng"] = blob(rec->rng_ref);
    return d;
  }

 private:
  py::bytes blob(const std::optional<std::string>& hash) {
    if (!hash) return py::bytes("");
    const std::vector<uint8_t> b = store_.get_blob(*hash);
    return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }

  store::Store store_;
};

void bind_record(py::module_& m) {
  m.def("param_digest", &param_digest, py::arg("params"), py::arg("tensor_path") = false,
        "the d2 digest (\"d2:\" + 16 hex) of the tensors in order, as rewind's trainer records it");
  // The trainer's queued digest (the CUDA kernel on a GPU): a function that returns param_digest's
  // string, waiting only for the sums' copy.
  m.def(
      "param_digest_queued",
      [](const std::vector<torch::Tensor>& params) {
        std::function<std::string()> f = train::queue_param_digest(params);
        return py::cpp_function([f]() { return f(); });
      },
      py::arg("params"), "param_digest, queued behind the device's work: call the result for the string");
  m.def(
      "add_word_sums",
      [](const std::vector<torch::Tensor>& tensors, torch::Tensor sums, int64_t offset) {
        train::add_word_sums(tensors, sums, offset);
      },
      py::arg("tensors"), py::arg("sums"), py::arg("offset"),
      "adds each tensor's digest word sum into sums[offset + k] (int64, on their device), queued on a GPU");
  py::class_<ScriptRecording>(m, "ScriptRecording")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&>(),
           py::arg("path"), py::arg("config"), py::arg("plan"), py::arg("meta"))
      .def_property_readonly("run", &ScriptRecording::run)
      .def("set_params", &ScriptRecording::set_params, py::arg("params"))
      .def("queue_step", &ScriptRecording::queue_step, py::arg("step"), py::arg("lr"), py::arg("seconds"),
           py::arg("scalars"), py::arg("batch"), py::arg("rng"), py::arg("extra"), py::arg("ops"), py::arg("cuda"))
      .def("schedule_checkpoints", &ScriptRecording::schedule_checkpoints, py::arg("every"), py::arg("wait"))
      .def("checkpoint_due", &ScriptRecording::checkpoint_due, py::arg("step"))
      .def("checkpoint_lateness", &ScriptRecording::checkpoint_lateness)
      .def("put_checkpoint", &ScriptRecording::put_checkpoint, py::arg("step"), py::arg("state"))
      .def("close", &ScriptRecording::close);
  py::class_<ScriptReplay>(m, "ScriptReplay")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def("run", &ScriptReplay::run, py::arg("run"))
      .def("nearest_checkpoint", &ScriptReplay::nearest_checkpoint, py::arg("run"), py::arg("step"))
      .def("checkpoint", &ScriptReplay::checkpoint, py::arg("run"), py::arg("step"))
      .def("step", &ScriptReplay::step, py::arg("run"), py::arg("step"));
}

}  // namespace rwd::python
