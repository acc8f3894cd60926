// What recorded a run, read from its meta JSON (runs.meta): rewind train, or a Python script
// (rewind.record: "kind": "python"), and on how many data-parallel ranks ("world_size").
// Header-only: cli/cmd_store.cpp, which the store tests compile without LibTorch, uses it.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

namespace rwd::cli {

// The data-parallel ranks a run was recorded on (1 where its meta does not say).
inline int recorded_ranks(const std::string& meta_json) {
  const nlohmann::json meta = nlohmann::json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object()) return 1;
  const auto n = meta.find("world_size");
  return n != meta.end() && n->is_number_integer() ? std::max(1, n->get<int>()) : 1;
}

// "rewind train, one process", "a Python script (rewind.record), 2 data-parallel ranks (...)".
inline std::string recorded_by(const std::string& meta_json) {
  const nlohmann::json meta = nlohmann::json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  const bool script = meta.is_object() && meta.value("kind", "") == "python";
  const int ranks = recorded_ranks(meta_json);
  std::string out = script ? "a Python script (rewind.record)" : "rewind train";
  out += ranks > 1 ? ", " + std::to_string(ranks) + " data-parallel ranks" : ", one process";
  if (script && ranks > 1)
    out += " (replay with the same launcher, e.g. torchrun --nproc_per_node " + std::to_string(ranks) + ")";
  return out;
}

}  // namespace rwd::cli
