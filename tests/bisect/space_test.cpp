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

}  // namespace
}  // namespace rwd::bisect
