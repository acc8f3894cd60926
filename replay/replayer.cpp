// Replay: checkpoint restore, fast-forward, verification and divergence curves.
#include "replay/replayer.h"

#include <chrono>
#include <future>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/hash.h"
#include "common/switches.h"
#include "store/reader_pins.h"
#include "store/window_check.h"
#include "train/tensor_io.h"

namespace rwd::replay {

namespace {

std::string describe(float v, uint32_t bits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", static_cast<double>(v), bits);
  return buf;
}

// Compares one replayed step with its record; returns "" when they agree bit for bit.
std::string mismatch(const train::StepResult& r, const store::StepRecord& rec, const std::string& digest) {
  const uint32_t lb = store::float_bits(r.loss), gb = store::float_bits(r.grad_norm);
  if (lb != rec.loss_bits)
    return "loss recorded " + describe(rec.loss(), rec.loss_bits) + " vs replayed " + describe(r.loss, lb);
  if (gb != rec.grad_norm_bits)
    return "grad norm recorded " + describe(rec.grad_norm(), rec.grad_norm_bits) + " vs replayed " +
           describe(r.grad_norm, gb);
  if (hex64(r.batch_hash) != rec.batch_hash)
    return "batch hash recorded " + rec.batch_hash + " vs replayed " + hex64(r.batch_hash);
  if (rec.param_digest && !digest.empty() && *rec.param_digest != digest)
    return "parameter digest recorded " + *rec.param_digest + " vs replayed " + digest;
  return "";
}

// Throws the divergence at `step` when its replay and its record (if any) disagree.
void check_step(train::Trainer& t, int64_t step, const ReplayedStep& rs) {
  if (!rs.recorded) return;
  std::string digest = rs.recorded->param_digest ? t.param_digest(*rs.recorded->param_digest) : "";
  std::string why = mismatch(rs.replayed, *rs.recorded, digest);
  if (!why.empty()) throw Error(ExitCode::kFinding, "replay diverged at step " + std::to_string(step) + ": " + why);
}

void check_dataset(const train::RunSpec& run, const train::TokenFile& data) {
  if (!run.data_fingerprint.empty() && data.fingerprint() != run.data_fingerprint)
    throw Error(ExitCode::kData, "dataset '" + data.path() + "' differs from the recording (fingerprint " +
                                     data.fingerprint() + ", recorded " + run.data_fingerprint + ")");
}

// The warm cache behind read_checkpoint_warm: entries in recency order (front: most recent).
struct WarmCache {
  struct Entry {
    std::string key;
    train::NamedTensors state;
    int64_t bytes = 0;
  };
  std::mutex mu;
  std::list<Entry> lru;
  std::unordered_map<std::string, std::list<Entry>::iterator> index;
  WarmStats stats;

  void evict_to(int64_t cap) {  // caller holds mu
    while (!lru.empty() && stats.bytes > cap) {
      stats.bytes -= lru.back().bytes;
      --stats.entries;
      index.erase(lru.back().key);
      lru.pop_back();
    }
  }
};

// Names a checkpoint by its content: every tensor's blob hash (get_blob checks it on every read).
std::string checkpoint_key(store::Store& s, int64_t run, int64_t step) {
  std::string key = s.path() + "\n" + std::to_string(run) + "\n" + std::to_string(step);
  for (const store::TensorInfo& t : s.checkpoint_entries(run, step)) {
    key += "\n" + t.key.name + " " + std::to_string(static_cast<int>(t.dtype)) + " " + t.blob;
    for (int64_t d : t.shape) key += " " + std::to_string(d);
  }
  return key;
}

// The warm trainer behind restore_before(warm = true).
struct WarmTrainer {
  std::string key;
  Restored restored;
  train::NamedTensors state;  // before the restored step, on the trainer's device
  int64_t plan_step = 0;      // the step whose recorded plan a cold restore leaves in force
};

WarmTrainer& warm_trainer() {
  static WarmTrainer* w = new WarmTrainer;  // never destroyed, as the cache below
  return *w;
}

bool restore_times() { return switches::listed(switches::Switch::kTimes, "restore"); }

bool warm_trainer_on() { return switches::on(switches::Switch::kWarmTrainer); }

WarmCache& warm_cache() {
  static WarmCache* c = new WarmCache;  // never destroyed: no tensor freed after LibTorch exits
  return *c;
}

int64_t warm_capacity() { return switches::integer(switches::Switch::kWarmBytes); }

}  // namespace

train::NamedTensors read_checkpoint_warm(store::Store& s, int64_t run, int64_t step) {
  WarmCache& c = warm_cache();
  const int64_t cap = warm_capacity();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.stats.capacity = cap;
    c.evict_to(cap);
  }
  if (cap == 0) return train::read_checkpoint(s, run, step);
  const std::string key = checkpoint_key(s, run, step);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.index.find(key); it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.stats.hits;
      return it->second->state;
    }
    ++c.stats.misses;
  }
  train::NamedTensors state = train::read_checkpoint(s, run, step);
  int64_t bytes = 0;
  for (const auto& nt : state) bytes += static_cast<int64_t>(nt.second.numel() * nt.second.element_size());
  std::lock_guard<std::mutex> lock(c.mu);
  if (bytes <= cap && !c.index.count(key)) {
    c.lru.push_front({key, state, bytes});
    c.index[key] = c.lru.begin();
    c.stats.bytes += bytes;
    ++c.stats.entries;
    c.evict_to(cap);
  }
  return state;
}

