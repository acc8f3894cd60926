// Failure predicate: tokenizer, recursive-descent parser with type checking, printer and
// evaluator over a window's series. Grammar and semantics are documented in predicate.h.
#include "bisect/predicate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "bisect/series_names.h"
#include "common/error.h"

namespace rwd::bisect {

enum class NodeKind { kNumber, kSeries, kIndex, kFunc, kNanAny, kNeg, kNot, kArith, kCompare,
                      kAnd, kOr };

struct PredicateNode {
  NodeKind kind = NodeKind::kNumber;
  size_t pos = 0;          // 0-based offset of the node's first character, printed 1-based
  bool boolean = false;    // result type: boolean or number (scalar or series)
  double number = 0;       // kNumber
  int64_t step = 0;        // kIndex
  std::string name;        // series name, function name or operator
  std::vector<std::shared_ptr<const PredicateNode>> args;
  int depth = 1;           // levels of the tree below and including this node
};

namespace {

using NodePtr = std::shared_ptr<const PredicateNode>;
constexpr double kInf = std::numeric_limits<double>::infinity();
const std::set<std::string> kNumFuncs = {"max", "min", "mean", "first", "last", "growth"};

[[noreturn]] void fail_at(size_t pos, const std::string& msg) {
  throw UsageError("predicate: position " + std::to_string(pos + 1) + ": " + msg);
}

// Non-finite reads as +inf (predicate.h): a NaN loss is a failure, never silently "small".
double clean(double x) { return std::isfinite(x) ? x : kInf; }

std::string format_number(double v) {
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

struct Token {
  enum Type { kNum, kIdent, kOp, kEnd } type = kEnd;
  std::string text;
  double number = 0;
  size_t pos = 0;
};

std::vector<Token> tokenize(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  auto ident_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  while (true) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    Token t;
    t.pos = i;
    if (i >= s.size()) {
      out.push_back(t);
      return out;
    }
    char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      char* end = nullptr;
      t.number = std::strtod(s.c_str() + i, &end);
      size_t n = static_cast<size_t>(end - (s.c_str() + i));
      if (n == 0 || !std::isfinite(t.number)) fail_at(i, "malformed number");
      i += n;
      if (i < s.size() && ident_char(s[i])) fail_at(i, "malformed number");
      t.type = Token::kNum;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = i;
      while (i < s.size() && (ident_char(s[i]) || s[i] == '.')) ++i;
      t.type = Token::kIdent;
      t.text = s.substr(b, i - b);
    } else {
      static const char* kOps[] = {"||", "&&", ">=", "<=", "==", "!=", ">", "<", "+", "-",
                                   "*",  "/",  "(",  ")",  "[",  "]",  ",", "!"};
      for (const char* op : kOps)
        if (s.compare(i, std::string(op).size(), op) == 0) {
          t.text = op;
          break;
        }
      if (t.text.empty()) {
        if (c == '=') fail_at(i, "unexpected '=' (use '==' for equality)");
        if (c == '|' || c == '&')
          fail_at(i, std::string("unexpected '") + c + "' (use '" + c + c + "')");
        fail_at(i, std::string("unexpected character '") + c + "'");
      }
      t.type = Token::kOp;
      i += t.text.size();
    }
    out.push_back(t);
  }
}

class Parser {
 public:
  explicit Parser(const std::string& s) : toks_(tokenize(s)) {}

  NodePtr run() {
    NodePtr e = parse_or();
    if (peek().type != Token::kEnd) fail_at(peek().pos, "unexpected " + describe(peek()));
    if (!e->boolean)
      fail_at(e->pos, "the predicate is a number, not a condition (compare it, e.g. '> 6')");
    return e;
  }

