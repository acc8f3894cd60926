// Fuzz target: the store reader on a whole file (seeds: fuzz/corpus/store, small stores made by
// make_store_seed). The bytes become a store file opened read-only; then everything
// `rewind store info|ls|verify|export` and replay read: runs, steps, metrics, probes, kv,
// checkpoints and tensors (rows, shapes, dtypes, blob frames) and the .npy export.
#include <unistd.h>

#include <cstdio>

#include "fuzz/fuzz_util.h"
#include "store/npy.h"
#include "store/store.h"

namespace {

std::string scratch_path(const char* suffix) {
  return "/tmp/rwd_fuzz_store_" + std::to_string(::getpid()) + suffix;
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

void export_npy(const rwd::store::TensorRecord& t) {
  rwd::store::write_npy(scratch_path(".npy"), t.info.dtype, t.info.shape, t.bytes.data(),
                        t.bytes.size());
}

void read_everything(rwd::store::Store& s) {
  s.info();
  s.verify();
  s.probes();
  s.kv_keys(0);
  for (const rwd::store::RunInfo& run : s.runs()) {
    s.kv_keys(run.id);
    s.metric_keys(run.id);
    s.metrics(run.id, INT64_MIN, INT64_MAX);
    if (auto range = s.step_range(run.id)) {
      for (const auto& step : s.steps(run.id, range->first, range->second)) {
        if (step.batch_ref) rwd::fuzz::expect_clean([&] { s.get_blob(*step.batch_ref); });
      }
    }
    for (int64_t step : s.checkpoint_steps(run.id)) {
      for (const auto& e : s.checkpoint_entries(run.id, step)) {
        rwd::fuzz::expect_clean([&] {
          if (auto t = s.get_checkpoint_tensor(run.id, step, e.key.name)) export_npy(*t);
        });
      }
    }
    for (const auto& e : s.tensors(run.id, INT64_MIN, INT64_MAX)) {
      rwd::fuzz::expect_clean([&] {
        if (auto t = s.get_tensor(e.key)) export_npy(*t);
      });
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string db = scratch_path(".db");
  for (const char* side : {"", "-wal", "-shm"}) std::remove((db + side).c_str());
  write_file(db, data, size);
  rwd::fuzz::expect_clean([&] {
    rwd::store::Store s = rwd::store::Store::open(db, rwd::store::Mode::kReadOnly);
    read_everything(s);
  });
  for (const char* side : {"", "-wal", "-shm", ".npy"}) std::remove((db + side).c_str());
  std::remove(scratch_path(".npy").c_str());
  return 0;
}
