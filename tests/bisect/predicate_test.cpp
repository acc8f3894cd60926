// Failure-predicate language: evaluation over hand-made windows, the NaN rule, spikes, medians
// (median, rmedian), normalized text, errors with positions, and the monotonicity rule.
#include "bisect/predicate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"

namespace rwd::bisect {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Series window() {
  Series s;
  s.first_step = 100;
  s.values["loss"] = {3.0, 2.9, 2.8, 2.7, 6.5};
  s.values["grad_norm"] = {1.0, 1.1, 0.9, 1.0, 1.05};
  s.values["lr"] = {1e-3, 1e-3, 1e-3, 1e-3, 1e-3};
  s.values["L2.H8.wq_sn"] = {10, 11, 13, 17, 25};
  s.values["L2.H8.max_logit"] = {5, 6, 7, 8, 9};
  return s;
}

bool eval(const std::string& text, const Series& s = window()) {
  return Predicate::parse(text).eval(s);
}

TEST(Predicate, ComparisonsFunctionsAndLogic) {
  EXPECT_TRUE(eval("loss > 6"));  // a series comparison holds if it holds at any step
  EXPECT_FALSE(eval("loss > 7"));
  EXPECT_TRUE(eval("max(loss) > 6 || nan"));
  EXPECT_FALSE(eval("max(loss) > 6 && nan"));
  EXPECT_TRUE(eval("min(loss) == 2.7"));
  EXPECT_TRUE(eval("first(loss) == 3 && last(loss) == 6.5"));
  EXPECT_TRUE(eval("mean(grad_norm) >= 1.01 && mean(grad_norm) <= 1.02"));
  EXPECT_TRUE(eval("growth(L2.H8.wq_sn) >= 2.5"));
  EXPECT_FALSE(eval("growth(L2.H8.wq_sn) > 2.5"));
  EXPECT_TRUE(eval("loss[103] == 2.7 && loss[100] != 2.7"));
  EXPECT_TRUE(eval("-max(loss) < -6"));
  EXPECT_TRUE(eval("2 * (1 + 2) == 6 && 7 - 2 - 1 == 4 && 8 / 4 / 2 == 1"));
  EXPECT_TRUE(eval("max(loss - 2 * grad_norm) > 4"));   // elementwise: 6.5 - 2.1
  EXPECT_TRUE(eval("first(L2.H8.max_logit / L2.H8.wq_sn) == 0.5"));
  EXPECT_TRUE(eval("!(loss > 7)"));
  EXPECT_TRUE(eval("loss > 7 || grad_norm > 1.08 || lr < 1"));
}

TEST(Predicate, DeepNestingIsAUsageErrorNotAStackOverflow) {
  // Found by fuzzing: 1000 '(' overflowed the parser's stack; a long sum made a tree as deep as
  // its length, which evaluation and the destructor recurse over.
  auto message = [](const std::string& text) {
    try {
      Predicate::parse(text);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("parsed");
  };
  const std::string nested = "loss > " + std::string(1000, '(') + "1" + std::string(1000, ')');
  EXPECT_NE(message(nested).find("nested more than 256 levels"), std::string::npos) << message(nested);
  std::string sum = "loss > 1";
  for (int i = 0; i < 5000; ++i) sum += "+1";
  EXPECT_NE(message(sum).find("nested more than 256 levels"), std::string::npos);
  EXPECT_NE(message(std::string(5000, '!') + "nan").find("nested more than 256"), std::string::npos);
  // Depth well inside the bound still parses and evaluates.
  std::string ok = "loss > 1";
  for (int i = 0; i < 100; ++i) ok += "+1";
  EXPECT_EQ(message(ok), "parsed");
}

TEST(Predicate, NonFiniteValuesCountAsFailures) {
  Series s = window();
  s.values["loss"][2] = kNaN;
  EXPECT_TRUE(eval("nan", s));
  EXPECT_TRUE(eval("nan(loss)", s));
  EXPECT_FALSE(eval("nan(grad_norm)", s));
  EXPECT_TRUE(eval("max(loss) > 6", s));
  EXPECT_TRUE(eval("loss > 1e300", s));
  EXPECT_FALSE(eval("min(loss) > 6", s));
  EXPECT_TRUE(eval("mean(loss) > 1e300", s));
  s.values["loss"] = {1.0, -std::numeric_limits<double>::infinity()};
  EXPECT_TRUE(eval("last(loss) > 6", s));  // -inf reads as +inf too
  EXPECT_FALSE(eval("nan", window()));
  EXPECT_TRUE(eval("0 * max(loss) > 1", s));  // inf * 0 is NaN, which reads as +inf
}

TEST(Predicate, BareNanReadsTheReplayNotTheRecording) {
  // recorded_loss is the recording's: a NaN there is the failure under bisection, and a probe
  // that replays the window without it passes `nan` (else the all-FP32 probe fails too).
  Series s = window();
  s.values["recorded_loss"] = {3.0, kNaN, kNaN, kNaN, kNaN};
  EXPECT_FALSE(eval("nan", s));
  EXPECT_TRUE(eval("nan(recorded_loss)", s));
  s.values["grad_norm"][0] = kNaN;
  EXPECT_TRUE(eval("nan", s));
}

TEST(Predicate, SpikeAgainstTheEma) {
  Series s;
  s.first_step = 0;
  s.values["loss"] = {2.0, 2.0, 2.0, 2.0, 2.0};
  EXPECT_FALSE(eval("spike(loss, 1.5)", s));
  s.values["loss"][4] = 3.1;  // EMA stays 2.0 before it: 3.1 > 1.5 * 2
  EXPECT_TRUE(eval("spike(loss, 1.5)", s));
  EXPECT_FALSE(eval("spike(loss, 1.6)", s));
  // A slow climb moves the EMA with it (alpha 0.1): 10% per step never exceeds 1.2x the EMA
  // at the start, but the EMA lags, so a long climb eventually does.
  s.values["loss"] = {1.0, 1.1, 1.21};
  EXPECT_FALSE(eval("spike(loss, 1.2)", s));
  s.values["loss"] = {1.0, 1.1, 1.21, 1.331, 1.4641};
  EXPECT_TRUE(eval("spike(loss, 1.2)", s));
  s.values["loss"] = {1.0, kNaN};
  EXPECT_TRUE(eval("spike(loss, 100)", s));
}

// The recorded history before a window is the context of spike's EMA, x[STEP] and
// growth's baseline; aggregates, comparisons and nan look at the window only.
TEST(Predicate, HistoryIsContextNotWindow) {
  Series s = window();  // steps 100..104
  s.history["loss"] = {9.0, 2.0, 2.0, 2.0};           // steps 96..99
  s.history["L2.H8.wq_sn"] = {1.0, 4.0, 5.0};         // steps 97..99
  EXPECT_FALSE(eval("max(loss) > 7", s));             // 9 is history, not window
  EXPECT_TRUE(eval("min(loss) == 2.7 && first(loss) == 3", s));
  EXPECT_FALSE(eval("loss > 7", s));
  EXPECT_TRUE(eval("loss[96] == 9 && loss[99] == 2 && loss[104] == 6.5", s));
  EXPECT_TRUE(eval("growth(L2.H8.wq_sn) == 5", s));   // 25 / 5 (step 99), not 25 / 10
  EXPECT_TRUE(eval("max(loss - loss) == 0 && max(L2.H8.wq_sn - loss) > 18", s));
  s.history["loss"][2] = kNaN;
  EXPECT_FALSE(eval("nan || nan(loss)", s));          // a NaN before the window is no failure
  try {
    eval("loss[95] > 1", s);
    ADD_FAILURE() << "no error for a step before the history";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("steps 96..104"), std::string::npos) << e.what();
  }
}

TEST(Predicate, SpikeEmaStartsInTheHistory) {
  Series s;
  s.first_step = 10;
  s.values["loss"] = {2.6, 2.7};
  EXPECT_FALSE(eval("spike(loss, 1.2)", s));  // alone: 2.7 is no spike over 2.6
  s.history["loss"] = {2.0, 2.0, 2.0, 2.0};
  EXPECT_TRUE(eval("spike(loss, 1.2)", s));   // 2.6 > 1.2 * 2.0, the EMA of the history
  s.values["loss"] = {2.0, 2.0};
  s.history["loss"] = {2.0, 9.0};             // a spike inside the history is not judged
  EXPECT_FALSE(eval("spike(loss, 2)", s));
}

TEST(Predicate, StepJudgementIsTheOneStepWindow) {
  Series rec;
  rec.first_step = 0;
  rec.values["loss"] = {4.0, 3.5, 2.0, 2.0, 2.0, 3.2, 2.0};
  rec.values["grad_norm"] = {1, 1, 1, 1, 1, 1, 1};
  Predicate max3 = Predicate::parse("max(loss) > 3");
  std::vector<bool> got;
  for (int64_t t = 0; t < 7; ++t) got.push_back(max3.eval_step(rec, t));
  EXPECT_EQ(got, (std::vector<bool>{true, true, false, false, false, true, false}));
  Predicate spike = Predicate::parse("spike(loss, 1.4)");
  EXPECT_FALSE(spike.eval_step(rec, 5));      // 3.2 < 1.4 * 3.42, the EMA of steps 0..4
  rec.values["loss"][0] = rec.values["loss"][1] = 2.0;
  EXPECT_TRUE(spike.eval_step(rec, 5));       // 3.2 > 1.4 * 2.0
  EXPECT_FALSE(spike.eval_step(rec, 4));
  EXPECT_TRUE(Predicate::parse("loss[5] > loss[0] - 1").eval_step(rec, 5));
  EXPECT_THROW(Predicate::parse("loss[6] > 1").eval_step(rec, 5), UsageError);
  EXPECT_TRUE(Predicate::parse("growth(loss) > 1.5").eval_step(rec, 5));  // 3.2 / 2.0
}

TEST(Predicate, TextIsNormalizedAndRoundTrips) {
  const char* cases[][2] = {
      {"loss>6||nan", "loss > 6 || nan"},
      {"(a>1||b>1)&&c<2", "(a > 1 || b > 1) && c < 2"},
      {"a - (b - c) > 1-2-3", "a - (b - c) > 1 - 2 - 3"},
      {"(a*b)+c>=-(d)", "a * b + c >= -d"},
      {"spike( loss ,3 )&&!nan(x)", "spike(loss, 3) && !nan(x)"},
      {"loss[6600]>=1e-3", "loss[6600] >= 0.001"},
      {"grad_norm>2*rmedian( grad_norm ,500 )", "grad_norm > 2 * rmedian(grad_norm, 500)"},
      {"median(loss)>=rmedian(loss-1,2e1)", "median(loss) >= rmedian(loss - 1, 20)"},
      {"rmedian(-(a*b),3.0)<=-median(rmedian(a,1))", "rmedian(-(a * b), 3) <= -median(rmedian(a, 1))"},
  };
  for (const auto& c : cases) {
    Predicate p = Predicate::parse(c[0]);
    EXPECT_EQ(p.text(), c[1]);
    EXPECT_EQ(Predicate::parse(p.text()).text(), p.text());
    EXPECT_EQ(p.source(), c[0]);
  }
  EXPECT_EQ(Predicate::parse("max(b) > a[3] || spike(b, 2) || nan").series_used(),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Predicate::parse("rmedian(a - c, 3) > median(b)").series_used(),  // rmedian reads c
            (std::vector<std::string>{"a", "b", "c"}));
}

struct Bad {
  const char* text;
  int position;
  const char* message;
};

TEST(Predicate, SyntaxAndTypeErrorsNameThePosition) {
  const Bad cases[] = {
      {"loss > ", 8, "expected a value, found end of text"},
      {"loss = 6", 6, "use '==' for equality"},
      {"loss > 6 | nan", 10, "use '||'"},
      {"max(loss)", 1, "is a number, not a condition"},
      {"loss && nan", 1, "'&&' needs a condition, got a number"},
      {"(loss > 6) + 1 > 2", 2, "'+' needs a number, got a condition"},
      {"1 < loss < 3", 10, "cannot be chained"},
      {"maxx(loss) > 1", 1, "unknown function 'maxx'"},
      {"spike(loss) ", 11, "expected ','"},
      {"max(loss > 1) > 0", 5, "max() needs a number"},
      {"loss[1.5] > 1", 6, "expected an integer step"},
      {"(loss > 1", 10, "expected ')'"},
      {"loss > 6 $", 10, "unexpected character '$'"},
      {"!loss", 2, "'!' needs a condition"},
      {"loss > 6 nan", 10, "unexpected 'nan'"},
      {"6abc > 1", 2, "malformed number"},
      {"rmedian(loss) > 1", 13, "expected ','"},
      {"rmedian(loss, 0) > 1", 15, "N must be a positive integer"},
      {"rmedian(loss, 2.5) > 1", 15, "N must be a positive integer"},
      {"rmedian(loss, -3) > 1", 15, "N must be a positive integer"},
      {"rmedian(loss, grad_norm) > 1", 15, "N must be a positive integer"},
      {"rmedian(1, 3) > 1", 9, "rmedian() needs a series"},  // a scalar has no trailing range
      {"rmedian(max(loss), 3) > 1", 9, "rmedian() needs a series"},
      {"rmedian(loss[3] * 2, 3) > 1", 9, "rmedian() needs a series"},
      {"rmedian(loss > 1, 3) > 1", 9, "rmedian() needs a number"},
      {"rmedian(loss, 3, 4) > 1", 16, "expected ')'"},
      {"median(loss, 3) > 1", 12, "expected ')'"},
      {"rmedian(loss, 3)", 1, "is a number, not a condition"},
      {"medain(loss) > 1", 1, "expected max, min, mean, median"},
  };
  for (const auto& c : cases) {
    try {
      Predicate::parse(c.text);
      ADD_FAILURE() << "no error for '" << c.text << "'";
    } catch (const UsageError& e) {
      std::string what = e.what();
      std::string want = "predicate: position " + std::to_string(c.position) + ": ";
      EXPECT_EQ(what.rfind(want, 0), 0u) << c.text << " -> " << what;
      EXPECT_NE(what.find(c.message), std::string::npos) << c.text << " -> " << what;
    }
  }
}

TEST(Predicate, EvaluationErrors) {
  try {
    eval("max(los) > 6");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("position 5: unknown series 'los'"), std::string::npos) << what;
    EXPECT_NE(what.find("did you mean 'loss'?"), std::string::npos) << what;
    EXPECT_NE(what.find("grad_norm,loss,lr,L<i>.H<j>.{max_logit,wq_sn}"), std::string::npos)
        << what;
  }
  EXPECT_THROW(eval("loss[99] > 1"), UsageError);
  EXPECT_THROW(eval("loss[105] > 1"), UsageError);
  EXPECT_THROW(eval("spike(loss, grad_norm)"), UsageError);
  Series s = window();
  s.values["short"] = {1.0, 2.0};
  EXPECT_THROW(eval("max(loss - short) > 1", s), Error);
  s.values["empty"] = {};
  EXPECT_THROW(eval("max(empty) > 1", s), Error);
  Predicate p = Predicate::parse("loss > 6 || L2.H9.wq_sn > 1");
  EXPECT_NO_THROW(p.validate({"loss", "L2.H9.wq_sn"}));
  EXPECT_THROW(p.validate({"loss"}), UsageError);
  // The NaN/Inf check short-circuits: the right side is never evaluated when the left holds.
  EXPECT_TRUE(eval("loss > 6 || missing > 1"));
}


