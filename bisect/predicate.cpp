// Failure predicate: tokenizer, recursive-descent parser with type checking, printer and the
// monotonicity rule; the evaluator is predicate_eval.cpp. Grammar and semantics: predicate.h.
#include "bisect/predicate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "bisect/predicate_internal.h"
#include "bisect/series_names.h"
#include "common/error.h"
#include "common/utf8.h"

namespace rwd::bisect {

namespace {

using namespace predicate_internal;
using NodePtr = std::shared_ptr<const PredicateNode>;
const std::set<std::string> kNumFuncs = {"max", "min", "mean", "median", "first", "last", "growth"};

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
        fail_at(i, "unexpected character '" + utf8_char_at(s, i) + "'");
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
  static std::shared_ptr<PredicateNode> make(NodeKind kind, size_t pos, bool boolean,
                                             std::string name, std::vector<NodePtr> args) {
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
    // Series-valued: a bare series, rmedian, and - + * / with a series among the operands.
    n->series = kind == NodeKind::kSeries || (kind == NodeKind::kFunc && n->name == "rmedian");
    if (kind == NodeKind::kNeg || kind == NodeKind::kArith)
      for (const NodePtr& a : n->args) n->series = n->series || a->series;
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
    if (call && t.text == "rmedian") return parse_rmedian(t);
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
    if (call)
      fail_at(t.pos, "unknown function '" + t.text + "' (expected max, min, mean, median, first, "
                                                     "last, growth, rmedian, spike, nan)");
    if (is_op("[")) {
      ++k_;
      bool neg = is_op("-");
      if (neg) ++k_;
      const Token& s = peek();
      if (s.type != Token::kNum || s.number != std::floor(s.number) || std::fabs(s.number) > 9e15)
        fail_at(s.pos, "expected an integer step inside '[ ]', found " + describe(s));
      ++k_;
      expect("]", "after the step");
      auto n = make(NodeKind::kIndex, t.pos, false, t.text, {});
      n->step = static_cast<int64_t>(neg ? -s.number : s.number);
      return n;
    }
    return make(NodeKind::kSeries, t.pos, false, t.text, {});
  }

  // rmedian '(' sum ',' N ')' after its name: a series and a positive integer literal.
  NodePtr parse_rmedian(const Token& name) {
    ++k_;
    NodePtr x = parse_or();
    want(x, false, "rmedian()");
    if (!x->series)
      fail_at(x->pos, "rmedian() needs a series (e.g. rmedian(grad_norm, 500)), got a scalar");
    expect(",", "between rmedian's arguments (rmedian(series, N))");
    const Token& len = peek();
    if (len.type != Token::kNum || len.number < 1 || len.number != std::floor(len.number) ||
        len.number > 9e15)
      fail_at(len.pos, "rmedian()'s N must be a positive integer number of steps, found " +
                           describe(len));
    ++k_;
    expect(")", "to close rmedian(");
    auto n = make(NodeKind::kFunc, name.pos, false, "rmedian", {x});
    n->step = static_cast<int64_t>(len.number);
    return n;
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
      if (n.name == "rmedian") s += ", " + std::to_string(n.step);
      return s + ")";
    }
    case NodeKind::kNeg: case NodeKind::kNot: return n.name + child(n.args[0], true);
    default: return child(n.args[0], false) + " " + n.name + " " + child(n.args[1], true);
  }
}

// The monotonicity rule of Predicate::monotone() (predicate.h). A constant: numbers, x[STEP]
// and arithmetic of them. Elementwise-causal: a number whose value at a window step depends on
// that step and the steps before it only (constants, bare series, rmedian, arithmetic of them).
bool constant(const PredicateNode& n) {
  if (n.kind == NodeKind::kNumber || n.kind == NodeKind::kIndex) return true;
  if (n.kind != NodeKind::kNeg && n.kind != NodeKind::kArith) return false;
  return std::all_of(n.args.begin(), n.args.end(), [](const NodePtr& a) { return constant(*a); });
}
bool causal(const PredicateNode& n) {
  if (constant(n) || n.kind == NodeKind::kSeries) return true;
  if (n.kind == NodeKind::kFunc && n.name == "rmedian") return causal(*n.args[0]);
  if (n.kind != NodeKind::kNeg && n.kind != NodeKind::kArith) return false;
  return std::all_of(n.args.begin(), n.args.end(), [](const NodePtr& a) { return causal(*a); });
}
// max(e) can only rise and min(e) only fall as the window grows, e elementwise-causal.
bool rises(const PredicateNode& n) {
  return n.kind == NodeKind::kFunc && n.name == "max" && causal(*n.args[0]);
}
bool falls(const PredicateNode& n) {
  return n.kind == NodeKind::kFunc && n.name == "min" && causal(*n.args[0]);
}
bool monotone_node(const PredicateNode& n) {
  switch (n.kind) {
    case NodeKind::kNanAny: return true;
    case NodeKind::kAnd: case NodeKind::kOr:
      return monotone_node(*n.args[0]) && monotone_node(*n.args[1]);
    case NodeKind::kFunc:
      if (n.name == "nan") return causal(*n.args[0]);
      return n.name == "spike" && causal(*n.args[0]) && constant(*n.args[1]);
    case NodeKind::kCompare: {
      const PredicateNode& a = *n.args[0];
      const PredicateNode& b = *n.args[1];
      if (n.name == "==" || n.name == "!=") return false;
      if (causal(a) && causal(b)) return true;  // any step, each step's values fixed
      if (n.name == ">" || n.name == ">=")
        return (rises(a) && constant(b)) || (constant(a) && falls(b));
      return (falls(a) && constant(b)) || (constant(a) && rises(b));
    }
    default: return false;
  }
}

void collect_series(const PredicateNode& n, std::set<std::string>& out) {
  if (n.kind == NodeKind::kSeries || n.kind == NodeKind::kIndex) out.insert(n.name);
  for (const auto& a : n.args) collect_series(*a, out);
}

}  // namespace

Predicate Predicate::parse(const std::string& text) {
  Predicate p;
  p.root_ = Parser(text).run();
  p.source_ = text;
  return p;
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

bool Predicate::monotone() const { return root_ && monotone_node(*root_); }

std::string Predicate::text() const { return root_ ? print(*root_) : ""; }

std::vector<std::string> Predicate::series_used() const {
  std::set<std::string> s;
  if (root_) collect_series(*root_, s);
  return {s.begin(), s.end()};
}

}  // namespace rwd::bisect