 private:
  const Token& peek() const { return toks_[k_]; }
  bool is_op(const char* op) const { return peek().type == Token::kOp && peek().text == op; }
  static std::string describe(const Token& t) {
    if (t.type == Token::kEnd) return "end of text";
    if (t.type == Token::kNum) return "number " + format_number(t.number);
    return "'" + t.text + "'";
  }
  void expect(const char* op, const char* why) {
    if (!is_op(op)) fail_at(peek().pos, std::string("expected '") + op + "' " + why + ", found " +
                                            describe(peek()));
    ++k_;
  }
  // Evaluation, printing and the tree's destructor recurse over it; parsing recurses once per
  // '(', function call or unary operator. Both are bounded so that no text overflows the stack.
  static constexpr int kMaxDepth = 256;
  static NodePtr make(NodeKind kind, size_t pos, bool boolean, std::string name,
                      std::vector<NodePtr> args) {
    int depth = 1;
    for (const NodePtr& a : args) depth = std::max(depth, a->depth + 1);
    if (depth > kMaxDepth)
      fail_at(pos, "the expression is nested more than " + std::to_string(kMaxDepth) + " levels deep");
    auto n = std::make_shared<PredicateNode>();
    n->depth = depth;
    n->kind = kind;
    n->pos = pos;
    n->boolean = boolean;
    n->name = std::move(name);
    n->args = std::move(args);
    return n;
  }
  static void want(const NodePtr& n, bool boolean, const std::string& where) {
    if (n->boolean == boolean) return;
    fail_at(n->pos, where + (boolean ? " needs a condition, got a number"
                                     : " needs a number, got a condition"));
  }

  NodePtr parse_or() {
    NodePtr l = parse_and();
    while (is_op("||")) {
      ++k_;
      NodePtr r = parse_and();
      want(l, true, "'||'");
      want(r, true, "'||'");
      l = make(NodeKind::kOr, l->pos, true, "||", {l, r});
    }
    return l;
  }
  NodePtr parse_and() {
    NodePtr l = parse_cmp();
    while (is_op("&&")) {
      ++k_;
      NodePtr r = parse_cmp();
      want(l, true, "'&&'");
      want(r, true, "'&&'");
      l = make(NodeKind::kAnd, l->pos, true, "&&", {l, r});
    }
    return l;
  }
  NodePtr parse_cmp() {
    NodePtr l = parse_sum();
    for (const char* op : {">=", "<=", "==", "!=", ">", "<"}) {
      if (!is_op(op)) continue;
      ++k_;
      NodePtr r = parse_sum();
      want(l, false, std::string("'") + op + "'");
      want(r, false, std::string("'") + op + "'");
      for (const char* again : {">=", "<=", "==", "!=", ">", "<"})
        if (is_op(again)) fail_at(peek().pos, "comparisons cannot be chained; use '&&'");
      return make(NodeKind::kCompare, l->pos, true, op, {l, r});
    }
    return l;
  }
  NodePtr parse_sum() {
    NodePtr l = parse_product();
    while (is_op("+") || is_op("-")) {
      Token t = peek();
      ++k_;
      NodePtr r = parse_product();
      want(l, false, "'" + t.text + "'");
      want(r, false, "'" + t.text + "'");
      l = make(NodeKind::kArith, l->pos, false, t.text, {l, r});
    }
    return l;
  }
  NodePtr parse_product() {
    NodePtr l = parse_unary();
    while (is_op("*") || is_op("/")) {
      Token t = peek();
      ++k_;
      NodePtr r = parse_unary();
      want(l, false, "'" + t.text + "'");
      want(r, false, "'" + t.text + "'");
      l = make(NodeKind::kArith, l->pos, false, t.text, {l, r});
    }
    return l;
  }
  NodePtr parse_unary() {
    size_t pos = peek().pos;
    // Every recursion of the parser passes here ('(' and calls through parse_or).
    if (++nesting_ > kMaxDepth)
      fail_at(pos, "the expression is nested more than " + std::to_string(kMaxDepth) + " levels deep");
    struct Leave {
      int& n;
      ~Leave() { --n; }
    } leave{nesting_};
    if (is_op("-")) {
      ++k_;
      NodePtr a = parse_unary();
      want(a, false, "unary '-'");
      return make(NodeKind::kNeg, pos, false, "-", {a});
    }
    if (is_op("!")) {
      ++k_;
      NodePtr a = parse_unary();
      want(a, true, "'!'");
      return make(NodeKind::kNot, pos, true, "!", {a});
    }
    return parse_primary();
  }
  NodePtr parse_primary() {
    Token t = peek();
    if (t.type == Token::kNum) {
      ++k_;
      auto n = std::make_shared<PredicateNode>();
      n->kind = NodeKind::kNumber;
      n->pos = t.pos;
      n->number = t.number;
      return n;
    }
    if (is_op("(")) {
      ++k_;
      NodePtr e = parse_or();
      expect(")", "to close '('");
      return e;
    }
    if (t.type != Token::kIdent) fail_at(t.pos, "expected a value, found " + describe(t));
    ++k_;
    bool call = is_op("(");
    if (t.text == "nan" && !call) return make(NodeKind::kNanAny, t.pos, true, "nan", {});
    if (call && (t.text == "nan" || t.text == "spike" || kNumFuncs.count(t.text))) {
      ++k_;
      std::vector<NodePtr> args = {parse_or()};
      want(args[0], false, t.text + "()");
      if (t.text == "spike") {
        expect(",", "between spike's arguments (spike(series, k))");
        args.push_back(parse_or());
        want(args[1], false, "spike()'s k");
      }
      expect(")", ("to close " + t.text + "(").c_str());
      bool boolean = (t.text == "nan" || t.text == "spike");
      return make(NodeKind::kFunc, t.pos, boolean, t.text, std::move(args));
    }
    if (call) fail_at(t.pos, "unknown function '" + t.text +
                                 "' (expected max, min, mean, first, last, growth, spike, nan)");
    if (is_op("[")) {
      ++k_;
      bool neg = is_op("-");
      if (neg) ++k_;
      const Token& s = peek();
      if (s.type != Token::kNum || s.number != std::floor(s.number) || std::fabs(s.number) > 9e15)
        fail_at(s.pos, "expected an integer step inside '[ ]', found " + describe(s));
      ++k_;
      expect("]", "after the step");
      auto n = std::make_shared<PredicateNode>(*make(NodeKind::kIndex, t.pos, false, t.text, {}));
      n->step = static_cast<int64_t>(neg ? -s.number : s.number);
      return n;
    }
    return make(NodeKind::kSeries, t.pos, false, t.text, {});
  }