TEST(Predicate, MedianOverTheWindow) {
  EXPECT_TRUE(eval("median(loss) == 2.9"));           // 2.7 2.8 2.9 3.0 6.5
  Series s = window();
  s.values["x"] = {4.0, 1.0, 3.0, 2.0};
  EXPECT_TRUE(eval("median(x) == 2.5", s));           // even count: mean of 2 and 3
  s.values["x"] = {1.0, kNaN, 2.0};
  EXPECT_TRUE(eval("median(x) == 2", s));             // 1, 2, +inf
  s.values["x"] = {1.0, kNaN};
  EXPECT_TRUE(eval("median(x) > 1e300", s));          // (1 + inf) / 2
  s.values["x"] = {1e308, 1e308};
  EXPECT_TRUE(eval("median(x) == 1e308", s));         // no overflow of the two middle values
  s.history["loss"] = {100.0, 100.0, 100.0, 100.0, 100.0, 100.0};
  EXPECT_TRUE(eval("median(loss) == 2.9", s));        // history does not count
  EXPECT_TRUE(eval("median(loss - 2 * grad_norm) < 1", s));
}

// !(a != b) holds when the two series agree at every step of the window (+inf == +inf).
bool same_series(const std::string& expr, const std::vector<double>& want, Series s) {
  s.values["want"] = want;
  return Predicate::parse("!(" + expr + " != want)").eval(s);
}

