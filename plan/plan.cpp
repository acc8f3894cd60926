// The precision-plan language of docs/plan.md: the parser (errors name the 1-based character
// position). The canonical printer and the hash are plan_canonical.cpp's.
#include "plan/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "common/error.h"
#include "common/utf8.h"
#include "plan/plan_names.h"

namespace rwd::plan {
namespace {

using kernels::HeadFlags;
using kernels::kNumOps;
using kernels::Prec;

using detail::kDefaultTile;
using detail::kModuleNames;
using detail::kOpNames;
constexpr const char* kAllTargets =
    "qk, softmax, pv, o, delta, bwd, acc, qkv, proj, mlp, ln, attn";
constexpr int kAccOp = kNumOps;      // the `acc` pseudo-op (HeadFlags::acc_bf16)
constexpr float kDefaultBeta = 2.0f, kDefaultEps = 0.0f;

// A parsed right-hand side. `low` (alias `bf16` wherever BF16 is the default) resets the
// target to its default; `fp32` only promotes precisions and leaves regimes (sbf16, stable,
// dpp, acc=bf16, naive, the sr roundings) alone. `sr` makes the op's BF16 rounding stochastic:
// qk=sr and acc=sr replace sbf16 and acc=bf16 (the same rounding points), pv=sr rides on the
// pv precision (inert where pv=fp32 keeps P̄ unrounded, kept with a pv fault).
enum class Kind { kLow, kFp32, kFault, kSbf16, kStable, kDpp, kAccBf16, kSr, kNaive, kFlash, kOn, kOff,
                  kTile };
struct Mode {
  Kind kind = Kind::kLow;
  float strength = 0, beta = kDefaultBeta, eps = kDefaultEps;
  int tile_q = 0, tile_k = 0;
};

void reset_op(HeadFlags& f, int op) {
  if (op == kAccOp) {
    f.acc_bf16 = f.acc_sr = false;
    return;
  }
  f.prec[op] = Prec::kLow;
  f.fault[op] = 0;
  if (op == static_cast<int>(kernels::Op::kQk)) f.s_bf16 = f.s_sr = false;
  if (op == static_cast<int>(kernels::Op::kPv)) f.pv_sr = false;
  if (op == static_cast<int>(kernels::Op::kSoftmax)) {
    f.stable = false;
    f.beta = kDefaultBeta;
    f.eps = kDefaultEps;
  }
  if (op == static_cast<int>(kernels::Op::kDelta)) f.delta_dpp = false;
}

void apply_op(HeadFlags& f, int op, const Mode& m) {
  switch (m.kind) {
    case Kind::kLow: reset_op(f, op); break;
    case Kind::kFp32:
      if (op == kAccOp) {
        f.acc_bf16 = f.acc_sr = false;
      } else {
        f.prec[op] = Prec::kFp32;
        f.fault[op] = 0;
      }
      break;
    case Kind::kFault: f.prec[op] = Prec::kFault; f.fault[op] = m.strength; break;
    case Kind::kSbf16: f.s_bf16 = true; f.s_sr = false; break;
    case Kind::kStable: f.stable = true; f.beta = m.beta; f.eps = m.eps; break;
    case Kind::kDpp: f.delta_dpp = true; break;
    case Kind::kAccBf16: f.acc_bf16 = true; f.acc_sr = false; break;
    case Kind::kSr:
      if (op == kAccOp) {
        f.acc_sr = true;
        f.acc_bf16 = false;
      } else if (op == static_cast<int>(kernels::Op::kQk)) {
        f.s_sr = true;
        f.s_bf16 = false;
      } else {
        f.pv_sr = true;
      }
      break;
    default: throw Error(ExitCode::kInternal, "plan: mode not valid for an op");
  }
}

void apply_head(HeadFlags& f, const Mode& m) {
  if (m.kind == Kind::kLow) {
    f = HeadFlags{};
    return;
  }
  for (int op = 0; op < kNumOps; ++op) apply_op(f, op, m);
}

void apply_layer(LayerPlan& l, const Mode& m) {
  for (auto& h : l.heads) apply_head(h, m);
  for (bool& b : l.module_fp32) b = (m.kind == Kind::kFp32);
  if (m.kind == Kind::kLow) l.naive = false;
}

class Parser {
 public:
  Parser(const std::string& text, Plan& plan) : s_(text), p_(plan) {}