  std::vector<Token> toks_;
  size_t k_ = 0;
  int nesting_ = 0;  // parse_unary calls in progress
};

// Binding strength for the printer: higher binds tighter.
int precedence(const PredicateNode& n) {
  switch (n.kind) {
    case NodeKind::kOr: return 1;
    case NodeKind::kAnd: return 2;
    case NodeKind::kCompare: return 3;
    case NodeKind::kArith: return (n.name == "+" || n.name == "-") ? 4 : 5;
    case NodeKind::kNeg: case NodeKind::kNot: return 6;
    default: return 7;
  }
}

std::string print(const PredicateNode& n) {
  auto child = [&](const NodePtr& c, bool right) {
    int pc = precedence(*c), pn = precedence(n);
    bool paren = pc < pn || (right && pc == pn) || (n.kind == NodeKind::kCompare && pc == pn);
    return paren ? "(" + print(*c) + ")" : print(*c);
  };
  switch (n.kind) {
    case NodeKind::kNumber: return format_number(n.number);
    case NodeKind::kSeries: return n.name;
    case NodeKind::kIndex: return n.name + "[" + std::to_string(n.step) + "]";
    case NodeKind::kNanAny: return "nan";
    case NodeKind::kFunc: {
      std::string s = n.name + "(" + print(*n.args[0]);
      if (n.args.size() > 1) s += ", " + print(*n.args[1]);
      return s + ")";
    }
    case NodeKind::kNeg: case NodeKind::kNot: return n.name + child(n.args[0], true);
    default: return child(n.args[0], false) + " " + n.name + " " + child(n.args[1], true);
  }
}

void collect_series(const PredicateNode& n, std::set<std::string>& out) {
  if (n.kind == NodeKind::kSeries || n.kind == NodeKind::kIndex) out.insert(n.name);
  for (const auto& a : n.args) collect_series(*a, out);
}

// A scalar, or a series over history + window: v[0, ctx) is history, v[ctx, end) the window.
struct Num {
  bool is_series = false;
  double scalar = 0;
  std::vector<double> v;
  size_t ctx = 0;
  const std::vector<double>& values() {
    if (!is_series) v.assign(1, scalar);
    return v;
  }
  std::vector<double> window() {
    values();
    return {v.begin() + static_cast<long>(ctx), v.end()};
  }
};

class Evaluator {
 public:
  explicit Evaluator(const Series& s) : s_(s) {}

