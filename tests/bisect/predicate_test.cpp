// Failure-predicate language: evaluation over hand-made windows, the NaN rule, spikes,
// normalized text, and errors with positions.
#include "bisect/predicate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"

namespace rwd::bisect {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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

// Issue 25: the recorded history before a window is the context of spike's EMA, x[STEP] and
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
  };
  for (const auto& c : cases) {
    Predicate p = Predicate::parse(c[0]);
    EXPECT_EQ(p.text(), c[1]);
    EXPECT_EQ(Predicate::parse(p.text()).text(), p.text());
    EXPECT_EQ(p.source(), c[0]);
  }
  EXPECT_EQ(Predicate::parse("max(b) > a[3] || spike(b, 2) || nan").series_used(),
            (std::vector<std::string>{"a", "b"}));
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

}  // namespace
}  // namespace rwd::bisect
