// runs.meta JSON read with every value type- and range-checked (nlohmann's value<int>() casts
// a double like 1e20 to int, which is undefined behaviour; integers go through json_int).
#include "train/run_meta.h"

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/error.h"
#include "common/json_int.h"

namespace rwd::train {

namespace {

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw Error(ExitCode::kData, "run metadata is not valid: " + key + " " + what);
}

void read_int(const nlohmann::json& j, const char* key, int lo, int hi, int& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!it->is_number()) bad(key, "must be an integer");
  const std::optional<int> v = json_int<int>(*it, lo, hi);
  if (!v) bad(key, "must be a whole number in " + std::to_string(lo) + ".." + std::to_string(hi));
  out = *v;
}

void read_string(const nlohmann::json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!it->is_string()) bad(key, "must be a string");
  out = it->get<std::string>();
}

void read_bool(const nlohmann::json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!it->is_boolean()) bad(key, "must be true or false");
  out = it->get<bool>();
}

void read_string_map(const nlohmann::json& j, const char* key, std::map<std::string, std::string>& out) {
  auto it = j.find(key);
  if (it == j.end()) return;
  if (!it->is_object()) bad(key, "must be an object");
  for (const auto& [name, value] : it->items()) {
    if (!value.is_string()) bad(std::string(key) + "." + name, "must be a string");
    out[name] = value.get<std::string>();
  }
}

}  // namespace

RunMeta RunMeta::parse(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ExitCode::kData, std::string("run metadata is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(ExitCode::kData, "run metadata is not a JSON object");
  constexpr int kMax = std::numeric_limits<int>::max();
  RunMeta m;
  m.recorded_rewind = "?";
  m.recorded_torch = "?";
  m.recorded_numerics = 1;  // runs before the field existed: version 1
  read_string(j, "data_path", m.data_path);
  read_string(j, "data_fingerprint", m.data_fingerprint);
  read_int(j, "threads", 1, 4096, m.threads);
  read_string(j, "device", m.device);
  read_string(j, "device_name", m.device_name);
  read_string(j, "attention", m.attention);
  read_int(j, "checkpoint_every", 0, kMax, m.checkpoint_every);
  read_int(j, "digest_every", 0, kMax, m.digest_every);
  read_int(j, "monitor_every", 1, kMax, m.monitor_every);
  read_bool(j, "full_batches", m.full_batches);
  read_int(j, "world_size", 1, 65536, m.world_size);
  read_int(j, "keep_last", 0, kMax, m.keep_last);
  read_int(j, "keep_every", 0, kMax, m.keep_every);
  read_string(j, "rewind_version", m.recorded_rewind);
  read_string(j, "torch_version", m.recorded_torch);
  read_int(j, "numerics", 1, kMax, m.recorded_numerics);
  read_string_map(j, "switches", m.switches);
  return m;
}

}  // namespace rwd::train
