// Config presets, JSON round trip and validation.
#include "train/config.h"

#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.h"
#include "common/json_int.h"
#include "kernels/attention_params.h"

namespace rwd::train {

const char* const kConfigKeys[] = {
    "n_layer",      "n_head",        "n_embd",  "block_size",     "vocab_size",
    "batch_size",   "gradient_accumulation_steps", "learning_rate", "min_lr",
    "warmup_iters", "lr_decay_iters", "max_iters", "weight_decay", "beta1", "beta2",
    "grad_clip",    "seed",          "bias"};
const int kNumConfigKeys = sizeof(kConfigKeys) / sizeof(kConfigKeys[0]);

namespace {

std::string underscore(std::string key) {
  for (char& ch : key)
    if (ch == '-') ch = '_';
  return key;
}

template <typename T>
T parse_number(const std::string& key, const std::string& text) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    if (!std::isfinite(v)) throw std::invalid_argument(text);
    if constexpr (std::is_integral_v<T>) {
      // A whole number inside T's range; the cast of one outside it is undefined behaviour.
      const std::optional<T> whole = whole_number<T>(v);
      if (!whole) throw std::out_of_range(text);
      return *whole;
    } else {
      return v;
    }
  } catch (const std::logic_error&) {
    throw UsageError("config: " + key + ": not a number: '" + text + "'");
  }
}

bool parse_bool(const std::string& key, const std::string& text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  throw UsageError("config: " + key + ": expected true or false, got '" + text + "'");
}

}  // namespace

void set_config_value(Config& c, const std::string& raw_key, const std::string& v) {
  const std::string key = underscore(raw_key);
  if (key == "n_layer") c.n_layer = parse_number<int>(key, v);
  else if (key == "n_head") c.n_head = parse_number<int>(key, v);
  else if (key == "n_embd") c.n_embd = parse_number<int>(key, v);
  else if (key == "block_size") c.block_size = parse_number<int>(key, v);
  else if (key == "vocab_size") c.vocab_size = parse_number<int>(key, v);
  else if (key == "batch_size") c.batch_size = parse_number<int>(key, v);
  else if (key == "gradient_accumulation_steps") c.gradient_accumulation_steps = parse_number<int>(key, v);
  else if (key == "learning_rate") c.learning_rate = parse_number<double>(key, v);
  else if (key == "min_lr") c.min_lr = parse_number<double>(key, v);
  else if (key == "warmup_iters") c.warmup_iters = parse_number<int>(key, v);
  else if (key == "lr_decay_iters") c.lr_decay_iters = parse_number<int>(key, v);
  else if (key == "max_iters") c.max_iters = parse_number<int>(key, v);
  else if (key == "weight_decay") c.weight_decay = parse_number<double>(key, v);
  else if (key == "beta1") c.beta1 = parse_number<double>(key, v);
  else if (key == "beta2") c.beta2 = parse_number<double>(key, v);
  else if (key == "grad_clip") c.grad_clip = parse_number<double>(key, v);
  else if (key == "seed") c.seed = parse_number<uint64_t>(key, v);
  else if (key == "bias") c.bias = parse_bool(key, v);
  else throw UsageError("config: unknown key '" + raw_key + "'");
}

std::string Config::to_json() const {
  nlohmann::ordered_json j;
  j["n_layer"] = n_layer;
  j["n_head"] = n_head;
  j["n_embd"] = n_embd;
  j["block_size"] = block_size;
  j["vocab_size"] = vocab_size;
  j["batch_size"] = batch_size;
  j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  j["learning_rate"] = learning_rate;
  j["min_lr"] = min_lr;
  j["warmup_iters"] = warmup_iters;
  j["lr_decay_iters"] = lr_decay_iters;
  j["max_iters"] = max_iters;
  j["weight_decay"] = weight_decay;
  j["beta1"] = beta1;
  j["beta2"] = beta2;
  j["grad_clip"] = grad_clip;
  j["seed"] = seed;
  if (bias) j["bias"] = true;  // absent when false: runs without biases keep their config text
  return j.dump();
}

