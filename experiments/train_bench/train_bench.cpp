// CPU training benchmark, all figures as ratios against a baseline measured in the same run:
//  1. step time of `tiny` and `small-cpu` with our attention emulation vs LibTorch FP32
//     attention math (the cost of emulating the kernels' rounding points);
//  2. recording overhead (no capture; capture of one layer) and bytes stored per step and per
//     checkpoint with compression ratios;
//  3. replay speed relative to the recorded run.
// Usage: train_bench [steps] [threads]
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "train/recorder.h"
#include "replay/replayer.h"
#include "train/run_spec.h"
#include "train/trainer.h"
#include "store/store.h"

namespace {

using namespace rwd;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median step time (ms) over `steps` steps after one warm-up step.
double step_ms(const train::Config& c, const train::TokenFile& data, train::AttentionImpl impl,
               int steps) {
  train::Trainer t(c, plan::Plan::defaults(c.n_layer, c.n_head), data, torch::kCPU, impl);
  t.train_step();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) ms.push_back(t.train_step().seconds * 1000.0);
  return median(ms);
}

struct RecordFigures {
  double ms_plain = 0, ms_record = 0, ms_capture = 0;
  double step_raw = 0;                   // file bytes per step (no capture, no checkpoint)
  double ckpt_raw = 0, ckpt_stored = 0;  // bytes per checkpoint
  double replay_ms = 0;                  // per replayed step
};

// Records `steps` steps into `path`; returns the median wall ms per step including recording.
double record(const train::Config& c, const train::TokenFile& data, const std::string& path,
              int steps, const std::string& capture, int ckpt_every, train::RunSpec* spec_out) {
  std::remove(path.c_str());
  auto st = store::Store::create(path);
  train::RunSpec spec;
  spec.config = c;
  spec.threads = at::get_num_threads();
  spec.data_path = data.path();
  spec.data_fingerprint = data.fingerprint();
  spec.checkpoint_every = ckpt_every;
  spec.run_id = st.add_run(c.to_json(), spec.plan.to_json(), spec.meta_json());
  train::RecordOptions ro;
  ro.checkpoint_every = ckpt_every;
  ro.capture = train::CaptureSpec::parse(capture, c.n_layer, c.n_head);
  train::Trainer t(c, plan::Plan::defaults(c.n_layer, c.n_head), data);
  std::vector<double> ms;
  {
    train::Recorder rec(path, spec.run_id, ro, store::StoreOptions{});
    for (int s = 0; s < steps; ++s) {
      auto t0 = Clock::now();
      if (rec.checkpoint_due(s)) rec.checkpoint(s, t);
      std::vector<int> layers;
      if (ro.capture.active(s)) layers = ro.capture.layers;
      t.set_want_digest(rec.wants_digest(s));  // as `rewind train`: summed by the update, read behind it
      train::StepResult r = t.train_step(layers);
      rec.record_step(r, r.digest, data, c.block_size);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    rec.flush();
  }
  if (spec_out) *spec_out = spec;
  return median(ms);
}

RecordFigures record_figures(const train::Config& c, const train::TokenFile& data, int steps,
                             const std::string& dir) {
  RecordFigures f;
  f.ms_plain = step_ms(c, data, train::AttentionImpl::kRewind, steps);
  // Bytes per step: a run without checkpoints; bytes per checkpoint: one more with one.
  const std::string p0 = dir + "/bench_steps.db", p1 = dir + "/bench_ckpt.db", p2 = dir + "/bench_cap.db";
  f.ms_record = record(c, data, p0, steps, "", 0, nullptr);
  auto s0 = store::Store::open(p0, store::Mode::kReadOnly).info();
  // Step rows and metrics are plain SQLite rows (not blobs): count the file's growth.
  f.step_raw = double(s0.file_bytes) / steps;
  record(c, data, p1, steps, "", steps, nullptr);  // exactly one checkpoint, at step 0
  auto s1 = store::Store::open(p1, store::Mode::kReadOnly).info();
  f.ckpt_raw = double(s1.raw_bytes - s0.raw_bytes);
  f.ckpt_stored = double(s1.stored_bytes - s0.stored_bytes);
  f.ms_capture = record(c, data, p2, steps, "steps=0:1000000;L0", 0, nullptr);
  // Replay the one-checkpoint recording end to end.
  auto st = store::Store::open(p1, store::Mode::kReadWrite);
  replay::ReplayOptions o;
  o.from = 0;
  o.to = steps - 1;
  o.restore.verify = true;
  replay::ReplayResult rr = replay::replay(st, o);
  f.replay_ms = rr.seconds * 1000.0 / steps;
  for (const auto& p : {p0, p1, p2}) {
    std::remove(p.c_str());
    std::remove((p + "-wal").c_str());
    std::remove((p + "-shm").c_str());
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 1;
  at::set_num_threads(threads);
  const std::string dir = "/tmp";
  const std::string data_path = dir + "/train_bench.bin";
  train::write_synth_tokens(data_path, 2000000, 256, 3);
  train::TokenFile data(data_path);
  std::printf("train_bench: %d steps per measurement, %d thread(s), median step times\n\n", steps, threads);
  std::printf("1. attention cost: our BF16 emulation vs LibTorch FP32 attention math (same model)\n");
  std::printf("%-10s %14s %14s %8s\n", "preset", "rewind ms", "torch ms", "ratio");
  for (const char* preset : {"tiny", "small-cpu"}) {
    train::Config c = train::Config::preset(preset);
    double ours = step_ms(c, data, train::AttentionImpl::kRewind, steps);
    double base = step_ms(c, data, train::AttentionImpl::kTorchMath, steps);
    std::printf("%-10s %14.2f %14.2f %8.2f\n", preset, ours, base, ours / base);
  }
  std::printf("\n2./3. recording and replay (ratios against plain training in this run)\n");
  std::printf("%-10s %9s %9s %9s %11s %12s %21s %9s\n", "preset", "train ms", "record", "+capture",
              "B/step file", "B/ckpt raw", "stored (ratio)", "replay");
  for (const char* preset : {"tiny", "small-cpu"}) {
    train::Config c = train::Config::preset(preset);
    RecordFigures f = record_figures(c, data, steps, dir);
    std::printf("%-10s %9.2f %8.1f%% %8.1f%% %11.0f %12.0f %12.0f (%.2fx) %8.2fx\n", preset,
                f.ms_plain, (f.ms_record / f.ms_plain - 1) * 100, (f.ms_capture / f.ms_plain - 1) * 100,
                f.step_raw, f.ckpt_raw, f.ckpt_stored,
                f.ckpt_raw / std::max(1.0, f.ckpt_stored), f.ms_plain / f.replay_ms);
  }
  std::printf("\nrecord / +capture: extra wall time per step over plain training (capture = all heads of L0)\n"
              "replay: recorded-run step time / replayed step time (>1: replay faster)\n");
  std::remove(data_path.c_str());
  return 0;
}