TEST(Predicate, RmedianIsTheTrailingMedianBeforeEachStep) {
  Series s;
  s.first_step = 10;
  s.history["x"] = {5.0, 1.0, 3.0};                   // steps 7..9
  s.values["x"] = {4.0, 2.0, 100.0, 6.0};             // steps 10..13
  EXPECT_TRUE(same_series("rmedian(x, 3)", {3, 3, 3, 4}, s));
  EXPECT_TRUE(same_series("rmedian(x, 2)", {2, 3.5, 3, 51}, s));
  EXPECT_TRUE(same_series("rmedian(x, 1)", {3, 4, 2, 100}, s));
  EXPECT_TRUE(same_series("rmedian(x - 1, 3) + 1", {3, 3, 3, 4}, s));
  EXPECT_FALSE(same_series("rmedian(x, 3)", {3, 3, 3, 5}, s));
  // +inf until N steps precede the step (history and window together).
  EXPECT_TRUE(same_series("rmedian(x, 5)", {kInf, kInf, 3, 3}, s));
  EXPECT_TRUE(same_series("rmedian(x, 6)", {kInf, kInf, kInf, 3.5}, s));
  EXPECT_TRUE(same_series("rmedian(x, 7)", {kInf, kInf, kInf, kInf}, s));
  s.history.clear();
  EXPECT_TRUE(same_series("rmedian(x, 2)", {kInf, kInf, 3, 51}, s));
  // A non-finite value in the range counts as +inf.
  s.history["x"] = {5.0, kNaN, 3.0};
  EXPECT_TRUE(same_series("rmedian(x, 3)", {5, 4, 3, 4}, s));  // {5 3 inf} {3 inf 4} ...
  EXPECT_TRUE(same_series("rmedian(x, 2)", {kInf, 3.5, 3, 51}, s));
  // rmedian has values at history steps too: growth's baseline is the one at step 9.
  s.history["x"] = {1.0, 5.0, 3.0};
  EXPECT_TRUE(eval("growth(rmedian(x, 2)) == 17", s));  // 51 / median(1, 5)
}