Config Config::from_json(const std::string& text, const Config& base) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("config: not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw UsageError("config: expected a JSON object");
  Config c = base;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const auto& v = it.value();
    std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    set_config_value(c, it.key(), text);
  }
  c.validate();
  return c;
}

Config Config::preset(const std::string& name) {
  Config c;
  if (name == "tiny") {
    return c;  // the defaults above: 2 layers, 4 heads, width 64, seq 64, bytes
  }
  if (name == "small-cpu") {
    c.n_layer = 4;
    c.n_head = 4;
    c.n_embd = 128;
    c.block_size = 128;
    c.batch_size = 8;
    c.learning_rate = 3e-3;
    c.warmup_iters = 20;
    c.lr_decay_iters = 600;
    c.max_iters = 300;
    return c;
  }
  if (name == "gpt2-small") {
    // The paper's model (Qiu & Yao 2025): GPT-2 124M, nanoGPT settings, 2000 warmup,
    // 1e-3 -> 1e-5 cosine.
    c.n_layer = 12;
    c.n_head = 12;
    c.n_embd = 768;
    c.block_size = 1024;
    c.vocab_size = 50304;
    c.batch_size = 12;
    c.gradient_accumulation_steps = 40;
    c.learning_rate = 1e-3;
    c.min_lr = 1e-5;
    c.warmup_iters = 2000;
    c.lr_decay_iters = 600000;
    c.max_iters = 600000;
    c.weight_decay = 0.1;
    return c;
  }
  throw UsageError("unknown preset '" + name + "' (expected tiny, small-cpu, gpt2-small)");
}

void Config::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw UsageError("config: " + what);
  };
  need(n_layer >= 1 && n_layer <= 256, "n_layer must be in 1..256");
  need(n_head >= 1 && n_embd % n_head == 0, "n_embd must be a multiple of n_head");
  need(block_size >= 1, "block_size must be >= 1");
  need(vocab_size >= 2 && vocab_size <= 65536, "vocab_size must be in 2..65536 (uint16 tokens)");
  need(batch_size >= 1 && gradient_accumulation_steps >= 1, "batch sizes must be >= 1");
  need(learning_rate > 0 && min_lr >= 0, "learning rates must be positive");
  need(warmup_iters >= 0 && lr_decay_iters >= 1 && max_iters >= 0, "iteration counts must be >= 0");
  need(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "beta1, beta2 must be in [0, 1)");
  need(grad_clip >= 0 && weight_decay >= 0, "grad_clip and weight_decay must be >= 0");
}

void Config::validate_for_device(const std::string& device, bool rewind_attention) const {
  if (device.rfind("cuda", 0) != 0 || !rewind_attention || kernels::cuda_head_dim_supported(head_dim())) return;
  std::string dims;  // "32, 64, ... or 256"
  constexpr int kN = static_cast<int>(std::size(kernels::kCudaHeadDims));
  for (int i = 0; i < kN; ++i) {
    dims += (i == 0 ? "" : i + 1 < kN ? ", " : " or ") + std::to_string(kernels::kCudaHeadDims[i]);
  }
  throw UsageError("config: --device cuda runs attention heads of dim " + dims + " (n_embd / n_head); " +
                   std::to_string(n_embd) + " / " + std::to_string(n_head) + " = " +
                   std::to_string(head_dim()) + " (use --device cpu or --attention sdpa)");
}

bool Config::same_model(const Config& o) const {
  return n_layer == o.n_layer && n_head == o.n_head && n_embd == o.n_embd &&
         block_size == o.block_size && vocab_size == o.vocab_size && bias == o.bias;
}

double lr_at(const Config& c, int64_t it) {
  if (it < c.warmup_iters) return c.learning_rate * static_cast<double>(it + 1) / (c.warmup_iters + 1.0);
  if (it > c.lr_decay_iters) return c.min_lr;
  double denom = std::max(1, c.lr_decay_iters - c.warmup_iters);
  double ratio = static_cast<double>(it - c.warmup_iters) / denom;
  double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return c.min_lr + coeff * (c.learning_rate - c.min_lr);
}

}  // namespace rwd::train