  void run() {
    while (true) {
      skip_ws();
      if (i_ >= s_.size()) return;
      if (s_[i_] != ';') assignment();
      skip_ws();
      if (i_ >= s_.size()) return;
      if (s_[i_] != ';') fail(i_, "expected ';' between assignments, found " + found());
      ++i_;
    }
  }

 private:
  [[noreturn]] void fail(size_t pos, const std::string& msg) const {
    throw UsageError("plan: position " + std::to_string(pos + 1) + ": " + msg);
  }
  std::string found() const {
    if (i_ >= s_.size()) return "end of text";
    return "'" + utf8_char_at(s_, i_) + "'";  // the whole character, never half of one
  }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c, const char* where) {
    if (!eat(c)) fail(i_, std::string("expected '") + c + "' " + where + ", found " + found());
  }
  std::string word() {
    skip_ws();
    size_t b = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_'))
      ++i_;
    return s_.substr(b, i_ - b);
  }
  int integer(const char* what) {
    skip_ws();
    size_t b = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (b == i_) fail(b, std::string("expected ") + what + ", found " + found());
    if (i_ - b > 6) fail(b, std::string(what) + " '" + s_.substr(b, i_ - b) + "' too large");
    return std::stoi(s_.substr(b, i_ - b));
  }
  float number() {
    skip_ws();
    const char* begin = s_.c_str() + i_;
    char* end = nullptr;
    double v = std::strtod(begin, &end);
    if (end == begin || !std::isfinite(v) || std::isnan(static_cast<float>(v)) ||
        !std::isfinite(static_cast<float>(v)))
      fail(i_, "expected a finite number, found " + found());
    i_ += static_cast<size_t>(end - begin);
    return static_cast<float>(v);
  }

  // sel := '*' | item | '{' item (',' item)* '}' ;  item := int | int '-' int
  std::vector<int> selection(int n, const char* kind, char prefix) {
    skip_ws();
    std::set<int> ids;
    if (eat('*')) {
      for (int k = 0; k < n; ++k) ids.insert(k);
      return {ids.begin(), ids.end()};
    }
    bool braced = eat('{');
    do {
      skip_ws();
      size_t at = i_;
      int a = integer(kind), b = a;
      if (eat('-')) b = integer(kind);
      if (b < a) fail(at, std::string("empty ") + kind + " range " + std::to_string(a) + "-" +
                              std::to_string(b));
      for (int v : {a, b})
        if (v >= n)
          fail(at, std::string(kind) + " " + std::to_string(v) + " out of range (model has " +
                       std::to_string(n) + " " + kind + "s" +
                       (n > 0 ? ": " + std::string(1, prefix) + "0.." + prefix +
                                    std::to_string(n - 1)
                              : "") +
                       ")");
      for (int v = a; v <= b; ++v) ids.insert(v);
    } while (braced && eat(','));
    if (braced) expect('}', std::string("to close the " + std::string(kind) + " set").c_str());
    return {ids.begin(), ids.end()};
  }

