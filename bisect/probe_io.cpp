// A probe's text forms: its spec as JSON (what a worker process is handed), the elements and
// candidates of a search space as text, and the record kept in the store's probes table.
#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "bisect/probe.h"
#include "common/hash.h"
#include "common/json_int.h"

namespace rwd::bisect {

namespace {

int parse_index(const std::string& text, size_t& pos, const std::string& whole) {
  size_t start = pos;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == start) throw UsageError("bisect: bad element '" + whole + "': expected a number");
  return std::stoi(text.substr(start, pos - start));
}

nlohmann::json curve(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
  return a;
}

std::vector<double> uncurve(const nlohmann::json& a) {
  std::vector<double> v;
  for (const auto& x : a)
    v.push_back(x.is_null() ? std::numeric_limits<double>::quiet_NaN() : x.get<double>());
  return v;
}

}  // namespace

std::string ProbeSpec::to_json() const {
  nlohmann::ordered_json j;
  j["kind"] = kind;
  j["run"] = run;
  j["from"] = from;
  j["to"] = to;
  if (candidate) j["candidate"] = to_string(*candidate);
  j["spec"] = spec;
  if (reference != kFullPrecision) j["reference"] = reference;
  j["predicate"] = predicate;
  j["job"] = job;
  if (!baseline_whole) j["baseline_whole"] = false;
  if (!band.empty()) {
    j["band"] = curve(band);
    j["band_k"] = band_k;
    j["band_steps"] = band_steps;
    j["band_stop"] = band_stop;
  }
  return j.dump();
}

ProbeSpec ProbeSpec::from_json(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    ProbeSpec p;
    p.kind = j.at("kind").get<std::string>();
    auto step = [&](const char* key) {
      auto v = json_int<int64_t>(j.at(key), 0);
      if (!v) throw UsageError(std::string("bisect: bad probe description: '") + key + "' is not a whole number >= 0");
      return *v;
    };
    p.run = step("run");
    p.from = step("from");
    p.to = step("to");
    if (j.contains("candidate")) p.candidate = parse_candidate(j["candidate"].get<std::string>());
    p.spec = j.value("spec", "");
    p.reference = j.value("reference", std::string(kFullPrecision));
    p.predicate = j.at("predicate").get<std::string>();
    p.job = j.value("job", "");
    p.baseline_whole = j.value("baseline_whole", true);
    if (j.contains("band")) {
      p.band = uncurve(j["band"]);
      p.band_k = j.value("band_k", 0.0);
      p.band_steps = std::max(1, j.value("band_steps", 1));
      p.band_stop = j.value("band_stop", false);
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("bisect: bad probe description: ") + e.what());
  }
}

Element parse_element(const std::string& t) {
  if (t == "head") return {-1, -1, "head"};
  size_t pos = 0;
  if (t.empty() || t[0] != 'L') throw UsageError("bisect: bad element '" + t + "'");
  ++pos;
  Element e;
  e.layer = parse_index(t, pos, t);
  if (pos == t.size()) throw UsageError("bisect: bad element '" + t + "'");
  if (t[pos] != '.') throw UsageError("bisect: bad element '" + t + "'");
  ++pos;
  if (pos < t.size() && t[pos] == 'H') {
    ++pos;
    e.head = parse_index(t, pos, t);
    if (pos == t.size()) {
      e.op = "attn";
      return e;
    }
    if (t[pos] != '.') throw UsageError("bisect: bad element '" + t + "'");
    ++pos;
  }
  e.op = t.substr(pos);
  if (e.op.empty()) throw UsageError("bisect: bad element '" + t + "'");
  return e;
}

Candidate parse_candidate(const std::string& text) {
  Candidate c;
  size_t brace = text.find('{');
  if (brace == std::string::npos || text.back() != '}')
    throw UsageError("bisect: bad candidate '" + text + "'");
  const std::string mode = text.substr(0, brace);
  if (mode == "low") c.mode = Mode::kKeepLow;
  else if (mode == "fp32") c.mode = Mode::kPromote;
  else throw UsageError("bisect: bad candidate mode '" + mode + "'");
  std::string body = text.substr(brace + 1, text.size() - brace - 2);
  size_t start = 0;
  while (start < body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    c.elements.push_back(parse_element(body.substr(start, comma - start)));
    start = comma + 1;
  }
  return c;
}

store::ProbeRecord to_record(const ProbeSpec& p, const ProbeOutcome& o) {
  store::ProbeRecord r;
  r.key = o.key;
  r.job = p.job;
  r.plan = o.plan;
  r.plan_hash = hex64(fnv1a64(o.plan));
  r.window = std::to_string(p.from) + ":" + std::to_string(p.to);
  r.verdict = o.fails ? "fail" : "pass";
  nlohmann::ordered_json m;
  m["format"] = "rewind-probe-v1";
  m["kind"] = p.kind;
  m["label"] = p.label();
  m["from"] = p.from;
  m["to"] = p.to;
  m["predicate"] = p.predicate;
  m["device"] = o.device;
  m["loss"] = curve(o.loss);
  m["grad_norm"] = curve(o.grad_norm);
  if (!o.max_logit.empty()) m["max_logit"] = curve(o.max_logit);
  if (o.indicator_at >= 0) m["indicator_at"] = o.indicator_at;
  if (o.judged_early) m["judged_early"] = true;
  m["step_s"] = o.step_s;
  m["restore_s"] = o.restore_s;
  m["step_median_s"] = o.step_median_s;
  m["steps"] = o.steps;
  if (o.stopped_at >= 0) m["stopped_at"] = o.stopped_at;
  if (o.held_at >= 0) m["held_at"] = o.held_at;
  r.metrics = m.dump();
  r.wall_s = o.wall_s;
  return r;
}

std::optional<ProbeOutcome> from_record(const store::ProbeRecord& r) {
  try {
    auto m = nlohmann::json::parse(r.metrics);
    if (m.value("format", "") != "rewind-probe-v1") return std::nullopt;
    ProbeOutcome o;
    o.key = r.key;
    o.fails = r.verdict == "fail";
    o.loss = uncurve(m.at("loss"));
    o.grad_norm = uncurve(m.at("grad_norm"));
    if (m.contains("max_logit")) o.max_logit = uncurve(m["max_logit"]);
    o.judged_early = m.value("judged_early", false);
    o.wall_s = r.wall_s;
    o.step_s = m.value("step_s", 0.0);  // 0: stored without step timing
    o.restore_s = m.value("restore_s", 0.0);
    // Counts through json_int: a tampered row is unreadable (nullopt below), never a bad cast.
    auto count = [&](const char* key, int64_t fallback) -> std::optional<int64_t> {
      if (!m.contains(key)) return fallback;
      return json_int<int64_t>(m[key], -1);
    };
    const auto steps = count("steps", 0), stopped = count("stopped_at", -1), held = count("held_at", -1),
               called = count("indicator_at", -1);
    if (!steps || !stopped || !held || !called || *steps > std::numeric_limits<int>::max()) return std::nullopt;
    o.indicator_at = *called;
    o.steps = static_cast<int>(*steps);
    o.stopped_at = *stopped;
    o.held_at = *held;
    o.step_median_s = m.value("step_median_s", 0.0);  // 0: stored before the median was kept
    o.cached = true;
    o.device = m.value("device", "cpu");
    o.plan = r.plan;
    return o;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace rwd::bisect
