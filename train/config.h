// Model and training configuration under nanoGPT's key names; presets, JSON files and
// command-line overrides. No LibTorch.
#pragma once

#include <cstdint>
#include <string>

namespace rwd::train {

struct Config {
  // model
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;
  int block_size = 64;
  int vocab_size = 256;
  bool bias = false;  // nanoGPT's bias: LayerNorm and Linear biases (imported checkpoints)
  // optimisation (nanoGPT defaults where the paper does not say otherwise)
  int batch_size = 4;
  int gradient_accumulation_steps = 1;
  double learning_rate = 1e-3;
  double min_lr = 1e-5;
  int warmup_iters = 10;
  int lr_decay_iters = 1000;
  int max_iters = 100;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 1.0;
  uint64_t seed = 1337;

  int head_dim() const { return n_embd / n_head; }
  std::string to_json() const;          // every field, stable key order
  // Keys in `text` override `base`; unknown keys are a usage error.
  static Config from_json(const std::string& text, const Config& base);
  static Config from_json(const std::string& text) { return from_json(text, Config{}); }
  static Config preset(const std::string& name);     // tiny | small-cpu | gpt2-small
  void validate() const;                              // throws UsageError
  // Throws UsageError when our CUDA attention kernels cannot run this model's head dim
  // (device "cuda[:N]" with the rewind attention); other devices take any head dim.
  void validate_for_device(const std::string& device, bool rewind_attention) const;
  // True when the two configs describe the same model (shapes), regardless of optimisation.
  bool same_model(const Config& o) const;
};

// The learning rate at iteration `it`: linear warmup to learning_rate, cosine decay to
// min_lr at lr_decay_iters, min_lr after (nanoGPT's get_lr).
double lr_at(const Config& c, int64_t it);

// Names of the overridable keys (nanoGPT spelling), for the CLI's --n-layer etc.
extern const char* const kConfigKeys[];
extern const int kNumConfigKeys;
// Sets key (nanoGPT spelling, '-' or '_') from text; throws UsageError on bad key/value.
void set_config_value(Config& c, const std::string& key, const std::string& value);

}  // namespace rwd::train