TEST(Predicate, RmedianAgreesWithANaiveMedianOnLongWindows) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 10.0);
  Series s;
  s.first_step = 1000;
  for (int i = 0; i < 60; ++i) s.history["x"].push_back(i % 17 == 3 ? kNaN : u(rng));
  for (int i = 0; i < 200; ++i) s.values["x"].push_back(i % 23 == 5 ? kInf : std::round(u(rng)));
  std::vector<double> all = s.history["x"];
  all.insert(all.end(), s.values["x"].begin(), s.values["x"].end());
  for (double& v : all) v = std::isfinite(v) ? v : kInf;
  for (size_t n : {1, 2, 3, 8, 33, 60, 61, 259, 260, 300}) {
    std::vector<double> want;
    for (size_t t = 60; t < all.size(); ++t) {
      if (t < n) {
        want.push_back(kInf);
        continue;
      }
      std::vector<double> r(all.begin() + static_cast<long>(t - n), all.begin() + static_cast<long>(t));
      std::sort(r.begin(), r.end());
      want.push_back(n % 2 ? r[n / 2] : (r[n / 2 - 1] + r[n / 2]) / 2);
    }
    EXPECT_TRUE(same_series("rmedian(x, " + std::to_string(n) + ")", want, s)) << n;
  }
}

