// nanoGPT checkpoints (the ckpt.pt train.py saves) mapped onto rewind's model and AdamW state
// and back, and a nanoGPT run imported into / exported from a store.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "interop/pickle_io.h"
#include "train/config.h"
#include "store/store.h"
#include "train/trainer.h"

namespace rwd::interop {

// One parameter in both spellings, in nanoGPT's named_parameters() order.
struct ParamName {
  std::string nanogpt;  // "transformer.h.0.attn.c_attn.weight"
  std::string rewind;   // "h.0.c_attn"
  std::vector<int64_t> shape;
};
std::vector<ParamName> param_names(const train::Config& c);

// A nanoGPT checkpoint in rewind's terms.
struct NanoGptCheckpoint {
  train::Config config;       // shape from model_args, hyperparameters from config
  int64_t iter_num = 0;
  train::NamedTensors state;  // "param/<rewind name>", "adam_m/...", "adam_v/...", "step"
  // What rewind's model has no place for, kept so export writes it back: model_args, config,
  // best_val_loss, the optimizer's param_groups, the "_orig_mod." prefix, whether the model
  // held the causal-mask buffers (attn.bias, nanoGPT under torch < 2) and any other keys.
  nlohmann::json extra = nlohmann::json::object();
  std::vector<std::string> warnings;  // one line each: what the import could not keep exactly
};

// Reads and checks a checkpoint: missing keys, unknown keys, wrong shapes, a model that is not
// GPT-2-shaped or a dict that is not nanoGPT's throw InteropError naming the key.
// `config_json`: nanoGPT keys overriding the checkpoint's hyperparameters (its model keys must
// agree with the checkpoint's model).
NanoGptCheckpoint read_nanogpt(const std::string& path, const std::string& config_json = "");
// The same for a checkpoint already read (read_pickle / load_torch_file); `name` for messages.
NanoGptCheckpoint nanogpt_checkpoint(const c10::IValue& root, const std::string& name,
                                     const std::string& config_json = "");

// Writes rewind's state at iteration `iter_num` as a nanoGPT ckpt.pt: GPT.load_state_dict(
// strict=True) accepts its model, train.py resumes from it. `extra`: what read_nanogpt kept
// (empty for a run rewind started itself).
void write_nanogpt(const std::string& path, const train::Config& config,
                   const train::NamedTensors& state, int64_t iter_num, const nlohmann::json& extra);

// The nanoGPT `config` dict rewind's Config stands for (train.py's keys).
nlohmann::json nanogpt_config(const train::Config& c);
nlohmann::json nanogpt_model_args(const train::Config& c);

}  // namespace rwd::interop

namespace rwd::interop {

struct ImportOptions {
  std::string ckpt, data, record;  // ckpt.pt, train.bin, the new store
  std::string config_json;         // overrides (see read_nanogpt); "" for none
  std::string plan;                // the run's recorded precision plan ("" = default)
  int checkpoint_every = 20;       // recorded; `train --resume` checkpoints on this schedule
  int threads = 1;                 // recorded; replay uses the same count
  store::StoreOptions store;
};
struct ImportResult {
  int64_t run = 0, iter_num = 0;
  train::Config config;
  std::vector<std::string> warnings;
};
// Reads the checkpoint, checks that it loads into rewind's trainer, then creates the store
// with one run whose first checkpoint is iter_num. On any failure no store is left behind.
ImportResult import_nanogpt(const ImportOptions& o);
// The nanoGPT fields kept at import (kv "nanogpt"), or an empty object for rewind's own runs.
nlohmann::json imported_extra(store::Store& s, int64_t run);

}  // namespace rwd::interop
