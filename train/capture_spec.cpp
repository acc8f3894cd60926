// The `--capture` selector of `rewind train` (`steps=A:B;L2.H*`): which steps, layers and heads
// keep their attention tensors. Torch-free, so it is fuzzed cheaply (fuzz/fuzz_capture.cpp).
#include "train/capture_spec.h"

#include <stdexcept>

#include "common/error.h"

namespace rwd::train {
namespace {

// Parses `L2`, `L*`, `L{1,3}`, with optional `.H..` of the same forms, comma separated.
std::vector<int> parse_index_set(const std::string& text, char prefix, int n, const std::string& spec) {
  auto bad = [&](const std::string& why) {
    return UsageError("--capture: " + why + " in '" + spec + "'");
  };
  if (text.empty() || text[0] != prefix) throw bad(std::string("expected ") + prefix + "<n>");
  std::string body = text.substr(1);
  std::vector<int> out;
  if (body == "*") {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  if (body.size() >= 2 && body.front() == '{' && body.back() == '}') body = body.substr(1, body.size() - 2);
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    try {
      size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      if (v < 0 || v >= n) throw bad(std::string(1, prefix) + item + " out of range (0.." + std::to_string(n - 1) + ")");
      out.push_back(v);
    } catch (const std::logic_error&) {
      throw bad("bad index '" + item + "'");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

CaptureSpec CaptureSpec::parse(const std::string& spec, int n_layer, int n_head) {
  CaptureSpec c;
  if (spec.empty()) return c;
  size_t semi = spec.find(';');
  std::string steps = spec.substr(0, semi);
  if (steps.rfind("steps=", 0) != 0) throw UsageError("--capture: expected 'steps=A:B;L..' in '" + spec + "'");
  steps = steps.substr(6);
  try {
    size_t colon = steps.find(':');
    c.from = std::stoll(steps.substr(0, colon));
    c.to = colon == std::string::npos ? c.from : std::stoll(steps.substr(colon + 1));
  } catch (const std::logic_error&) {
    throw UsageError("--capture: bad step range in '" + spec + "'");
  }
  if (c.to < c.from) throw UsageError("--capture: empty step range in '" + spec + "'");
  std::string targets = semi == std::string::npos ? "L*" : spec.substr(semi + 1);
  size_t pos = 0;
  while (pos < targets.size()) {
    size_t end = targets.find(';', pos);
    std::string t = targets.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t dot = t.find('.');
    std::vector<int> layers = parse_index_set(t.substr(0, dot), 'L', n_layer, spec);
    std::vector<int> heads = dot == std::string::npos
                                 ? parse_index_set("H*", 'H', n_head, spec)
                                 : parse_index_set(t.substr(dot + 1), 'H', n_head, spec);
    for (int l : layers) {
      c.layers.push_back(l);
      c.heads.push_back(heads);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return c;
}

}  // namespace rwd::train