TEST(Predicate, GradNormLeavesItsRange) {
  Series s;
  s.first_step = 0;
  s.values["grad_norm"] = {1.0, 1.2, 0.9, 1.1, 5.0, 12.0};
  const Predicate p = Predicate::parse("grad_norm > 10 * rmedian(grad_norm, 3)");
  EXPECT_TRUE(p.eval(s));                 // 12 > 10 * median(0.9, 1.1, 5)
  s.values["grad_norm"][5] = 10.9;
  EXPECT_FALSE(p.eval(s));
  s.values["grad_norm"] = {1.0, 100.0, 1000.0, 1.0};  // no judgement before 3 steps precede
  EXPECT_FALSE(p.eval(s));
  s.values["grad_norm"] = {1.0, 100.0, 1000.0, 1.0, 11000.0};  // median(100, 1000, 1) = 100
  EXPECT_TRUE(p.eval(s));
  s.values["grad_norm"] = {1.0, 1.0, 1.0, kNaN};       // NaN reads as +inf: out of range
  EXPECT_TRUE(p.eval(s));
  // With history: the range is that of the steps before the window.
  Series h;
  h.first_step = 3;
  h.history["grad_norm"] = {1.0, 1.2, 1.1};
  h.values["grad_norm"] = {11.5};
  EXPECT_TRUE(p.eval(h));
  h.values["grad_norm"] = {10.5};
  EXPECT_FALSE(p.eval(h));
}