WarmStats warm_stats() {
  WarmCache& c = warm_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

void warm_clear() {
  WarmCache& c = warm_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.lru.clear();
  c.index.clear();
  const int64_t cap = c.stats.capacity;
  c.stats = WarmStats{};
  c.stats.capacity = cap;
  warm_trainer() = WarmTrainer{};
}

int64_t run_window(store::Store& s, Restored& r, const WindowOptions& o) {
  using clock = std::chrono::steady_clock;
  int64_t ran = 0;
  for (int64_t step = o.from; step <= o.to; ++step) {
    r.trainer->set_plan(o.plan_at(step));
    ReplayedStep rs;
    const auto s0 = clock::now();
    rs.replayed = r.trainer->train_step(o.capture_layers);
    rs.step_s = std::chrono::duration<double>(clock::now() - s0).count();
    ++ran;
    if (o.recorded) rs.recorded = s.get_step(r.run.run_id, step);
    if (o.on_step && !o.on_step(step, rs)) break;
  }
  return ran;
}

namespace {

Restored restore_cold(store::Store& s, int64_t run_id, int64_t step, const RestoreOptions& o);

}  // namespace

Restored restore_before(store::Store& s, int64_t run_id, int64_t step, const RestoreOptions& o) {
  // `store thin` keeps the checkpoint read here until this returns (reader_pins.h).
  const store::ReaderPin pin(s.path(), run_id, {step});
  if (!o.warm || !warm_trainer_on()) return restore_cold(s, run_id, step, o);
  // REWIND_TIMES=restore: each restore prints where its time went (stderr; cold ones below).
  const bool times = restore_times();
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto ms = [](clock::time_point a, clock::time_point b) { return 1e3 * std::chrono::duration<double>(b - a).count(); };
  // The key: what the restored state and the trainer depend on. A store's checkpoint is named
  // by its content; the ranks by the job's communicator (one per process and job).
  const int64_t run = train::RunSpec::load(s, run_id).run_id;
  const auto ckpt = s.nearest_checkpoint(run, step);
  std::string key = std::to_string(step) + "\n" + o.data_path + "\n" +
                    std::to_string(reinterpret_cast<uintptr_t>(o.comm)) + "\n";
  if (ckpt) key += checkpoint_key(s, run, *ckpt);
  WarmTrainer& w = warm_trainer();
  if (ckpt && w.restored.trainer && w.key == key) {
    std::lock_guard<std::mutex> lock(warm_cache().mu);
    ++warm_cache().stats.trainer_hits;
  } else {
    w = WarmTrainer{};  // frees the last trainer's device memory before the next one takes it
    Restored r = restore_cold(s, run_id, step, o);
    {
      std::lock_guard<std::mutex> lock(warm_cache().mu);
      ++warm_cache().stats.trainer_misses;
    }
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : r.trainer->state()) w.state.emplace_back(name, t.clone());
    for (auto& g : r.trainer->rng_state()) w.state.push_back(std::move(g));
    w.plan_step = step > r.checkpoint_step ? step - 1 : r.checkpoint_step;
    w.restored = std::move(r);
    w.key = key;
    return w.restored;
  }
  // What a cold restore leaves: the state before `step`, the plan last in force, no hooks.
  train::Trainer& t = *w.restored.trainer;
  const train::Config& c = w.restored.run.config;
  const auto t1 = clock::now();
  t.load_state(w.state);
  const auto t2 = clock::now();
  t.set_plan(w.restored.run.plan.at(w.plan_step, c.n_layer, c.n_head));
  t.set_want_digest(false);
  t.set_before_update({});
  if (times)
    std::fprintf(stderr, "rewind: warm restore: key %.1f ms, load_state %.1f ms, plan %.1f ms\n", ms(t0, t1),
                 ms(t1, t2), ms(t2, clock::now()));
  return w.restored;
}