  // mode := name ['(' key '=' number (',' key '=' number)* ')']  |  int 'x' int
  Mode mode(const std::string& target, const std::vector<std::string>& allowed) {
    skip_ws();
    size_t at = i_;
    Mode m;
    if (target == "tile") {
      m.kind = Kind::kTile;
      m.tile_q = integer("tile rows");
      if (!eat('x')) fail(i_, "expected 'x' in tile=QxK, found " + found());
      m.tile_k = integer("tile columns");
      if (m.tile_q == 0 || m.tile_k == 0) fail(at, "tile sizes must be positive (use tiling=off)");
      return m;
    }
    std::string name = word();
    std::map<std::string, float> args;
    if (eat('(')) {
      if (!eat(')')) {
        do {
          size_t kat = i_;
          std::string key = word();
          if (key.empty()) fail(i_, "expected an argument name, found " + found());
          if (args.count(key)) fail(kat, "argument '" + key + "' given twice");
          expect('=', "after an argument name");
          args[key] = number();
          args_at_[key] = kat;
        } while (eat(','));
        expect(')', "to close the argument list");
      }
    }
    std::string list;
    for (size_t k = 0; k < allowed.size(); ++k) list += (k ? ", " : "") + allowed[k];
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a.substr(0, a.find('(')) == name;
    if (name == "bf16" && target == "qk")
      fail(at, "'qk=bf16' is ambiguous: use qk=sbf16 (S rounded to BF16) or qk=low (default)");
    if (!ok)
      fail(at, (name.empty() ? "missing mode" : "unknown mode '" + name + "'") + " for " + target +
                   " (expected " + list + ")");
    auto take = [&](const char* key, float def) {
      auto it = args.find(key);
      if (it == args.end()) return def;
      float v = it->second;
      args.erase(it);
      return v;
    };
    if (name == "low" || name == "bf16") m.kind = (target == "acc" && name == "bf16")
                                                      ? Kind::kAccBf16 : Kind::kLow;
    else if (name == "fp32") m.kind = Kind::kFp32;
    else if (name == "sbf16") m.kind = Kind::kSbf16;
    else if (name == "sr") m.kind = Kind::kSr;
    else if (name == "dpp") m.kind = Kind::kDpp;
    else if (name == "naive") m.kind = Kind::kNaive;
    else if (name == "flash") m.kind = Kind::kFlash;
    else if (name == "on") m.kind = Kind::kOn;
    else if (name == "off") m.kind = Kind::kOff;
    else if (name == "fault") {
      m.kind = Kind::kFault;
      if (!args.count("strength")) fail(at, "fault needs (strength=X)");
      m.strength = take("strength", 0);
    } else if (name == "stable") {
      m.kind = Kind::kStable;
      m.beta = take("beta", kDefaultBeta);
      m.eps = take("eps", kDefaultEps);
      if (!(m.beta >= 1 && m.beta <= 16)) fail(at, "stable: beta must be in [1, 16]");
      if (!(m.eps >= 0)) fail(at, "stable: eps must be >= 0");
    }
    if (!args.empty())
      fail(args_at_[args.begin()->first],
           "unknown argument '" + args.begin()->first + "' for mode " + name);
    return m;
  }

  void assignment() {
    skip_ws();
    size_t at = i_;
    if (i_ < s_.size() && s_[i_] == 'L') {
      ++i_;
      layer_assignment();
      return;
    }
    std::string name = word();
    if (is_op_target(name)) {  // `pv=sr`: the op of every head (or the module of every layer)
      std::vector<int> layers(p_.n_layer);
      for (int l = 0; l < p_.n_layer; ++l) layers[l] = l;
      target_assignment(layers, {}, false, name, at);
      return;
    }
    static const std::map<std::string, std::vector<std::string>> kGlobal = {
        {"head", {"low", "bf16", "fp32"}}, {"tiling", {"on", "off"}},
        {"tile", {"QxK"}}, {"all", {"low", "bf16", "fp32"}}};
    auto it = kGlobal.find(name);
    if (it == kGlobal.end())
      fail(at, (name.empty() ? "expected a target, found " + found()
                             : "unknown target '" + name + "'") +
                   " (expected L<layers>[.H<heads>][.op], an op of every layer, head, tiling, tile, all)");
    expect('=', "after the target");
    Mode m = mode(name, it->second);
    if (name == "head") p_.head_fp32 = (m.kind == Kind::kFp32);
    if (name == "tiling") p_.block_q = p_.block_k = (m.kind == Kind::kOn ? kDefaultTile : 0);
    if (name == "tile") {
      p_.block_q = m.tile_q;
      p_.block_k = m.tile_k;
    }
    if (name == "all") {
      for (auto& l : p_.layers) apply_layer(l, m);
      p_.head_fp32 = (m.kind == Kind::kFp32);
    }
  }

  void layer_assignment() {
    std::vector<int> layers = selection(p_.n_layer, "layer", 'L');
    std::vector<int> heads;
    bool has_heads = false;
    std::string op;
    size_t op_at = 0;
    if (eat('.')) {
      skip_ws();
      if (i_ < s_.size() && s_[i_] == 'H') {
        ++i_;
        heads = selection(p_.n_head, "head", 'H');
        has_heads = true;
        if (eat('.')) {
          skip_ws();
          op_at = i_;
          op = word();
          if (op.empty()) fail(i_, "expected an op after '.', found " + found());
        }
      } else {
        op_at = i_;
        op = word();
        if (op.empty()) fail(i_, "expected H<heads> or an op after '.', found " + found());
      }
    }
    target_assignment(layers, heads, has_heads, op, op_at);
  }

  // An attention op, `acc`, a layer module or `attn`: what may follow `L<layers>.`.
  static bool is_op_target(const std::string& name) {
    for (int k = 0; k < kNumOps; ++k) if (name == kOpNames[k]) return true;
    for (int k = 0; k < kNumModules; ++k) if (name == kModuleNames[k]) return true;
    return name == "acc" || name == "attn";
  }

