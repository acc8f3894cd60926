// A nanoGPT checkpoint turned into a new store (one run, first checkpoint at its iteration),
// and what the import kept for export.
#include <unistd.h>

#include <cstdio>

#include "interop/nanogpt.h"
#include "train/data.h"
#include "train/run_spec.h"
#include "train/tensor_io.h"

namespace rwd::interop {

namespace {

constexpr const char* kExtraKey = "nanogpt";

void remove_store_files(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::remove((path + suffix).c_str());
}

}  // namespace

ImportResult import_nanogpt(const ImportOptions& o) {
  if (o.record.empty()) throw InteropError("import: --record STORE is required", ExitCode::kUsage);
  if (access(o.record.c_str(), F_OK) == 0)
    throw InteropError("store " + o.record + ": already exists; refusing to overwrite it");
  NanoGptCheckpoint ck = read_nanogpt(o.ckpt, o.config_json);
  train::TokenFile data(o.data);
  train::RunSpec spec;
  spec.config = ck.config;
  spec.plan.base = o.plan;
  const plan::Plan plan = spec.plan.at(ck.iter_num, ck.config.n_layer, ck.config.n_head);
  spec.data_path = data.path();
  spec.data_fingerprint = data.fingerprint();
  spec.threads = o.threads;
  spec.device_name = train::device_name(torch::kCPU);
  spec.checkpoint_every = o.checkpoint_every;
  {
    // The state must load into rewind's own trainer (names, shapes, token range) before
    // anything is written.
    train::Trainer trainer(spec.config, plan, data);
    trainer.load_state(ck.state);
  }
  ImportResult res{0, ck.iter_num, ck.config, ck.warnings};
  try {
    store::Store s = store::Store::create(o.record, o.store);
    res.run = s.add_run(spec.config.to_json(), spec.plan.to_json(), spec.meta_json());
    s.put_kv(res.run, kExtraKey, ck.extra.dump());
    train::write_checkpoint(s, res.run, ck.iter_num, ck.state);
  } catch (...) {
    remove_store_files(o.record);
    throw;
  }
  return res;
}

nlohmann::json imported_extra(store::Store& s, int64_t run) {
  const std::optional<std::string> text = s.get_kv(run, kExtraKey);
  if (!text) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception&) {
    throw InteropError("store: run " + std::to_string(run) + " has a corrupt '" + kExtraKey + "' entry");
  }
}

}  // namespace rwd::interop