namespace {

Restored restore_cold(store::Store& s, int64_t run_id, int64_t step, const RestoreOptions& o) {
  bool verify = o.verify;
  train::Comm* comm = o.comm;
  Restored r;
  r.run = train::RunSpec::load(s, run_id);
  auto range = s.step_range(r.run.run_id);
  auto ckpt = s.nearest_checkpoint(r.run.run_id, step);
  if (!ckpt)
    throw Error(ExitCode::kData, "missing checkpoint: no checkpoint at or before step " + std::to_string(step) +
                                     " in run " + std::to_string(r.run.run_id));
  if (step > *ckpt && (!range || step - 1 > range->second))
    throw UsageError("step " + std::to_string(step) + " is outside the recording");
  r.checkpoint_step = *ckpt;
  const std::string path = o.data_path.empty() ? r.run.data_path : o.data_path;
  r.data = std::make_shared<train::TokenFile>(path);
  check_dataset(r.run, *r.data);
  const train::Config& c = r.run.config;
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return 1e3 * std::chrono::duration<double>(b - a).count(); };
  const auto t0 = clock::now();
  // The checkpoint is read (decompressed on threads) while this thread sets up the device and
  // builds the trainer: independent, and each 1.3-2.3 s for gpt2-small on an H200 host. The
  // store is not touched here meanwhile. load_state copies every tensor into the trainer's own:
  // the warm cache's stay unchanged.
  double read_ms = 0;
  std::future<train::NamedTensors> reading = std::async(std::launch::async, [&] {
    const auto r0 = clock::now();
    train::NamedTensors state = o.warm ? read_checkpoint_warm(s, r.run.run_id, *ckpt)
                                       : train::read_checkpoint(s, r.run.run_id, *ckpt);
    read_ms = ms(r0, clock::now());
    return state;
  });
  const torch::Device device = train::setup_device(comm ? train::rank_device(r.run.device, comm->env()) : r.run.device);
  const int world = comm ? comm->world() : 1;
  train::warn_if_not_reproducible(r.run, device, world);
  const auto t_device = clock::now();
  // Uninitialized: load_state below overwrites every parameter and moment.
  r.trainer = std::make_shared<train::Trainer>(c, r.run.plan.at(*ckpt, c.n_layer, c.n_head), *r.data, device,
                                               train::attention_impl(r.run.attention), train::Trainer::Init::kForLoad);
  r.trainer->set_comm(comm);
  if (world != r.run.world_size) verify = false;  // bits may differ: the caller reports a curve
  const auto t1 = clock::now();
  const train::NamedTensors state = reading.get();
  const auto t2 = clock::now();
  r.trainer->load_state(state);
  if (restore_times())
    std::fprintf(stderr,
                 "rewind: cold restore: device %.1f ms and trainer %.1f ms, checkpoint read %.1f ms beside them "
                 "(%.1f ms waited after), load_state %.1f ms\n",
                 ms(t0, t_device), ms(t_device, t1), read_ms, ms(t1, t2), ms(t2, clock::now()));
  if (r.trainer->step() != *ckpt)
    throw Error(ExitCode::kData, "checkpoint at step " + std::to_string(*ckpt) + " holds step " +
                                     std::to_string(r.trainer->step()));
  // Fast-forward with the recorded plan (schedule honoured), verifying as we go if asked.
  const auto ff0 = clock::now();
  auto ff1 = ff0;
  const int64_t ff_steps = step - r.trainer->step();
  WindowOptions ff;
  ff.from = r.trainer->step();
  ff.to = step - 1;
  ff.plan_at = [&](int64_t at) { return r.run.plan.at(at, c.n_layer, c.n_head); };
  ff.recorded = verify;  // the record is read only to be compared
  ff.on_step = [&](int64_t at, ReplayedStep& rs) {
    if (verify) check_step(*r.trainer, at, rs);
    if (o.on_step) o.on_step(rs.replayed, false);
    if (ff1 == ff0) ff1 = clock::now();
    return true;
  };
  run_window(s, r, ff);
  if (restore_times() && ff_steps > 0)
    std::fprintf(stderr, "rewind: fast-forward: %lld steps in %.1f ms, the first %.1f ms\n",
                 static_cast<long long>(ff_steps), ms(ff0, clock::now()), ms(ff0, ff1));
  return r;
}

}  // namespace

