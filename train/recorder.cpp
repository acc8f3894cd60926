// Recorder: the step and checkpoint writers (background threads) and the checkpoint schedule.
#include "train/recorder.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/hash.h"
#include "train/tensor_io.h"

namespace rwd::train {

namespace {

// The background checkpoint writer hashes, shuffles and compresses blobs on threads of its
// own (Store::put_blobs) on the cores training leaves idle (at most 2), unless the caller
// chose a count: a gpt2-small checkpoint is 1.5 GB and one thread needs seconds for it,
// longer than the steps between checkpoints on a GPU. Two, not more: on the H200 host the
// writer stored four gpt2-small checkpoints in 10.7 s with 2 threads and 9.7-11.2 s with 8
// (SQLite and the WAL bound it, not zstd), while 8 threads slowed the training thread's part
// of the step more (mean recorded step +3.8%/+4.0% against +1.7%/+3.2% with 2, two calls).
store::StoreOptions writer_options(store::StoreOptions so) {
  so.wal_autocheckpoint = 0;  // the WAL is checkpointed on the writers' schedule (below)
  if (so.zstd_workers == 0) {
    const int idle = static_cast<int>(std::thread::hardware_concurrency()) - at::get_num_threads();
    so.zstd_workers = std::clamp(idle, 0, 2);
  }
  return so;
}

constexpr size_t kMaxQueuedSteps = 256;
// The step writer copies the WAL into the main file every this many steps, so the WAL stays
// small when checkpoints are rare; the checkpoint writer does after each checkpoint.
constexpr int64_t kWalCheckpointSteps = 1024;

store::StoreOptions step_writer_options(store::StoreOptions so) {
  so.wal_autocheckpoint = 0;
  return so;
}
}  // namespace

Recorder::Recorder(const std::string& store_path, int64_t run, const RecordOptions& o,
                   const store::StoreOptions& so)
    : path_(store_path),
      run_(run),
      opt_(o),
      schedule_(o.checkpoint_every, o.wait_for_writer),
      lock_(store_path, "a recording (rewind train)"),
      steps_(store_path, step_writer_options(so), kMaxQueuedSteps, "step writer"),
      checkpoints_(store_path, writer_options(so), 1, "checkpoint writer") {}

Recorder::~Recorder() = default;

template <class F>
void Recorder::guard(F&& body) {
  try {
    body();
  } catch (const store::StoreError& e) {
    explain(e);
  }
}

void Recorder::explain(const store::StoreError& e) {
  const store::WriteFailure why = store::write_failure(e.lib_code());
  if (why == store::WriteFailure::kOther) throw e;
  std::string line = "store: ";
  line += why == store::WriteFailure::kDiskFull   ? "disk full"
          : why == store::WriteFailure::kReadOnly ? "the store became read-only"
                                                  : "the store file was deleted or moved";
  if (failed_step_ >= 0) {
    line += " while writing step " + std::to_string(failed_step_);
  } else if (failed_checkpoint_ >= 0) {
    line += " while writing the checkpoint at step " + std::to_string(failed_checkpoint_);
  }
  // What a resume would start from: the store read back on a connection of its own.
  try {
    store::Store s = store::Store::open(path_, store::Mode::kReadOnly);
    const auto range = s.step_range(run_);
    line += range ? "; the store holds steps " + std::to_string(range->first) + ".." +
                        std::to_string(range->second)
                  : "; the store holds no step";
    const std::vector<int64_t> ckpts = s.checkpoint_steps(run_);
    if (!ckpts.empty()) line += " (last checkpoint at step " + std::to_string(ckpts.back()) + ")";
    const std::vector<store::BadItem> bad = s.verify();
    line += bad.empty() ? " and verifies" : " and does not verify: " + bad.front().problem;
  } catch (const store::StoreError& read_back) {
    line += "; cannot read it back: " + std::string(read_back.what());
  }
  throw store::StoreError(ExitCode::kData, line, e.lib_code());
}

bool Recorder::checkpoint_due(int64_t step, bool at_end) {
  return schedule_.due(step, checkpoints_.has_room() && stager_.ready(), at_end);
}

void Recorder::checkpoint(int64_t step, Trainer& trainer) {
  // Backpressure: at most one checkpoint waits while another is written, so host memory
  // stays bounded (gpt2-small's state is 1.5 GB); checkpoint_due defers rather than wait here
  // unless asked to, and any wait shows in the step's wall time.
  using Clock = std::chrono::steady_clock;
  schedule_.taken(step);
  guard([&] { checkpoints_.wait_for_room(&costs_.checkpoint_waited_seconds); });
  const auto t1 = Clock::now();
  StateStager::Staged staged =
      stager_.stage(trainer.state(), [&trainer](std::function<void()> f) { trainer.set_before_update(std::move(f)); });
  // The generators' states: unused by training (no dropout) but recorded so that a replay restores them (the steps table's rng_ref).
  NamedTensors rng;
  for (auto& g : trainer.rng_state()) rng.push_back(std::move(g));
  const uint64_t steps_before = steps_.pushed();
  std::shared_ptr<std::promise<void>> written = first_checkpoint_.arm();
  const auto t2 = Clock::now();
  guard([&] {
    checkpoints_.push([this, steps_before, step, run = run_, take = std::move(staged.take), rng = std::move(rng),
                       written](store::Store& s) {
      try {
        steps_.wait_done(steps_before);
        NamedTensors state = take();  // the host copies, once they hold the bytes
        state.insert(state.end(), rng.begin(), rng.end());
        s.check_in_place();
        write_checkpoint(s, run, step, state);
        if (opt_.retention.active()) {
          const auto t0 = Clock::now();
          const store::ThinPlan p = s.thin(run, {opt_.retention, {}, false});
          thinned_ += static_cast<int>(p.remove.size());
          thinned_bytes_ += p.stored_bytes;
          thin_micros_ += std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
        }
        // Its blobs were committed to the WAL without auto-checkpoints (one per blob commit
        // made the writer stop scaling); one pass now moves them into the main file and
        // empties the WAL. TRUNCATE, not PASSIVE: the step writer commits all the time, so a
        // passive pass never leaves the WAL fully copied and SQLite never restarts it; on the
        // H200 a 600-step gpt2-small recording with retention reached 30 GiB on disk (store and
        // WAL) while the store kept 6.2 GiB. The step writer waits meanwhile.
        s.checkpoint_wal(/*truncate=*/true);
      } catch (const store::StoreError&) {
        failed_checkpoint_ = step;
        if (written) written->set_exception(std::current_exception());
        throw;
      } catch (...) {
        if (written) written->set_exception(std::current_exception());
        throw;
      }
      if (written) written->set_value();
    });
  });  // no wait: there was room above, and only this thread queues checkpoints
  ++costs_.checkpoints;
  costs_.snapshot_seconds += std::chrono::duration<double>(t2 - t1).count();
}

Recorder::Costs Recorder::costs() {
  Costs c = costs_;
  c.late = schedule_.late();
  c.folded = schedule_.folded();
  c.max_late_steps = schedule_.max_late();
  c.checkpoint_writer_seconds = checkpoints_.busy_seconds();
  c.step_writer_seconds = steps_.busy_seconds();
  c.thinned = thinned_;
  c.thinned_bytes = thinned_bytes_;
  c.thin_seconds = static_cast<double>(thin_micros_) * 1e-6;
  return c;
}

void Recorder::flush() {
  guard([&] {
    steps_.flush();
    checkpoints_.flush();
  });
}

void Recorder::record_step(const StepResult& r, std::function<std::string()> digest, const TokenFile& data,
                           int block_size) {
  // Everything the transaction needs, copied on this thread (captured device tensors to the
  // host) so the step writer owns it.
  store::StepRecord rec;
  rec.run = run_;
  rec.step = r.step;
  rec.lr = r.lr;
  rec.loss_bits = store::float_bits(r.loss);
  rec.grad_norm_bits = store::float_bits(r.grad_norm);
  rec.batch_hash = hex64(r.batch_hash);
  nlohmann::json extra;
  extra["offsets"] = r.offsets;
  extra["seconds"] = r.seconds;
  rec.extra = extra.dump();
  std::vector<uint16_t> tokens;
  if (opt_.full_batches) {
    for (const auto& micro : r.offsets)
      for (int64_t off : micro) tokens.insert(tokens.end(), data.data() + off, data.data() + off + block_size + 1);
  }
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
  std::vector<std::pair<store::TensorKey, torch::Tensor>> tensors;
  for (size_t i = 0; i < opt_.capture.layers.size(); ++i) {
    const int layer = opt_.capture.layers[i];
    auto it = r.captures.find(layer);
    if (it == r.captures.end() || !it->second) continue;
    const kernels::AttentionCapture& c = *it->second;
    const std::pair<const char*, const torch::Tensor*> items[] = {
        {"q", &c.q}, {"k", &c.k}, {"v", &c.v}, {"o", &c.o}, {"lse", &c.lse}, {"do", &c.d_o}, {"delta", &c.delta}};
    if (c.x.defined()) {  // the layer input, shared by all heads: head -1
      tensors.emplace_back(store::TensorKey{run_, r.step, layer, -1, "x"}, c.x.contiguous().to(torch::kCPU));  // (B,T,C)
    }
    for (int head : opt_.capture.heads[i]) {
      for (const auto& [name, tensor] : items) {
        if (!tensor->defined()) continue;
        tensors.emplace_back(store::TensorKey{run_, r.step, layer, head, name},
                             tensor->select(1, head).contiguous().to(torch::kCPU));  // (B,T,D) or (B,T)
      }
    }
  }
  guard([&] {
    steps_.push(
        [this, rec = std::move(rec), digest = std::move(digest), tokens = std::move(tokens),
         metrics = std::move(metrics), tensors = std::move(tensors),
         first = first_checkpoint_.ticket()](store::Store& s) mutable {
          FirstCheckpointGate::pass(first);
          if (digest) rec.param_digest = digest();
          try {
            auto tx = s.begin_step();
            if (!tokens.empty()) rec.batch_ref = s.put_blob(tokens.data(), tokens.size() * 2);
            s.put_step(rec);
            s.put_metrics(rec.run, rec.step, metrics);
            for (const auto& [key, t] : tensors) {
              // Captures are tensors of this step's forward and backward, which nothing writes
              // afterwards: host ones are shared with the StepResult, not copied.
              s.put_tensor(key, store_dtype(t), shape_of(t), t.data_ptr(),
                           t.numel() * t.element_size());
            }
            s.check_in_place();  // else a deleted store would take the step without an error
            tx.commit();
            if ((rec.step + 1) % kWalCheckpointSteps == 0) s.checkpoint_wal();
          } catch (const store::StoreError&) {
            failed_step_ = rec.step;
            throw;
          }
        },
        &costs_.step_waited_seconds);
  });
}

}  // namespace rwd::train
