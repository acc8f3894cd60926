// Per-head flags: every setting changes the numbers of exactly the head it is set on (two heads
// with different flags in one call), and each fault biases in its documented direction and
// disappears when the op is promoted to FP32.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/kernels/test_util.h"

namespace rwd::kernels {
namespace {

using test::bitwise_equal;
using test::head_slice;
using test::Problem;
using test::Result;

void set(HeadFlags& f, Op op, Prec p, float strength = 0.0f) {
  f.prec[static_cast<int>(op)] = p;
  f.fault[static_cast<int>(op)] = strength;
}

// Peaky logits (|q|,|k| scaled 3x) and duplicated keys (k_{2i+1} = k_{2i}) so that repeated
// maxima, P̄ == 1 ties and the stabilized branch all occur.
Problem tie_problem() {
  Problem pr = test::make_problem(2, 2, 64, 16, 4242, 3.0f, true, 16, 16);
  const int t = pr.p.seq, d = pr.p.dim;
  for (int bh = 0; bh < pr.p.batch * pr.p.heads; ++bh)
    for (int c = 1; c < t; c += 2)
      for (int j = 0; j < d; ++j) {
        const size_t i = (static_cast<size_t>(bh) * t + c) * d + j;
        pr.k[i] = pr.k[i - d];
      }
  return pr;
}

struct Setting {
  std::string name;
  std::function<void(HeadFlags&)> apply;
  bool forward;  // changes O or LSE (otherwise only the backward)
};

std::vector<Setting> settings() {
  return {
      {"qk=fp32", [](HeadFlags& f) { set(f, Op::kQk, Prec::kFp32); }, true},
      {"softmax=fp32", [](HeadFlags& f) { set(f, Op::kSoftmax, Prec::kFp32); }, true},
      {"pv=fp32", [](HeadFlags& f) { set(f, Op::kPv, Prec::kFp32); }, true},
      {"o=fp32", [](HeadFlags& f) { set(f, Op::kO, Prec::kFp32); }, true},
      {"delta=fp32", [](HeadFlags& f) { set(f, Op::kDelta, Prec::kFp32); }, false},
      {"bwd=fp32", [](HeadFlags& f) { set(f, Op::kBwd, Prec::kFp32); }, false},
      {"delta=dpp", [](HeadFlags& f) { f.delta_dpp = true; }, false},
      {"qk=bf16", [](HeadFlags& f) { f.s_bf16 = true; }, true},
      {"acc=bf16", [](HeadFlags& f) { f.acc_bf16 = true; }, true},
      {"qk=sr", [](HeadFlags& f) { f.s_sr = true; }, true},
      {"pv=sr", [](HeadFlags& f) { f.pv_sr = true; }, true},
      {"acc=sr", [](HeadFlags& f) { f.acc_sr = true; }, true},
      {"softmax=stable", [](HeadFlags& f) { f.stable = true; }, true},
      {"fault qk", [](HeadFlags& f) { set(f, Op::kQk, Prec::kFault, 4); }, true},
      {"fault softmax", [](HeadFlags& f) { set(f, Op::kSoftmax, Prec::kFault, 4); }, true},
      {"fault pv", [](HeadFlags& f) { set(f, Op::kPv, Prec::kFault, 4); }, true},
      {"fault o", [](HeadFlags& f) { set(f, Op::kO, Prec::kFault, 4); }, true},
      {"fault delta", [](HeadFlags& f) { set(f, Op::kDelta, Prec::kFault, 4); }, false},
  };
}

TEST(Flags, EverySettingChangesOnlyItsHead) {
  Problem pr = tie_problem();
  Result base = test::run_emulation(pr);
  EXPECT_GT(base.stats[0].pbar_one, 0) << "inputs must contain P̄ == 1 ties";
  for (const Setting& s : settings()) {
    Problem mod = pr;
    s.apply(mod.flags[1]);
    Result r = test::run_emulation(mod);
    auto same = [&](const std::vector<float>& a, const std::vector<float>& b, int h, bool row) {
      return bitwise_equal(head_slice(a, pr, h, row), head_slice(b, pr, h, row));
    };
    // Head 0 keeps its default flags: identical bits everywhere.
    EXPECT_TRUE(same(r.o, base.o, 0, false) && same(r.lse, base.lse, 0, true) &&
                same(r.dq, base.dq, 0, false) && same(r.dk, base.dk, 0, false) &&
                same(r.dv, base.dv, 0, false) && same(r.delta, base.delta, 0, true))
        << s.name << " leaked into head 0";
    const bool fwd_changed = !same(r.o, base.o, 1, false) || !same(r.lse, base.lse, 1, true);
    const bool bwd_changed = !same(r.dq, base.dq, 1, false) || !same(r.dk, base.dk, 1, false) ||
                             !same(r.dv, base.dv, 1, false);
    if (s.forward) {
      EXPECT_TRUE(fwd_changed) << s.name << " did not change the forward of head 1";
    } else {
      EXPECT_FALSE(fwd_changed) << s.name << " is backward-only";
      EXPECT_TRUE(bwd_changed) << s.name << " did not change the backward of head 1";
    }
  }
}

// Signed bias measures against the FP64 reference, over head 1 only.
double mean(const std::vector<double>& x) {
  double s = 0.0;
  for (double e : x) s += e;
  return x.empty() ? 0.0 : s / x.size();
}

struct Bias {
  double o, o_signed, lse, delta;  // mean(O-ref), mean((O-ref)*sign ref), mean(LSE-ref), delta
};

Bias bias(const Problem& pr, const Result& r, const test::Reference& ref) {
  const int h = 1, t = pr.p.seq, d = pr.p.dim;
  std::vector<double> eo, es, el, ed;
  for (int b = 0; b < pr.p.batch; ++b)
    for (int row = 0; row < t; ++row) {
      const size_t rr = (static_cast<size_t>(b) * pr.p.heads + h) * t + row;
      el.push_back(r.lse[rr] - ref.lse[rr]);
      double dref = 0.0;
      for (int j = 0; j < d; ++j) {
        const size_t i = rr * d + j;
        eo.push_back(r.o[i] - ref.o[i]);
        es.push_back((r.o[i] - ref.o[i]) * (ref.o[i] > 0 ? 1.0 : -1.0));
        dref += pr.d_o[i] * ref.o[i];
      }
      ed.push_back(r.delta[rr] - dref);
    }
  return {mean(eo), mean(es), mean(el), mean(ed)};
}

TEST(Flags, FaultsBiasInTheirDirectionAndVanishWhenPromoted) {
  Problem pr = test::make_problem(2, 2, 64, 16, 99, 2.0f, true, 16, 16);
  test::Reference ref = test::run_reference(pr);
  struct Case {
    Op op;
    double Bias::*measure;
    double sign;  // documented direction of the bias
  };
  const Case cases[] = {{Op::kO, &Bias::o, -1.0},         // O rounded down, minus 4 ulp
                        {Op::kPv, &Bias::o_signed, 1.0},  // |O| scaled up by 1 + c
                        {Op::kQk, &Bias::lse, 1.0},       // logits up -> LSE up
                        {Op::kSoftmax, &Bias::lse, -1.0}, // P̄ < 1 shrink -> l, LSE down
                        {Op::kDelta, &Bias::delta, 1.0}}; // delta up
  for (const Case& c : cases) {
    Problem fault = pr, promoted = pr, promoted_clean = pr;
    set(fault.flags[1], c.op, Prec::kFault, 4.0f);
    set(promoted.flags[1], c.op, Prec::kFp32, 4.0f);  // strength left set: must be ignored
    set(promoted_clean.flags[1], c.op, Prec::kFp32, 0.0f);
    // Shifts of the measure relative to the default plan: input rounding has its own
    // systematic effects (noisy logits raise LSE, Jensen), which both runs share.
    const double b0 = bias(pr, test::run_emulation(pr), ref).*c.measure;
    const double bf = bias(fault, test::run_emulation(fault), ref).*c.measure - b0;
    Result rp = test::run_emulation(promoted);
    const double bp = bias(promoted, rp, ref).*c.measure - b0;
    const int op = static_cast<int>(c.op);
    EXPECT_GT(bf * c.sign, 0.0) << "op " << op << " bias " << bf;
    EXPECT_GT(std::fabs(bf), 5.0 * std::fabs(bp)) << "op " << op << " promoted bias " << bp;
    Result rc = test::run_emulation(promoted_clean);
    EXPECT_TRUE(bitwise_equal(rp.o, rc.o) && bitwise_equal(rp.dq, rc.dq) &&
                bitwise_equal(rp.delta, rc.delta))
        << "op " << op << ": a promoted op must ignore its fault strength";
  }
}

TEST(Flags, OFaultIsDirectedDownEverywhere) {
  Problem pr = test::make_problem(1, 2, 40, 16, 5, 2.0f, true, 16, 16);
  Result base = test::run_emulation(pr);
  set(pr.flags[1], Op::kO, Prec::kFault, 0.0f);  // strength 0: pure rounding toward -inf
  Result down = test::run_emulation(pr);
  set(pr.flags[1], Op::kO, Prec::kFault, 4.0f);
  Result strong = test::run_emulation(pr);
  const auto o0 = head_slice(base.o, pr, 1, false), o1 = head_slice(down.o, pr, 1, false),
             o2 = head_slice(strong.o, pr, 1, false), ref = head_slice(down.o_f32, pr, 1, false);
  for (size_t i = 0; i < o0.size(); ++i) {
    EXPECT_LE(o1[i], ref[i]);
    EXPECT_LE(o2[i], o1[i]);
    EXPECT_LT(o2[i], o0[i]);
  }
}

}  // namespace
}  // namespace rwd::kernels