ReplayResult replay(store::Store& s, const ReplayOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  train::RunSpec run = train::RunSpec::load(s, o.run);
  store::check_window(s, run.run_id, o.from, o.to);
  RestoreOptions ro = o.restore;
  ro.warm = false;
  Restored st = restore_before(s, run.run_id, o.from, ro);
  const train::Config& c = run.config;
  ReplayResult result;
  result.run = run;
  result.world_differs = run.world_size != (o.restore.comm ? o.restore.comm->world() : 1);
  result.checkpoint_step = st.checkpoint_step;
  WindowOptions w;
  w.from = o.from;
  w.to = o.to;
  w.capture_layers = o.capture_layers;
  w.plan_at = [&](int64_t step) {
    plan::Plan recorded = run.plan.at(step, c.n_layer, c.n_head);
    plan::Plan p = o.plan ? plan::apply(recorded, *o.plan) : recorded;
    if (p != recorded) result.plan_differs = true;
    result.plan_canonical = p.canonical();
    return p;
  };
  w.on_step = [&](int64_t step, ReplayedStep& rs) {
    // Another plan or number of ranks changes the bits: the window is a divergence curve.
    if (o.restore.verify && !result.plan_differs && !result.world_differs) check_step(*st.trainer, step, rs);
    if (o.restore.on_step) o.restore.on_step(rs.replayed, true);
    const bool finite = std::isfinite(rs.replayed.loss);
    result.window.push_back(std::move(rs));
    return !(o.stop_on_nonfinite && !finite);
  };
  run_window(s, st, w);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

std::map<std::string, std::vector<double>> window_series(const std::vector<ReplayedStep>& w) {
  std::map<std::string, std::vector<double>> s;
  for (const auto& st : w) {
    const train::StepResult& r = st.replayed;
    s["loss"].push_back(r.loss);
    s["grad_norm"].push_back(r.grad_norm);
    s["lr"].push_back(r.lr);
    if (st.recorded) s["recorded_loss"].push_back(st.recorded->loss());
    for (const train::HeadMonitor& m : r.monitors) {
      const std::string p = "L" + std::to_string(m.layer) + ".H" + std::to_string(m.head) + ".";
      s[p + "wq_sn"].push_back(m.wq_sn);
      s[p + "max_logit"].push_back(m.max_logit);
      s[p + "repmax_rate"].push_back(m.repmax_rate);
      s[p + "pbar_one"].push_back(m.pbar_one);
    }
  }
  return s;
}

std::string divergence_json(const ReplayResult& r) {
  nlohmann::json j;
  j["run"] = r.run.run_id;
  j["checkpoint"] = r.checkpoint_step;
  j["plan"] = r.plan_canonical;
  for (const auto& st : r.window) {
    nlohmann::json row;
    row["step"] = st.replayed.step;
    row["loss"] = st.replayed.loss;
    row["grad_norm"] = st.replayed.grad_norm;
    if (st.recorded) {
      row["recorded_loss"] = st.recorded->loss();
      row["recorded_grad_norm"] = st.recorded->grad_norm();
    }
    j["steps"].push_back(row);
  }
  return j.dump();
}

}  // namespace rwd::replay