  bool truth(const PredicateNode& n) {
    switch (n.kind) {
      case NodeKind::kOr: return truth(*n.args[0]) || truth(*n.args[1]);
      case NodeKind::kAnd: return truth(*n.args[0]) && truth(*n.args[1]);
      case NodeKind::kNot: return !truth(*n.args[0]);
      case NodeKind::kNanAny:  // the window only: the history is the recording before it
        for (const auto& [key, vals] : s_.values)
          for (double x : vals) if (!std::isfinite(x)) return true;
        return false;
      case NodeKind::kCompare: return compare(n);
      default: break;
    }
    // nan(x) and spike(x, k).
    if (n.name == "nan") {
      for (double x : raw(*n.args[0])) if (!std::isfinite(x)) return true;
      return false;
    }
    Num k = value(*n.args[1]);
    if (k.is_series) fail_at(n.args[1]->pos, "spike(): k must be a scalar, got a series");
    nonempty(value(*n.args[0]), n);
    const std::vector<double>& x = held_.values();
    // The EMA runs over history and window; only steps of the window can spike.
    double ema = x[0];
    for (size_t t = 1; t < x.size(); ++t) {
      if (t >= held_.ctx && x[t] > k.scalar * ema) return true;
      ema = 0.9 * ema + 0.1 * x[t];  // EMA with alpha 0.1
    }
    return false;
  }

 private:
  const std::vector<double>& series(const PredicateNode& n) {
    auto it = s_.values.find(n.name);
    if (it == s_.values.end()) {
      std::vector<std::string> keys;
      for (const auto& kv : s_.values) keys.push_back(kv.first);
      fail_at(n.pos, "unknown series '" + n.name + "' (" + describe_keys(n.name, keys) + ")");
    }
    return it->second;
  }
  const std::vector<double>& history(const std::string& name) {
    static const std::vector<double> kNone;
    auto it = s_.history.find(name);
    return it == s_.history.end() ? kNone : it->second;
  }
  // Values as recorded in the window (for nan()): a series, an indexed value or an expression.
  std::vector<double> raw(const PredicateNode& n) {
    if (n.kind == NodeKind::kSeries) return series(n);
    if (n.kind == NodeKind::kIndex) return {index(n)};
    return value(n).window();
  }
  // x[STEP]: from the window, else from the history before it.
  double index(const PredicateNode& n) {
    const auto& v = series(n);
    const auto& h = history(n.name);
    const int64_t i = n.step - s_.first_step;
    if (i >= 0 && i < static_cast<int64_t>(v.size())) return v[static_cast<size_t>(i)];
    if (i < 0 && -i <= static_cast<int64_t>(h.size())) return h[h.size() - static_cast<size_t>(-i)];
    fail_at(n.pos, "step " + std::to_string(n.step) + " is outside the window and its history (" +
                       n.name + " has steps " +
                       std::to_string(s_.first_step - static_cast<int64_t>(h.size())) + ".." +
                       std::to_string(s_.first_step + static_cast<int64_t>(v.size()) - 1) + ")");
  }
  // The window part of x (kept whole, history included, in held_).
  std::vector<double> nonempty(Num&& x, const PredicateNode& at) {
    held_ = std::move(x);
    std::vector<double> w = held_.window();
    if (w.empty())
      throw Error(ExitCode::kData, "predicate: position " + std::to_string(at.pos + 1) + ": " +
                                       at.name + "() over a series with no values in the window");
    return w;
  }

  Num value(const PredicateNode& n) {
    Num r;
    switch (n.kind) {
      case NodeKind::kNumber: r.scalar = n.number; return r;
      case NodeKind::kIndex: r.scalar = clean(index(n)); return r;
      case NodeKind::kSeries:
        r.is_series = true;
        for (double x : history(n.name)) r.v.push_back(clean(x));
        r.ctx = r.v.size();
        for (double x : series(n)) r.v.push_back(clean(x));
        return r;
      case NodeKind::kNeg: {
        r = value(*n.args[0]);
        r.scalar = clean(-r.scalar);
        for (double& x : r.v) x = clean(-x);
        return r;
      }
      case NodeKind::kArith: return arith(n);
      default: break;
    }
    // max/min/mean/first/last/growth
    const std::vector<double> x = nonempty(value(*n.args[0]), n);
    if (n.name == "max") r.scalar = *std::max_element(x.begin(), x.end());
    if (n.name == "min") r.scalar = *std::min_element(x.begin(), x.end());
    if (n.name == "first") r.scalar = x.front();
    if (n.name == "last") r.scalar = x.back();
    if (n.name == "growth") r.scalar = x.back() / (held_.ctx ? held_.v[held_.ctx - 1] : x.front());
    if (n.name == "mean") {
      double sum = 0;
      for (double y : x) sum += y;
      r.scalar = sum / static_cast<double>(x.size());
    }
    r.scalar = clean(r.scalar);
    return r;
  }

