// The canonical text of a plan (docs/plan.md): only its non-default settings, compressed into
// layer and head selections, in a deterministic order, so that equal plans print and hash alike.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/hash.h"
#include "plan/plan.h"
#include "plan/plan_names.h"

namespace rwd::plan {
namespace {

using detail::kDefaultTile;
using detail::kModuleNames;
using detail::kOpNames;
using kernels::HeadFlags;
using kernels::kNumOps;
using kernels::Prec;

// Shortest decimal text that reads back (through the same double->float path) as `v`.
std::string format_float(float v) {
  char buf[32];
  for (int p = 1; p <= 9; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, static_cast<double>(v));
    if (static_cast<float>(std::strtod(buf, nullptr)) == v) break;
  }
  return buf;
}

// "*", "5", "2-5" or "{1,3-5,8}" for a sorted, duplicate-free selection out of n.
std::string format_selection(const std::vector<int>& ids, int n) {
  if (static_cast<int>(ids.size()) == n && n > 0) return "*";
  std::vector<std::string> runs;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    runs.push_back(j == i ? std::to_string(ids[i])
                          : std::to_string(ids[i]) + "-" + std::to_string(ids[j]));
    i = j + 1;
  }
  if (runs.size() == 1) return runs[0];
  std::string out = "{";
  for (size_t i = 0; i < runs.size(); ++i) out += (i ? "," : "") + runs[i];
  return out + "}";
}

// Per-head settings as (slot, value) pairs; slot names the op, value its canonical mode.
// Precision slots come first, then regimes; the two never touch each other when parsed.
std::vector<std::pair<std::string, std::string>> head_settings(const HeadFlags& f,
                                                               bool skip_prec) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int op = 0; op < kNumOps && !skip_prec; ++op) {
    if (f.prec[op] == Prec::kFp32) out.emplace_back(kOpNames[op], "fp32");
    if (f.prec[op] == Prec::kFault && op == static_cast<int>(kernels::Op::kBwd))
      throw Error(ExitCode::kInternal, "plan: bwd has no fault mode (qk..delta only)");
    if (f.prec[op] == Prec::kFault)
      out.emplace_back(kOpNames[op], "fault(strength=" + format_float(f.fault[op]) + ")");
  }
  if (f.s_bf16) out.emplace_back("qk", "sbf16");
  if (f.s_sr) out.emplace_back("qk", "sr");
  if (f.pv_sr) out.emplace_back("pv", "sr");
  if (f.stable)
    out.emplace_back("softmax", "stable(beta=" + format_float(f.beta) +
                                    ",eps=" + format_float(f.eps) + ")");
  if (f.delta_dpp) out.emplace_back("delta", "dpp");
  if (f.acc_bf16) out.emplace_back("acc", "bf16");
  if (f.acc_sr) out.emplace_back("acc", "sr");
  return out;
}

bool layer_full_fp32(const LayerPlan& l) {
  for (bool b : l.module_fp32) if (!b) return false;
  for (const auto& h : l.heads)
    for (Prec p : h.prec) if (p != Prec::kFp32) return false;
  return true;
}

}  // namespace

std::string Plan::canonical() const {
  std::vector<std::string> parts;
  if (head_fp32) parts.push_back("head=fp32");
  int bq = std::max(block_q, 0), bk = std::max(block_k, 0);
  if (bq == 0 && bk == 0) parts.push_back("tiling=off");
  else if (bq != kDefaultTile || bk != kDefaultTile)
    parts.push_back("tile=" + std::to_string(bq) + "x" + std::to_string(bk));

  auto layer_sel = [&](const std::vector<int>& ids) { return format_selection(ids, n_layer); };
  std::vector<int> full, naive;
  std::vector<std::vector<int>> mods(kNumModules);
  for (int l = 0; l < n_layer; ++l) {
    const LayerPlan& lp = layers[l];
    bool f = layer_full_fp32(lp);
    if (f) full.push_back(l);
    if (lp.naive) naive.push_back(l);
    for (int m = 0; m < kNumModules && !f; ++m) if (lp.module_fp32[m]) mods[m].push_back(l);
  }
  if (!full.empty()) parts.push_back("L" + layer_sel(full) + "=fp32");
  if (!naive.empty()) parts.push_back("L" + layer_sel(naive) + ".attn=naive");
  for (int m = 0; m < kNumModules; ++m)
    if (!mods[m].empty())
      parts.push_back("L" + layer_sel(mods[m]) + "." + kModuleNames[m] + "=fp32");

  // slot -> value -> layer -> heads; std::map keeps the order deterministic. Slots are
  // emitted in data-flow order, values in lexicographic order, layer groups by first layer.
  std::vector<std::string> slot_order = {"qk", "softmax", "pv", "o", "delta", "bwd", "acc"};
  std::map<std::string, std::map<std::string, std::map<int, std::vector<int>>>> cells;
  for (int l = 0; l < n_layer; ++l) {
    bool skip = layer_full_fp32(layers[l]);
    for (int h = 0; h < n_head; ++h)
      for (const auto& [slot, value] : head_settings(layers[l].heads[h], skip))
        cells[slot][value][l].push_back(h);
  }
  for (const auto& slot : slot_order) {
    auto sit = cells.find(slot);
    if (sit == cells.end()) continue;
    for (const auto& [value, by_layer] : sit->second) {
      std::vector<std::pair<std::vector<int>, std::vector<int>>> groups;  // heads -> layers
      for (const auto& [l, hs] : by_layer) {
        bool merged = false;
        for (auto& g : groups) if (g.first == hs) { g.second.push_back(l); merged = true; }
        if (!merged) groups.push_back({hs, {l}});
      }
      for (const auto& [hs, ls] : groups)
        parts.push_back("L" + layer_sel(ls) + ".H" + format_selection(hs, n_head) + "." + slot +
                        "=" + value);
    }
  }
  std::string out;
  for (size_t k = 0; k < parts.size(); ++k) out += (k ? ";" : "") + parts[k];
  return out;
}

uint64_t Plan::hash() const { return fnv1a64(canonical()); }

std::string Plan::hash_hex() const { return hex64(hash()); }

}  // namespace rwd::plan