TEST(Predicate, StepJudgementWithRmedianIsTheOneStepWindow) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  Series rec;
  rec.first_step = 100;
  for (int i = 0; i < 400; ++i) {
    rec.values["grad_norm"].push_back(i % 97 == 50 ? 40.0 : (i == 123 ? kNaN : u(rng)));
    rec.values["loss"].push_back(3.0 - i * 0.001 + (i % 61 == 7 ? 2.0 : 0.0));
  }
  const char* texts[] = {
      "grad_norm > 10 * rmedian(grad_norm, 20)",
      "grad_norm > 5 * rmedian(grad_norm, 3) || loss > rmedian(loss, 50) + 1",
      "spike(loss, 1.5) || grad_norm > 3 * rmedian(grad_norm, 5)",
      "growth(rmedian(loss, 2)) > 1.2",
      "rmedian(rmedian(grad_norm, 3), 4) > 1.8 || loss[110] < 2.8",
      "loss - rmedian(loss, 7) > 0.5 * rmedian(grad_norm, 2)",
  };
  for (const char* text : texts) {
    const Predicate p = Predicate::parse(text);
    int held = 0;
    for (int64_t t = 110; t < 500; ++t) {
      Series one;
      one.first_step = t;
      for (const auto& [key, v] : rec.values) {
        const size_t i = static_cast<size_t>(t - rec.first_step);
        one.values[key] = {v[i]};
        one.history[key].assign(v.begin(), v.begin() + static_cast<long>(i));
      }
      const bool want = p.eval(one);
      ASSERT_EQ(p.eval_step(rec, t), want) << text << " at step " << t;
      held += want;
    }
    EXPECT_GT(held, 0) << text;  // each predicate fires somewhere and not everywhere
    EXPECT_LT(held, 390) << text;
  }
}

TEST(Predicate, MonotoneIsDecidedOnTheSyntax) {
  const char* yes[] = {
      "nan", "nan(loss)", "max(loss) > 6", "loss > 6", "nan || max(loss) > 1.5 * loss[40]",
      "grad_norm > 10 * rmedian(grad_norm, 500)", "spike(grad_norm, 10)", "6 < max(loss)",
      "max(loss) >= 6 && min(grad_norm) <= 0.1", "2 >= min(loss - grad_norm)", "loss <= lr",
      "-loss < -6", "max(rmedian(loss, 3)) > 2", "spike(loss / grad_norm, 1 + 1)",
      "loss[40] > 3", "nan(loss - grad_norm) || loss > 2 * loss[41]",
  };
  const char* no[] = {
      "!nan", "last(loss) > 3", "mean(loss) > 3", "max(loss) < 3", "max(loss) > 1.5 * first(loss)",
      "growth(loss) > 2", "min(loss) > 2", "median(loss) > 3", "loss == 3", "loss != 3",
      "loss > max(grad_norm)", "max(loss - mean(loss)) > 1", "spike(loss, max(grad_norm))",
      "spike(loss - first(loss), 2)", "nan(last(loss))", "!(loss > 6)", "nan && !nan",
      "first(loss) > 3", "3 > max(loss)", "max(loss) > rmedian(loss, 3)",
  };
  for (const char* t : yes) EXPECT_TRUE(Predicate::parse(t).monotone()) << t;
  for (const char* t : no) EXPECT_FALSE(Predicate::parse(t).monotone()) << t;
}