  static double apply(const std::string& op, double a, double b) {
    if (op == "+") return clean(a + b);
    if (op == "-") return clean(a - b);
    if (op == "*") return clean(a * b);
    return clean(a / b);
  }
  static bool holds(const std::string& op, double a, double b) {
    if (op == ">") return a > b;
    if (op == "<") return a < b;
    if (op == ">=") return a >= b;
    if (op == "<=") return a <= b;
    if (op == "==") return a == b;
    return a != b;
  }

  // Broadcasts two numbers to a common length (1 if both scalars); two series keep the
  // history they share (their windows are the same steps).
  std::pair<Num, Num> pair_of(const PredicateNode& n) {
    Num a = value(*n.args[0]), b = value(*n.args[1]);
    if (a.is_series && b.is_series) {
      for (Num* x : {&a, &b}) {
        const size_t drop = x->ctx - std::min(a.ctx, b.ctx);
        x->v.erase(x->v.begin(), x->v.begin() + static_cast<long>(drop));
        x->ctx -= drop;
      }
      if (a.v.size() != b.v.size())
        throw Error(ExitCode::kData, "predicate: position " + std::to_string(n.pos + 1) +
                                         ": series of different lengths (" +
                                         std::to_string(a.v.size() - a.ctx) + " and " +
                                         std::to_string(b.v.size() - b.ctx) + " steps)");
    }
    if ((a.is_series && a.v.size() == a.ctx) || (b.is_series && b.v.size() == b.ctx))
      throw Error(ExitCode::kData, "predicate: position " + std::to_string(n.pos + 1) +
                                       ": a series has no values in the window");
    return {std::move(a), std::move(b)};
  }
  Num arith(const PredicateNode& n) {
    auto [a, b] = pair_of(n);
    Num r;
    r.is_series = a.is_series || b.is_series;
    r.ctx = a.is_series ? a.ctx : b.ctx;
    if (!r.is_series) {
      r.scalar = apply(n.name, a.scalar, b.scalar);
      return r;
    }
    size_t len = a.is_series ? a.v.size() : b.v.size();
    for (size_t i = 0; i < len; ++i)
      r.v.push_back(
          apply(n.name, a.is_series ? a.v[i] : a.scalar, b.is_series ? b.v[i] : b.scalar));
    return r;
  }
  bool compare(const PredicateNode& n) {
    auto [a, b] = pair_of(n);
    size_t len = a.is_series ? a.v.size() : (b.is_series ? b.v.size() : 1);
    const size_t from = a.is_series ? a.ctx : b.ctx;
    for (size_t i = from; i < len; ++i)  // a series comparison holds if it holds at any step
      if (holds(n.name, a.is_series ? a.v[i] : a.scalar, b.is_series ? b.v[i] : b.scalar))
        return true;
    return false;
  }

  const Series& s_;
  Num held_;
};

}  // namespace

Predicate Predicate::parse(const std::string& text) {
  Predicate p;
  p.root_ = Parser(text).run();
  p.source_ = text;
  return p;
}

bool Predicate::eval(const Series& series) const {
  if (!root_) throw Error(ExitCode::kInternal, "predicate: evaluating an empty predicate");
  return Evaluator(series).truth(*root_);
}

bool Predicate::eval_step(const Series& recording, int64_t step) const {
  Series one;
  one.first_step = step;
  const size_t i = static_cast<size_t>(step - recording.first_step);
  const std::vector<std::string> used = series_used();
  for (const auto& [key, v] : recording.values) {
    if (i >= v.size()) continue;
    one.values[key] = {v[i]};
    if (std::binary_search(used.begin(), used.end(), key))  // only what the predicate reads
      one.history[key].assign(v.begin(), v.begin() + static_cast<long>(i));
  }
  return eval(one);
}

void Predicate::validate(const std::vector<std::string>& keys) const {
  if (!root_) return;
  std::set<std::string> have(keys.begin(), keys.end());
  std::vector<const PredicateNode*> stack = {root_.get()};
  while (!stack.empty()) {
    const PredicateNode* n = stack.back();
    stack.pop_back();
    if ((n->kind == NodeKind::kSeries || n->kind == NodeKind::kIndex) && !have.count(n->name))
      fail_at(n->pos, "unknown series '" + n->name + "' (" + describe_keys(n->name, keys) + ")");
    for (auto it = n->args.rbegin(); it != n->args.rend(); ++it) stack.push_back(it->get());
  }
}

std::string Predicate::text() const { return root_ ? print(*root_) : ""; }

std::vector<std::string> Predicate::series_used() const {
  std::set<std::string> s;
  if (root_) collect_series(*root_, s);
  return {s.begin(), s.end()};
}

}  // namespace rwd::bisect
