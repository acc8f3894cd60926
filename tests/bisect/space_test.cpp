// Search-space hierarchy and the candidate -> precision-plan mapping used by the bisect driver.
#include "bisect/space.h"
#include "bisect/synthetic.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace rwd::bisect {
namespace {

using kernels::Op;
using kernels::Prec;

SearchSpace small_space() { return paper_space(3, 2); }

TEST(Space, ElementsPrintAsPlanTargets) {
  EXPECT_EQ(to_string(Element{2, -1, "attn"}), "L2.attn");
  EXPECT_EQ(to_string(Element{2, 3, "attn"}), "L2.H3");
  EXPECT_EQ(to_string(Element{2, 3, "pv"}), "L2.H3.pv");
  EXPECT_EQ(to_string(Element{2, -1, "mlp"}), "L2.mlp");
  EXPECT_EQ(to_string(Element{-1, -1, "head"}), "head");
  EXPECT_EQ(to_string(Candidate{Mode::kPromote, {{1, 0, "o"}, {2, -1, "mlp"}}}),
            "fp32{L1.H0.o,L2.mlp}");
}

TEST(Space, HierarchyAndSweepSize) {
  SearchSpace s = small_space();
  auto top = s.top_level();
  ASSERT_EQ(top.size(), 6u);  // (attn, mlp) x 3 layers
  EXPECT_EQ(to_string(top[1]), "L0.mlp");
  EXPECT_EQ(s.children(top[0]).size(), 2u);
  EXPECT_EQ(s.children(Element{0, 1, "attn"}).size(), 5u);
  EXPECT_TRUE(s.children(Element{0, 1, "pv"}).empty());
  EXPECT_EQ(s.leaves(top[0]).size(), 10u);
  EXPECT_EQ(s.sweep_size(), 3 * (2 * 5 + 1));
  EXPECT_FALSE(s.covers_everything());
  EXPECT_TRUE(SearchSpace{}.covers_everything());
  SearchSpace bad = s;
  bad.modules.push_back("mpl");
  EXPECT_THROW(bad.validate(), UsageError);
}

TEST(Space, PromoteCandidateSetsOnlyItsLeaves) {
  SearchSpace s = small_space();
  plan::Plan rec = plan::parse("L1.H0.o=fault(strength=0.5)", 3, 2);
  plan::Plan p = candidate_plan(Candidate{Mode::kPromote, {{1, -1, "attn"}, {2, -1, "mlp"}}}, s,
                                rec);
  // bwd is outside the space, so L1.attn promotes 5 ops per head, not 6.
  EXPECT_EQ(p.canonical(), "L2.mlp=fp32;L1.H*.qk=fp32;L1.H*.softmax=fp32;L1.H*.pv=fp32;"
                           "L1.H*.o=fp32;L1.H*.delta=fp32");
  EXPECT_EQ(candidate_plan(Candidate{Mode::kPromote, {}}, s, rec), rec);
}

TEST(Space, KeepLowCandidateRestoresRecordedLeaves) {
  SearchSpace s = small_space();
  plan::Plan rec = plan::parse("L1.H0.o=fault(strength=0.5);L1.H0.softmax=stable", 3, 2);
  plan::Plan p = candidate_plan(Candidate{Mode::kKeepLow, {{1, 0, "o"}, {0, -1, "mlp"}}}, s, rec);
  const auto& h = p.layers[1].heads[0];
  EXPECT_EQ(h.prec[static_cast<int>(Op::kO)], Prec::kFault);
  EXPECT_EQ(h.fault[static_cast<int>(Op::kO)], 0.5f);
  EXPECT_EQ(h.prec[static_cast<int>(Op::kPv)], Prec::kFp32);
  EXPECT_EQ(h.prec[static_cast<int>(Op::kBwd)], Prec::kFp32);  // outside the space: FP32
  EXPECT_TRUE(h.stable);                                       // regimes stay as recorded
  EXPECT_FALSE(p.layers[0].module_fp32[static_cast<int>(plan::Module::kMlp)]);
  EXPECT_TRUE(p.layers[0].module_fp32[static_cast<int>(plan::Module::kLn)]);
  EXPECT_TRUE(p.head_fp32);
  // Nothing kept low = the all-FP32 plan.
  EXPECT_EQ(candidate_plan(Candidate{Mode::kKeepLow, {}}, s, plan::Plan::defaults(3, 2)),
            plan::Plan::all_fp32(3, 2));
  EXPECT_THROW(candidate_plan(Candidate{Mode::kKeepLow, {{5, 0, "o"}}}, s, rec), Error);
  EXPECT_THROW(candidate_plan(Candidate{}, s, plan::Plan::defaults(2, 2)), Error);
}

// The paper's regimes (S rounded to BF16, running O and l in BF16) are roundings
// too. The default reference (kFullPrecision) removes them; a leaf carries its op's regime.
TEST(Space, RegimesAreLowPrecisionTheReferenceRemoves) {
  SearchSpace s = small_space();
  s.ops.push_back("acc");
  const plan::Plan rec = plan::parse("L*.H*.qk=sbf16;L*.H*.acc=bf16", 3, 2);
  const plan::Plan all = candidate_plan(Candidate{Mode::kKeepLow, {}}, s, rec);
  for (const auto& l : all.layers)
    for (const auto& h : l.heads) {
      EXPECT_FALSE(h.s_bf16);
      EXPECT_FALSE(h.acc_bf16);
      EXPECT_EQ(h.prec[static_cast<int>(Op::kQk)], Prec::kFp32);
    }
  // Keeping L1.H0's qk low keeps its S rounding (and nothing else's); its acc stays FP32.
  const plan::Plan low = candidate_plan(Candidate{Mode::kKeepLow, {{1, 0, "qk"}}}, s, rec);
  EXPECT_TRUE(low.layers[1].heads[0].s_bf16);
  EXPECT_EQ(low.layers[1].heads[0].prec[static_cast<int>(Op::kQk)], Prec::kLow);
  EXPECT_FALSE(low.layers[1].heads[0].acc_bf16);
  EXPECT_FALSE(low.layers[1].heads[1].s_bf16);
  // Promoting L2.H1's acc removes only its BF16 accumulator.
  const plan::Plan up = candidate_plan(Candidate{Mode::kPromote, {{2, 1, "acc"}}}, s, rec);
  EXPECT_EQ(up.canonical(), plan::apply(rec, "L2.H1.acc=fp32").canonical());
  // A recording without regimes gets exactly the plans of before (probe cache keys hold).
  const plan::Plan plain = plan::parse("L1.H0.pv=fault(strength=3)", 3, 2);
  EXPECT_EQ(candidate_plan(Candidate{Mode::kKeepLow, {{1, 0, "pv"}}}, s, plain).canonical(),
            plan::apply(plan::apply(plain, "all=fp32"), "L1.H0.pv=fault(strength=3)").canonical());
}

// The stochastic roundings are regimes of their ops too: the reference removes qk=sr and
// acc=sr (S and the accumulator in FP32) and keeps pv=sr inert under pv=fp32; a leaf kept low
// carries its sr flag, and a `--reference` of another rounding makes pv a leaf of the space.
TEST(Space, StochasticRoundingIsARegimeOfItsOp) {
  SearchSpace s = small_space();
  s.ops.push_back("acc");
  const plan::Plan rec = plan::parse("L*.H*.qk=sr;L*.H*.pv=sr;L*.H*.acc=sr", 3, 2);
  const plan::Plan all = candidate_plan(Candidate{Mode::kKeepLow, {}}, s, rec);
  for (const auto& l : all.layers)
    for (const auto& h : l.heads) {
      EXPECT_FALSE(h.s_sr || h.acc_sr);
      EXPECT_EQ(h.prec[static_cast<int>(Op::kPv)], Prec::kFp32);
    }
  const plan::Plan low = candidate_plan(Candidate{Mode::kKeepLow, {{1, 0, "qk"}, {1, 0, "acc"}, {2, 1, "pv"}}}, s, rec);
  EXPECT_TRUE(low.layers[1].heads[0].s_sr && low.layers[1].heads[0].acc_sr);
  EXPECT_FALSE(low.layers[1].heads[1].s_sr);
  EXPECT_TRUE(low.layers[2].heads[1].pv_sr);
  EXPECT_EQ(low.layers[2].heads[1].prec[static_cast<int>(Op::kPv)], Prec::kLow);
  // Recorded nearest-even against a reference of pv=sr: pv alone differs.
  const plan::Plan plain = plan::Plan::defaults(3, 2);
  const SearchSpace between = space_between(s, {plain}, {plan::apply(plain, "pv=sr")});
  EXPECT_EQ(between.ops, std::vector<std::string>{"pv"});
}

// --reference: a candidate moves its leaves to the reference's settings, and the space keeps
// only what the recorded plan and the reference disagree on.
TEST(Space, ReferencePlanAndTheSpaceBetween) {
  SearchSpace s = small_space();
  s.ops.push_back("acc");
  const plan::Plan rec = plan::parse("L*.H*.qk=sbf16;L*.H*.acc=bf16", 3, 2);
  const plan::Plan ref = plan::apply(rec, "L*.H*.qk=low;L*.H*.acc=fp32");  // FA2's numerics
  const plan::Plan up = candidate_plan(Candidate{Mode::kPromote, {{1, 0, "attn"}}}, s, rec, ref);
  EXPECT_EQ(up.canonical(), plan::apply(rec, "L1.H0.qk=low;L1.H0.acc=fp32").canonical());
  const plan::Plan low = candidate_plan(Candidate{Mode::kKeepLow, {{2, -1, "attn"}}}, s, rec, ref);
  EXPECT_EQ(low.canonical(), plan::parse("L2.H*.qk=sbf16;L2.H*.acc=bf16", 3, 2).canonical());
  EXPECT_EQ(candidate_plan(Candidate{Mode::kKeepLow, {}}, s, rec, ref), ref);

  SearchSpace between = space_between(s, {rec}, {ref});
  EXPECT_EQ(between.ops, (std::vector<std::string>{"qk", "acc"}));
  EXPECT_TRUE(between.modules.empty());
  EXPECT_FALSE(between.model_head);
  // Against all-FP32 a default recording differs everywhere but in the accumulator.
  s.model_head = true;
  const plan::Plan d = plan::Plan::defaults(3, 2);
  SearchSpace full = space_between(s, {d}, {plan::apply(d, kFullPrecision)});
  EXPECT_EQ(full.ops, (std::vector<std::string>{"qk", "softmax", "pv", "o", "delta"}));
  EXPECT_EQ(full.modules, s.modules);
  EXPECT_TRUE(full.model_head);
  // A fault switched on inside the window (a second recorded plan) keeps its op in the space.
  const plan::Plan faulted = plan::parse("L0.H1.pv=fault(strength=2)", 3, 2);
  SearchSpace sched = space_between(s, {d, faulted}, {d, d});
  EXPECT_EQ(sched.ops, (std::vector<std::string>{"pv"}));
}

}  // namespace
}  // namespace rwd::bisect
