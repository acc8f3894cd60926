// Suggestions for a predicate that names an unknown series: the nearest key by edit distance
// and the available keys folded by layer and head.
#include "bisect/series_names.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace rwd::bisect {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

// "did you mean 'loss'? available: grad_norm, loss, lr, L<i>.H<j>.{max_logit,wq_sn}".
std::string describe_keys(const std::string& name, const std::vector<std::string>& keys) {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  std::set<std::string> plain, head_suffix, layer_suffix;
  for (const auto& k : keys) {
    size_t d = edit_distance(name, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
    size_t p = 1;
    bool layer = k.size() > 1 && k[0] == 'L' && std::isdigit(static_cast<unsigned char>(k[1]));
    while (layer && p < k.size() && std::isdigit(static_cast<unsigned char>(k[p]))) ++p;
    if (!layer || p >= k.size() || k[p] != '.') {
      plain.insert(k);
      continue;
    }
    size_t q = p + 2;
    bool head = k.compare(p, 2, ".H") == 0 && q < k.size() &&
                std::isdigit(static_cast<unsigned char>(k[q]));
    if (head) {
      while (q < k.size() && std::isdigit(static_cast<unsigned char>(k[q]))) ++q;
      if (q < k.size() && k[q] == '.') {
        head_suffix.insert(k.substr(q + 1));
        continue;
      }
    }
    layer_suffix.insert(k.substr(p + 1));
  }
  auto join = [](const std::set<std::string>& s) {
    std::string out;
    for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
    return out;
  };
  std::string list = join(plain);
  for (auto& [prefix, s] : {std::pair<std::string, std::set<std::string>*>{"L<i>.", &layer_suffix},
                            {"L<i>.H<j>.", &head_suffix}})
    if (!s->empty()) list += (list.empty() ? "" : ",") + prefix + "{" + join(*s) + "}";
  std::string out = best.empty() ? "" : "did you mean '" + best + "'? ";
  return out + "available: " + (list.empty() ? "(none)" : list);
}

}  // namespace rwd::bisect