// A random predicate of the grammar: series "loss" and "grad_norm" over steps 5..(5+window).
class RandomPredicate {
 public:
  explicit RandomPredicate(std::mt19937& rng) : rng_(rng) {}
  std::string condition(int depth) {
    switch (pick(depth > 0 ? 7 : 3)) {
      case 0: return "nan";
      case 1: return "nan(" + number(depth - 1) + ")";
      case 2: return number(depth - 1) + " " + cmp() + " " + number(depth - 1);
      case 3: return "spike(" + series(depth - 1) + ", " + number(depth - 1) + ")";
      case 4: return "(" + condition(depth - 1) + " && " + condition(depth - 1) + ")";
      case 5: return "(" + condition(depth - 1) + " || " + condition(depth - 1) + ")";
      default: return "!(" + condition(depth - 1) + ")";
    }
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::string cmp() {
    static const char* ops[] = {">", "<", ">=", "<=", "==", "!="};
    return ops[pick(6)];
  }
  std::string series(int depth) {
    switch (depth > 0 ? pick(5) : pick(2)) {
      case 0: return "loss";
      case 1: return "grad_norm";
      case 2: return "rmedian(" + series(depth - 1) + ", " + std::to_string(1 + pick(4)) + ")";
      case 3: return "(" + series(depth - 1) + " " + "+-*/"[pick(4)] + " " + number(depth - 1) + ")";
      default: return "-" + series(depth - 1);
    }
  }
  std::string number(int depth) {
    static const char* funcs[] = {"max", "min", "mean", "median", "first", "last", "growth"};
    switch (depth > 0 ? pick(7) : pick(3)) {
      case 0: return std::to_string(pick(9));
      case 1:
        return std::string(pick(2) ? "loss" : "grad_norm") + "[" + std::to_string(2 + pick(8)) + "]";
      case 2: case 3: return series(depth);
      case 4: return std::string(funcs[pick(7)]) + "(" + number(depth - 1) + ")";
      case 5: return "(" + number(depth - 1) + " " + "+-*/"[pick(4)] + " " + number(depth - 1) + ")";
      default: return "-" + number(depth - 1);
    }
  }
  std::mt19937& rng_;
};

// Monotone predicates keep their truth as the window grows: true on [5, 5 + k] implies true on
// every longer prefix (same history), for random predicates and random series.
TEST(Predicate, MonotonePredicatesStayTrueOnLongerPrefixes) {
  std::mt19937 rng(2024);
  const double values[] = {0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, -1.0, kNaN, kInf, -kInf};
  auto draw = [&] { return values[std::uniform_int_distribution<int>(0, 10)(rng)]; };
  // 1 true, 0 false, -1 an error: no verdict (x[STEP] past the prefix's end, in a branch that
  // a shorter prefix may have skipped).
  auto verdict = [](const Predicate& p, const Series& s) {
    try {
      return p.eval(s) ? 1 : 0;
    } catch (const Error&) {
      return -1;
    }
  };
  std::vector<std::string> texts = {"nan", "max(loss) > 3", "loss > 6",
                                    "nan || max(loss) > 1.5 * loss[6]",
                                    "grad_norm > 2 * rmedian(grad_norm, 3)", "spike(grad_norm, 2)"};
  RandomPredicate gen(rng);
  int monotone = 0, flips = 0;
  while (texts.size() < 3000) texts.push_back(gen.condition(4));
  for (const std::string& text : texts) {
    const Predicate p = Predicate::parse(text);
    if (!p.monotone()) continue;
    ++monotone;
    for (int trial = 0; trial < 20; ++trial) {
      Series full;
      full.first_step = 5;
      const int hist = std::uniform_int_distribution<int>(0, 5)(rng);
      for (const char* key : {"loss", "grad_norm"}) {
        for (int i = 0; i < hist; ++i) full.history[key].push_back(draw());
        for (int i = 0; i < 10; ++i) full.values[key].push_back(draw());
      }
      bool was = false;
      for (size_t k = 1; k <= 10; ++k) {
        Series prefix = full;
        for (auto& [key, v] : prefix.values) v.resize(k);
        const int now = verdict(p, prefix);
        ASSERT_TRUE(now != 0 || !was) << text << ": true on fewer steps, false on " << k;
        flips += now == 1 && !was;
        was = was || now == 1;
      }
    }
  }
  EXPECT_GT(monotone, 300);  // the generator reaches the monotone forms
  EXPECT_GT(flips, 1000);    // and their verdicts do change along the prefixes
  // The rule is not vacuous: predicates it rejects do lose their truth on longer prefixes.
  Series s;
  s.first_step = 0;
  s.values["loss"] = {1.0, 5.0};
  Series one = s;
  one.values["loss"].resize(1);
  for (const char* t :
       {"max(loss) < 3", "last(loss) < 3", "!(loss > 3)", "min(loss) > 0.5 * max(loss)"}) {
    EXPECT_TRUE(Predicate::parse(t).eval(one)) << t;
    EXPECT_FALSE(Predicate::parse(t).eval(s)) << t;
  }
}

}  // namespace
}  // namespace rwd::bisect