  // `=mode` of the parsed target: `op` (empty: whole heads or layers) of `heads` (all of them
  // unless has_heads) in `layers`; op_at is where the op's name starts.
  void target_assignment(const std::vector<int>& layers, std::vector<int> heads, bool has_heads,
                         const std::string& op, size_t op_at) {
    int op_index = -1, module = -1;
    for (int k = 0; k < kNumOps; ++k) if (op == kOpNames[k]) op_index = k;
    if (op == "acc") op_index = kAccOp;
    for (int k = 0; k < kNumModules; ++k) if (op == kModuleNames[k]) module = k;
    if (!op.empty() && op_index < 0 && module < 0 && op != "attn")
      fail(op_at, "unknown op '" + op + "' (expected " + kAllTargets + ")");
    if (has_heads && (module >= 0 || op == "attn"))
      fail(op_at, "'" + op + "' is layer-level: drop the .H selector");
    if (!has_heads) for (int h = 0; h < p_.n_head; ++h) heads.push_back(h);
    expect('=', "after the target");

    std::vector<std::string> allowed = {"low", "bf16", "fp32"};
    if (op == "attn") allowed = {"low", "bf16", "fp32", "naive", "flash"};
    if (op_index >= 0 && op_index != kAccOp && op != "bwd") allowed.push_back("fault(strength=X)");
    if (op == "qk") allowed = {"low", "fp32", "sbf16", "sr", "fault(strength=X)"};
    if (op == "softmax") allowed.push_back("stable(beta=B,eps=E)");
    if (op == "pv") allowed.push_back("sr");
    if (op == "delta") allowed.push_back("dpp");
    if (op == "acc") allowed = {"low", "fp32", "bf16", "sr"};
    Mode m = mode(op.empty() ? (has_heads ? "a head" : "a layer") : op, allowed);

    for (int l : layers) {
      LayerPlan& lp = p_.layers[l];
      if (op.empty() && !has_heads) {
        apply_layer(lp, m);
      } else if (module >= 0) {
        lp.module_fp32[module] = (m.kind == Kind::kFp32);
      } else if (op == "attn") {
        if (m.kind == Kind::kNaive || m.kind == Kind::kFlash) {
          lp.naive = (m.kind == Kind::kNaive);
          continue;
        }
        if (m.kind == Kind::kLow) lp.naive = false;
        for (auto& h : lp.heads) apply_head(h, m);
      } else {
        for (int h : heads) {
          if (op.empty()) apply_head(lp.heads[h], m);
          else apply_op(lp.heads[h], op_index, m);
        }
      }
    }
  }

  const std::string& s_;
  Plan& p_;
  size_t i_ = 0;
  std::map<std::string, size_t> args_at_;
};

}  // namespace

Plan Plan::defaults(int n_layer, int n_head) {
  if (n_layer < 0 || n_head < 0)
    throw UsageError("plan: model size must be non-negative, got " + std::to_string(n_layer) +
                     " layers x " + std::to_string(n_head) + " heads");
  Plan p;
  p.n_layer = n_layer;
  p.n_head = n_head;
  p.layers.resize(n_layer);
  for (auto& l : p.layers) l.heads.resize(n_head);
  return p;
}

Plan Plan::all_fp32(int n_layer, int n_head) {
  return plan::apply(defaults(n_layer, n_head), "all=fp32");
}

bool rounds_stochastically(const Plan& p) {
  for (const auto& l : p.layers)
    for (const auto& h : l.heads)
      if (h.s_sr || h.pv_sr || h.acc_sr) return true;
  return false;
}

Plan parse(const std::string& spec, int n_layer, int n_head) {
  return plan::apply(Plan::defaults(n_layer, n_head), spec);
}

Plan apply(const Plan& base, const std::string& spec) {
  if (static_cast<int>(base.layers.size()) != base.n_layer)
    throw Error(ExitCode::kInternal, "plan: base plan has " + std::to_string(base.layers.size()) +
                                         " layers, expected " + std::to_string(base.n_layer));
  for (const auto& l : base.layers)
    if (static_cast<int>(l.heads.size()) != base.n_head)
      throw Error(ExitCode::kInternal, "plan: base plan layer has wrong head count");
  Plan p = base;
  Parser(spec, p).run();
  return p;
}

}  // namespace rwd::plan
