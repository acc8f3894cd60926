// CUDA flash attention vs the FP64 reference (error bounded by twice a plain BF16 attention's),
// vs the CPU BF16 emulation (to rounding), per-head flag isolation, the stabilized softmax on
// tied maxima, FP32 promotion, error codes, and bitwise-deterministic kernels. The emulation
// agreement and determinism run once per head dim (kCudaHeadDims: HeadDims/AttentionCudaDim.*/D32 ...).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/bf16.h"
#include "tests/cuda/cuda_test_util.h"

namespace rwd::kernels::test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// Rounds FP32 gradients to BF16 as the caller does.
std::vector<float> r16(const std::vector<float>& x) { return bf16_round(x); }

struct Shape {
  int b, h, t, d;
  bool causal;
};

const Shape kShapes[] = {{2, 2, 128, 64, true},  {1, 3, 200, 64, true}, {1, 2, 77, 64, false},
                         {2, 2, 130, 128, true}, {1, 2, 300, 128, false}, {1, 2, 150, 32, true},
                         {1, 2, 150, 80, true},  {1, 2, 130, 96, false},  {1, 2, 200, 256, true}};

// The tests run per head dim: one instance each, named D32, D64, ...
class AttentionCudaDim : public testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(HeadDims, AttentionCudaDim, testing::ValuesIn(kCudaHeadDims),
                         [](const testing::TestParamInfo<int>& i) { return "D" + std::to_string(i.param); });

// Plain BF16 attention (eager PyTorch under autocast): S rounded to BF16, softmax in FP32, P in
// BF16, one tile. That is the CPU emulation with s_bf16 and naive set on every head.
Outputs plain_bf16(Inputs in) {
  in.p.naive = true;
  for (auto& f : in.flags) f.s_bf16 = true;
  return run_cpu(in);
}

TEST(AttentionCuda, ErrorAtMostTwicePlainBf16) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (const Shape& s : kShapes) {
    for (float peak : {1.0f, 3.0f}) {
      Inputs in = make_inputs(s.b, s.h, s.t, s.d, s.causal, peak, seed++);
      const Outputs gpu = run_gpu(in), ref = run_reference(in, true), plain = plain_bf16(in);
      ASSERT_EQ(gpu.fwd_status, 0);
      ASSERT_EQ(gpu.bwd_status, 0);
      SCOPED_TRACE(testing::Message() << "T=" << s.t << " D=" << s.d << " causal=" << s.causal
                                      << " peak=" << peak);
      const int d = s.d;
      EXPECT_LE(max_abs_diff(gpu.o, ref.o, in, d), 2.0 * max_abs_diff(plain.o, ref.o, in, d));
      EXPECT_LE(max_abs_diff(r16(gpu.dq), ref.dq, in, d), 2.0 * max_abs_diff(plain.dq, ref.dq, in, d));
      EXPECT_LE(max_abs_diff(r16(gpu.dk), ref.dk, in, d), 2.0 * max_abs_diff(plain.dk, ref.dk, in, d));
      EXPECT_LE(max_abs_diff(r16(gpu.dv), ref.dv, in, d), 2.0 * max_abs_diff(plain.dv, ref.dv, in, d));
      // LSE is FP32 on both sides of the same BF16 inputs: only FP32 rounding separates them.
      EXPECT_LE(max_abs_diff(gpu.lse, ref.lse, in, 1), 1e-4 * (1.0 + max_abs(ref.lse)));
    }
  }
}

// One configuration of per-head flags for the emulation-agreement sweep.
struct FlagCase {
  const char* name;
  void (*apply)(Inputs&);
};

void set_prec(Inputs& in, Op op, Prec pr, float fault = 0.0f) {
  for (auto& f : in.flags) {
    f.prec[static_cast<int>(op)] = pr;
    f.fault[static_cast<int>(op)] = fault;
  }
}

const FlagCase kFlagCases[] = {
    {"default", [](Inputs&) {}},
    {"stable", [](Inputs& in) { for (auto& f : in.flags) f.stable = true; }},
    {"stable_eps", [](Inputs& in) { for (auto& f : in.flags) { f.stable = true; f.eps = 0.05f; f.s_bf16 = true; } }},
    {"s_bf16", [](Inputs& in) { for (auto& f : in.flags) f.s_bf16 = true; }},
    {"acc_bf16", [](Inputs& in) { for (auto& f : in.flags) f.acc_bf16 = true; }},
    {"qk_fp32", [](Inputs& in) { set_prec(in, Op::kQk, Prec::kFp32); }},
    {"softmax_fp32", [](Inputs& in) { set_prec(in, Op::kSoftmax, Prec::kFp32); }},
    {"pv_fp32", [](Inputs& in) { set_prec(in, Op::kPv, Prec::kFp32); }},
    {"o_fp32", [](Inputs& in) { set_prec(in, Op::kO, Prec::kFp32); }},
    {"delta_fp32", [](Inputs& in) { set_prec(in, Op::kDelta, Prec::kFp32); }},
    {"bwd_fp32", [](Inputs& in) { set_prec(in, Op::kBwd, Prec::kFp32); }},
    {"delta_dpp", [](Inputs& in) { for (auto& f : in.flags) f.delta_dpp = true; }},
    {"qk_fault", [](Inputs& in) { set_prec(in, Op::kQk, Prec::kFault, 2.0f); }},
    {"softmax_fault", [](Inputs& in) { set_prec(in, Op::kSoftmax, Prec::kFault, 2.0f); }},
    {"pv_fault", [](Inputs& in) { set_prec(in, Op::kPv, Prec::kFault, 4.0f); }},
    {"o_fault", [](Inputs& in) { set_prec(in, Op::kO, Prec::kFault, 1.0f); }},
    {"delta_fault", [](Inputs& in) { set_prec(in, Op::kDelta, Prec::kFault, 2.0f); }},
    {"tiling_off", [](Inputs& in) { in.p.block_k = 0; }},
    {"tiling_off_stable", [](Inputs& in) { in.p.block_k = 0; for (auto& f : in.flags) f.stable = true; }},
    {"naive", [](Inputs& in) { in.p.naive = true; }},
};

TEST_P(AttentionCudaDim, AgreesWithCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const int d = GetParam();
  uint64_t seed = 100 + d;
  for (const FlagCase& fc : kFlagCases) {
    for (const Shape& s : {Shape{1, 2, 150, d, true}, Shape{1, 2, 96, d, false}}) {
      Inputs in = make_inputs(s.b, s.h, s.t, s.d, s.causal, 2.0f, seed++);
      fc.apply(in);
      SCOPED_TRACE(testing::Message() << fc.name << " D=" << s.d);
      const Outputs gpu = run_gpu(in), cpu = run_cpu(in);
      ASSERT_EQ(gpu.fwd_status, 0);
      ASSERT_EQ(gpu.bwd_status, 0);
      // stable_eps rounds logits to BF16 and calls maxima within 0.05 repeated: one logit that
      // rounds the other way under the other summation order (the flips allowed above) can
      // flip a row's repeated-max decision, and so the whole row (seen once, at D = 80: 1 LSE,
      // 46 dQ and 39 dK elements of one row). One such row is allowed on top.
      expect_outputs_agree(gpu, cpu, s.d, std::string(fc.name) == "stable_eps" ? 1 : 0);
      for (int h = 0; h < in.p.heads; ++h) {
        EXPECT_EQ(gpu.stats[h].rows, cpu.stats[h].rows);
        // Tie counts depend on exact logits, which differ by summation order: near, not equal.
        EXPECT_NEAR(gpu.stats[h].stable_pos + gpu.stats[h].stable_neg,
                    cpu.stats[h].stable_pos + cpu.stats[h].stable_neg, 2 + cpu.stats[h].rows / 50);
        EXPECT_NEAR(gpu.stats[h].max_logit, cpu.stats[h].max_logit,
                    1e-5 * (1.0 + std::fabs(cpu.stats[h].max_logit)));
      }
    }
  }
}

TEST(AttentionCuda, FlagsChangeOnlyNamedHeads) {
  SKIP_WITHOUT_GPU();
  const FlagCase cases[] = {kFlagCases[2], kFlagCases[3], kFlagCases[4], kFlagCases[7],
                            kFlagCases[10], kFlagCases[11], kFlagCases[14], kFlagCases[15]};
  const Inputs base = make_inputs(2, 4, 192, 64, true, 3.0f, 7);
  const Outputs ref = run_gpu(base);
  for (const FlagCase& fc : cases) {
    SCOPED_TRACE(fc.name);
    Inputs all = base;
    fc.apply(all);
    Inputs in = base;
    in.flags[2] = all.flags[2];  // only head 2 gets the flag
    const Outputs out = run_gpu(in);
    ASSERT_EQ(out.fwd_status, 0);
    ASSERT_EQ(out.bwd_status, 0);
    for (int h = 0; h < 4; ++h) {
      const bool same = same_bits(out.o32, ref.o32, in, 64, h) && same_bits(out.lse, ref.lse, in, 1, h) &&
                        same_bits(out.dq, ref.dq, in, 64, h) && same_bits(out.dk, ref.dk, in, 64, h) &&
                        same_bits(out.dv, ref.dv, in, 64, h);
      EXPECT_EQ(same, h != 2) << "head " << h;
    }
  }
}

TEST(AttentionCuda, StabilizedSoftmaxKeepsPbarBelowOneOnTiedMaxima) {
  SKIP_WITHOUT_GPU();
  // Every key of head 0 is the same vector, so each row's logits tie exactly; the row max is
  // set to +-100 or +-1000 through the query norm. Head 1 is standard, head 2 stable.
  for (float target : {100.0f, -100.0f, 1000.0f, -1000.0f, 0.5f}) {
    SCOPED_TRACE(testing::Message() << "max logit " << target);
    Inputs in = make_inputs(1, 2, 160, 64, true, 1.0f, 11);
    const int t = in.p.seq, d = in.p.dim;
    for (int h = 0; h < 2; ++h) {
      const size_t off = static_cast<size_t>(h) * t * d;
      for (int r = 0; r < t; ++r) {
        for (int c = 0; c < d; ++c) {
          in.k[off + static_cast<size_t>(r) * d + c] = c == 0 ? 1.0f : 0.0f;
          in.q[off + static_cast<size_t>(r) * d + c] = c == 0 ? target / in.p.scale : 0.0f;
        }
      }
    }
    in.flags[1].stable = true;
    const Outputs gpu = run_gpu(in), cpu = run_cpu(in), ref = run_reference(in, true);
    ASSERT_EQ(gpu.fwd_status, 0);
    ASSERT_EQ(gpu.bwd_status, 0);
    EXPECT_GT(gpu.stats[0].pbar_one, 0);   // standard: P̄ == 1 for every tied key
    EXPECT_EQ(gpu.stats[1].pbar_one, 0);   // stable: the shift keeps bf16(P̄) < 1
    EXPECT_GT(gpu.stats[1].stable_pos + gpu.stats[1].stable_neg, 0);
    EXPECT_EQ(gpu.stats[1].stable_guard, cpu.stats[1].stable_guard);
    EXPECT_EQ(gpu.stats[0].repeated_max_rows, cpu.stats[0].repeated_max_rows);
    for (float x : gpu.o) ASSERT_TRUE(std::isfinite(x));
    for (float x : gpu.dq) ASSERT_TRUE(std::isfinite(x));
    // Exact arithmetic is unchanged by the shift: O stays a uniform average of V.
    const Outputs plain = plain_bf16(in);
    EXPECT_LE(max_abs_diff(gpu.o, ref.o, in, d, 1), 2.0 * max_abs_diff(plain.o, ref.o, in, d, 1) + 1e-2);
  }
}

// The monitors are counts, so on logits that CPU and GPU form bit for bit they must agree
// exactly: q and k in {-1, 0, 1} make every S an integer times alpha (exact in either
// summation order), with many exact ties and no P̄ near BF16's rounding point below 1. Heads:
// standard, stabilized (eps 0), stabilized with eps 0.2 (near-ties one logit step apart count
// too, so r_s and the exact-tie monitor differ), stabilized with beta 4. Three passes: q and k
// in {-1, 0, 1} (ties in most rows), in {-3, ..., 3} (a unique max in most rows: the standard
// head's ties come from its P̄ == 1 count, count_ties_after_exp), and the latter with q times
// 2048 (logits 256 apart, row maxima from ~10^4 to ~4 10^4: some above kTieProxyMax, whose ties
// are counted by compare). Printed too, so two kernel builds can be compared line by line.
TEST(AttentionCuda, MonitorsCountExactlyOnIntegerLogits) {
  SKIP_WITHOUT_GPU();
  uint64_t state = 12345;
  int range = 1;
  auto next = [&] {  // an integer in [-range, range]
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int>((state >> 33) % (2 * range + 1)) - range);
  };
  for (const auto& [rg, ml] : {std::pair{1, 1.0f}, std::pair{3, 1.0f}, std::pair{3, 2048.0f}})
  for (const Shape& sh : {Shape{2, 4, 150, 64, true}, Shape{1, 4, 96, 128, false}, Shape{1, 4, 200, 128, true},
                          Shape{1, 4, 150, 32, true}, Shape{1, 4, 150, 80, true}, Shape{1, 4, 96, 96, false},
                          Shape{1, 4, 150, 256, true}}) {
    range = rg;
    SCOPED_TRACE(testing::Message() << "D=" << sh.d << " T=" << sh.t << " range " << rg << " x" << ml);
    Inputs in = make_inputs(sh.b, sh.h, sh.t, sh.d, sh.causal, 1.0f, 77);
    for (float& x : in.q) x = ml * next();
    for (float& x : in.k) x = next();
    in.flags[1].stable = in.flags[2].stable = in.flags[3].stable = true;
    in.flags[2].eps = 0.2f;
    in.flags[3].beta = 4.0f;
    const Outputs gpu = run_gpu(in, false), cpu = run_cpu(in, false);
    ASSERT_EQ(gpu.fwd_status, 0);
    for (int h = 0; h < sh.h; ++h) {
      const HeadStats &g = gpu.stats[h], &c = cpu.stats[h];
      std::printf("monitors r%d x%g D%d T%d h%d: rows %lld repeated %lld pbar_one %lld pos %lld neg %lld "
                  "guard %lld max %.9g\n", rg, ml, sh.d, sh.t, h, static_cast<long long>(g.rows),
                  static_cast<long long>(g.repeated_max_rows), static_cast<long long>(g.pbar_one),
                  static_cast<long long>(g.stable_pos), static_cast<long long>(g.stable_neg),
                  static_cast<long long>(g.stable_guard), g.max_logit);
      EXPECT_EQ(g.rows, c.rows) << "head " << h;
      EXPECT_EQ(g.repeated_max_rows, c.repeated_max_rows) << "head " << h;
      EXPECT_EQ(g.pbar_one, c.pbar_one) << "head " << h;
      EXPECT_EQ(g.stable_pos, c.stable_pos) << "head " << h;
      EXPECT_EQ(g.stable_neg, c.stable_neg) << "head " << h;
      EXPECT_EQ(g.stable_guard, c.stable_guard) << "head " << h;
      EXPECT_EQ(g.max_logit, c.max_logit) << "head " << h;
    }
    if (rg > 1) continue;
    EXPECT_GT(gpu.stats[0].repeated_max_rows, 0);
    EXPECT_GT(gpu.stats[0].pbar_one, 0);
    EXPECT_GT(gpu.stats[2].stable_pos + gpu.stats[2].stable_neg,
              gpu.stats[1].stable_pos + gpu.stats[1].stable_neg);  // eps widens the ties
  }
}

// Without monitors, stabilized heads run a specialization of their own (no monitor
// bookkeeping, as in replays and bisect probes), which speculates that no row repeats its max
// and redoes a warp's tile where one does. It must give the bits of the monitored one: on exact
// ties (the shift fires), near-ties (logits 2^-11 apart: r_s = 1, no shift), random logits, and
// random logits where every fifth query row ties exactly (so some warps redo a tile and others
// do not). On near-ties alone the stabilized head must equal the standard one bit for bit.
TEST(AttentionCuda, StabilizedKernelWithoutMonitorsMatchesMonitoredOne) {
  SKIP_WITHOUT_GPU();
  const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y, size_t from, size_t n) {
    return std::memcmp(x.data() + from, y.data() + from, n * sizeof(float)) == 0;
  };
  for (int d : kCudaHeadDims) {
    for (int kind = 0; kind < 5; ++kind) {
      SCOPED_TRACE(testing::Message() << "D=" << d << " case " << kind);
      Inputs in = make_inputs(1, 2, 200, d, true, 2.0f, 300 + kind + d);
      const int t = in.p.seq;
      for (int h = 0; h < 2 && kind != 3; ++h) {
        const size_t off = static_cast<size_t>(h) * t * d;
        for (int r = 0; r < t; ++r) {
          float* kr = in.k.data() + off + static_cast<size_t>(r) * d;
          float* qr = in.q.data() + off + static_cast<size_t>(r) * d;
          if (h == 1) {  // head 1 sees head 0's inputs: only the flags differ
            for (int c = 0; c < d; ++c) {
              const size_t i0 = static_cast<size_t>(r) * d + c;
              in.v[off + i0] = in.v[i0];
              kr[c] = in.k[i0];
              qr[c] = in.q[i0];
            }
            continue;
          }
          if (kind == 4) {  // keys 1 in column 0, random elsewhere; a tied row ignores the rest
            kr[0] = 1.0f;
            if (r % 5 == 0) {
              for (int c = 0; c < d; ++c) qr[c] = 0.0f;
              qr[0] = (r % 2 ? 2.0f : -2.0f) / in.p.scale;
            }
            continue;
          }
          for (int c = 0; c < d; ++c) kr[c] = qr[c] = 0.0f;
          if (kind == 0) {  // every key equal: each row's max repeats, max logit 3 or -3
            kr[0] = 1.0f;
            qr[0] = (r % 2 ? 3.0f : -3.0f) / in.p.scale;
          } else {  // distinct BF16 keys 1 + r 2^-7, 2 + (r - 128) 2^-6: logits 2^-11 apart
            kr[0] = r < 128 ? 1.0f + r / 128.0f : 2.0f + (r - 128) / 64.0f;
            qr[0] = (kind == 1 ? 1.0f : -1.0f) / 16.0f;
          }
        }
      }
      in.flags[1].stable = true;
      const Outputs plain = run_gpu(in, false, false), monitored = run_gpu(in, false, true);
      ASSERT_EQ(plain.fwd_status, 0);
      ASSERT_EQ(monitored.fwd_status, 0);
      EXPECT_TRUE(same_bits(plain.o, monitored.o, 0, plain.o.size()));
      EXPECT_TRUE(same_bits(plain.lse, monitored.lse, 0, plain.lse.size()));
      if (kind == 0 || kind == 4) {
        EXPECT_GT(monitored.stats[1].stable_pos + monitored.stats[1].stable_neg, 0);
      }
      if (kind == 4) {  // the tied rows differ from the standard head, the others need not
        EXPECT_GT(monitored.stats[1].rows, monitored.stats[1].stable_pos + monitored.stats[1].stable_neg);
      }
      if (kind == 1 || kind == 2) {
        EXPECT_EQ(monitored.stats[1].stable_pos + monitored.stats[1].stable_neg, 0);
        const size_t per_head = plain.o.size() / 2;
        EXPECT_TRUE(std::memcmp(plain.o.data(), plain.o.data() + per_head, per_head * 4) == 0);
        EXPECT_TRUE(std::memcmp(plain.lse.data(), plain.lse.data() + t, t * 4) == 0);
      }
    }
  }
}

TEST(AttentionCuda, Fp32FlagsMoveTowardReference) {
  SKIP_WITHOUT_GPU();
  // The reference sees the unrounded FP32 inputs; qk=fp32 and pv=fp32 keep them (peaky logits,
  // where BF16 operands cost the most). Compared on Ō/l (o_f32), before the output rounding.
  const Inputs in = make_inputs(1, 2, 256, 64, true, 4.0f, 21);
  Inputs promoted = in;
  set_prec(promoted, Op::kQk, Prec::kFp32);
  set_prec(promoted, Op::kPv, Prec::kFp32);
  const Outputs low = run_gpu(in), high = run_gpu(promoted), ref = run_reference(in, false);
  ASSERT_EQ(low.fwd_status, 0);
  ASSERT_EQ(high.fwd_status, 0);
  ASSERT_EQ(high.bwd_status, 0);
  EXPECT_LT(mean_abs_diff(high.o32, ref.o), 0.5 * mean_abs_diff(low.o32, ref.o));
  Inputs bwd = promoted;
  set_prec(bwd, Op::kBwd, Prec::kFp32);
  const Outputs high_bwd = run_gpu(bwd);
  ASSERT_EQ(high_bwd.bwd_status, 0);
  EXPECT_LT(mean_abs_diff(high_bwd.dk, ref.dk), mean_abs_diff(low.dk, ref.dk));
}

// bwd=fp32 heads take the unrounded dO, as their CPU twin does, and differ from it far less
// than they would if the kernel read the BF16 dO (the CPU twin fed the BF16 dO measures that).
// dV = P^T dO has no cancellation: FP32 summation order alone, ~1e-6. dQ and dK go through
// dS = P (dP - delta), which cancels on peaky rows (P near 1): the FP32 rounding of dP and delta
// is amplified by 1/(1-P), ~1e-4 on the H100 with peak 2 (BF16 dO: 1.7e-3).
TEST(AttentionCuda, Fp32BackwardHeadsReadUnroundedDo) {
  SKIP_WITHOUT_GPU();
  // Relative L2 distance over head 1 (the second half of each tensor, B = 1).
  const auto rel_l2 = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0.0, den = 0.0;
    for (size_t i = a.size() / 2; i < a.size(); ++i) {
      num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      den += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(num / den);
  };
  for (int d : {64, 128}) {
    Inputs in = make_inputs(1, 2, 150, d, true, 2.0f, 77 + d);
    in.flags[1].prec[static_cast<int>(Op::kBwd)] = Prec::kFp32;
    Inputs rounded_do = in;
    rounded_do.d_o = bf16_round(in.d_o);
    const Outputs gpu = run_gpu(in), cpu = run_cpu(in), cpu_bf16_do = run_cpu(rounded_do);
    ASSERT_EQ(gpu.bwd_status, 0);
    for (const auto& [g, c, w, what] :
         {std::tuple{&gpu.dq, &cpu.dq, &cpu_bf16_do.dq, "dQ"}, std::tuple{&gpu.dk, &cpu.dk, &cpu_bf16_do.dk, "dK"},
          std::tuple{&gpu.dv, &cpu.dv, &cpu_bf16_do.dv, "dV"}}) {
      const double err = rel_l2(*g, *c), wrong = rel_l2(*w, *c);
      EXPECT_LT(err, what[1] == 'V' ? 1e-5 : 3e-4) << what << " D=" << d;
      EXPECT_LT(err, (what[1] == 'V' ? 0.01 : 0.2) * wrong) << what << " D=" << d << ": " << err << " vs BF16 dO " << wrong;
      std::printf("%s D=%d: rel L2 vs CPU twin %.2e (BF16 dO would give %.2e)\n", what, d, err, wrong);
    }
  }
}

// Forward (O, its FP32 twin, LSE, monitors) and backward run 50 times to the same bits, with an
// FP32 head (split-operand kernels; SIMT at D = 256), a delta=dpp head and a stabilized head
// beside a plain one.
TEST_P(AttentionCudaDim, ForwardAndBackwardAreBitwiseDeterministic) {
  SKIP_WITHOUT_GPU();
  const int d = GetParam();
  Inputs in = make_inputs(2, 4, 320, d, true, 2.0f, 31 + d);
  in.flags[1].prec[static_cast<int>(Op::kPv)] = Prec::kFp32;
  in.flags[2].delta_dpp = true;
  in.flags[3].stable = true;
  const Outputs first = run_gpu(in);
  ASSERT_EQ(first.fwd_status, 0);
  ASSERT_EQ(first.bwd_status, 0);
  ASSERT_GT(max_abs(first.dq), 0.0);
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  for (int run = 1; run < 50; ++run) {
    const Outputs again = run_gpu(in);
    ASSERT_EQ(again.bwd_status, 0);
    ASSERT_TRUE(same(first.o, again.o)) << run;
    ASSERT_TRUE(same(first.o32, again.o32)) << run;
    ASSERT_TRUE(same(first.lse, again.lse)) << run;
    for (int h = 0; h < in.p.heads; ++h) {
      const HeadStats &x = first.stats[h], &y = again.stats[h];
      ASSERT_EQ(std::memcmp(&x.max_logit, &y.max_logit, 4), 0) << run;
      ASSERT_TRUE(x.rows == y.rows && x.repeated_max_rows == y.repeated_max_rows && x.pbar_one == y.pbar_one &&
                  x.stable_pos == y.stable_pos && x.stable_neg == y.stable_neg && x.stable_guard == y.stable_guard)
          << run << " head " << h;
    }
    ASSERT_TRUE(same(first.dq, again.dq)) << run;
    ASSERT_TRUE(same(first.dk, again.dk)) << run;
    ASSERT_TRUE(same(first.dv, again.dv)) << run;
  }
}

// dQ from the stored dS tiles (the D = 128 default) gives the bits of the kernel that recomputes
// S, dP and dS per tile pair, for every kind of head beside it (stabilized, delta=dpp on the
// recompute kernel, an FP32 head, o=fp32, s_bf16), causal or not, with T tails, in one chunk of
// heads or in several (a workspace cap of one head).
TEST(AttentionCuda, DqFromStoredDsEqualsRecomputedDqBitwise) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int b, h, t, d;
    bool causal;
    const char* cap;
  };
  const Case cases[] = {{2, 6, 200, 128, true, nullptr}, {1, 6, 130, 128, false, nullptr},
                        {2, 6, 256, 64, true, nullptr},  {2, 6, 200, 128, true, "1"},
                        {1, 6, 77, 64, false, "1"},      {2, 6, 200, 32, true, nullptr},
                        {1, 6, 130, 80, false, nullptr}, {2, 6, 200, 96, true, nullptr},
                        {2, 6, 200, 256, true, nullptr}, {1, 6, 77, 256, false, "1"}};
  for (const Case& c : cases) {
    if (c.cap != nullptr) setenv("REWIND_ATTN_DS_WORKSPACE", c.cap, 1);
    Inputs in = make_inputs(c.b, c.h, c.t, c.d, c.causal, 2.0f, 57 + c.t + c.d);
    in.flags[1].stable = true;
    in.flags[2].delta_dpp = true;
    in.flags[3].prec[static_cast<int>(Op::kPv)] = Prec::kFp32;
    in.flags[4].prec[static_cast<int>(Op::kO)] = Prec::kFp32;
    in.flags[5].s_bf16 = true;
    const Outputs recompute = run_gpu(in, true, true, false, 0);
    const Outputs stored = run_gpu(in, true, true, false, 1);
    unsetenv("REWIND_ATTN_DS_WORKSPACE");
    ASSERT_EQ(recompute.bwd_status, 0);
    ASSERT_EQ(stored.bwd_status, 0);
    const std::string what = "T=" + std::to_string(c.t) + " D=" + std::to_string(c.d) +
                             (c.causal ? " causal" : "") + (c.cap ? " chunked" : "");
    ASSERT_GT(max_abs(recompute.dq), 0.0) << what;
    EXPECT_EQ(std::memcmp(recompute.dq.data(), stored.dq.data(), stored.dq.size() * 4), 0) << what;
    EXPECT_EQ(std::memcmp(recompute.dk.data(), stored.dk.data(), stored.dk.size() * 4), 0) << what;
    EXPECT_EQ(std::memcmp(recompute.dv.data(), stored.dv.data(), stored.dv.size() * 4), 0) << what;
    EXPECT_EQ(std::memcmp(recompute.delta.data(), stored.delta.data(), stored.delta.size() * 4), 0) << what;
  }
}

// The BF16 kernels on wgmma (the default) give the bits of their mma.sync versions
// (REWIND_ATTN_WGMMA=0): O, its FP32 twin, the LSE and the monitors of the forward, for plain,
// stabilized and s_bf16 / acc_bf16 heads in one launch, with monitors and without; dQ, dK, dV
// and delta of the backward, through the stored-dS path and the recompute path, with a
// delta=dpp head beside them. D = 64 and 128 (the dims with wgmma kernels; the others run
// mma.sync either way), causal or not, with T tails.
TEST(AttentionCuda, WgmmaKernelsEqualMmaKernelsBitwise) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{2, 5, 200, 128, true}, {1, 5, 300, 128, false}, {1, 5, 64, 128, true},
                          {2, 5, 1000, 128, true}, {1, 5, 77, 64, false}, {2, 5, 333, 64, true},
                          // the forward of 80 and 96 on the D = 128 kernel, zero-padded by TMA
                          {2, 5, 200, 80, true}, {1, 5, 77, 80, false}, {2, 5, 333, 96, true}, {1, 5, 64, 96, false}};
  for (const Shape& sh : shapes) {
    for (float peak : {1.0f, 6.0f}) {
      for (int mode = 0; mode < 3; ++mode) {  // monitors off / on; dQ recomputed
        const bool stats = mode == 1;
        const int ds_dq = mode == 2 ? 0 : -1;
        Inputs in = make_inputs(sh.b, sh.h, sh.t, sh.d, sh.causal, peak, 91 + sh.t);
        in.flags[1].stable = true;
        in.flags[2].s_bf16 = true;
        in.flags[3].acc_bf16 = true;
        in.flags[4].delta_dpp = true;
        setenv("REWIND_ATTN_WGMMA", "0", 1);
        const Outputs mma = run_gpu(in, true, stats, false, ds_dq);
        unsetenv("REWIND_ATTN_WGMMA");
        const Outputs wg = run_gpu(in, true, stats, false, ds_dq);
        ASSERT_EQ(mma.fwd_status, 0);
        ASSERT_EQ(wg.fwd_status, 0);
        ASSERT_EQ(wg.bwd_status, 0);
        const std::string what = "D=" + std::to_string(sh.d) + " T=" + std::to_string(sh.t) +
                                 (sh.causal ? " causal" : "") + " peak " + std::to_string(peak) +
                                 " mode " + std::to_string(mode);
        ASSERT_GT(max_abs(wg.o), 0.0) << what;
        auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
        };
        EXPECT_TRUE(same(mma.o, wg.o)) << what;
        EXPECT_TRUE(same(mma.o32, wg.o32)) << what;
        EXPECT_TRUE(same(mma.lse, wg.lse)) << what;
        EXPECT_TRUE(same(mma.dq, wg.dq)) << what;
        EXPECT_TRUE(same(mma.dk, wg.dk)) << what;
        EXPECT_TRUE(same(mma.dv, wg.dv)) << what;
        EXPECT_TRUE(same(mma.delta, wg.delta)) << what;
        for (int h = 0; h < sh.h && stats; ++h) {
          const HeadStats &x = mma.stats[h], &y = wg.stats[h];
          EXPECT_EQ(std::memcmp(&x.max_logit, &y.max_logit, 4), 0) << what << " head " << h;
          EXPECT_EQ(x.rows, y.rows) << what;
          EXPECT_EQ(x.repeated_max_rows, y.repeated_max_rows) << what << " head " << h;
          EXPECT_EQ(x.pbar_one, y.pbar_one) << what << " head " << h;
          EXPECT_EQ(x.stable_pos, y.stable_pos) << what << " head " << h;
          EXPECT_EQ(x.stable_neg, y.stable_neg) << what << " head " << h;
          EXPECT_EQ(x.stable_guard, y.stable_guard) << what << " head " << h;
        }
      }
    }
  }
}

TEST(AttentionCuda, UnsupportedRequestsReturnErrors) {
  SKIP_WITHOUT_GPU();
  Inputs in = make_inputs(1, 2, 64, 64, true, 1.0f, 41);
  in.flags[1].prec[static_cast<int>(Op::kBwd)] = Prec::kFault;  // no defined meaning
  EXPECT_EQ(run_gpu(in).fwd_status, static_cast<int>(cudaErrorNotSupported));
  Inputs tile = make_inputs(1, 2, 256, 64, true, 1.0f, 42);
  tile.p.block_k = 32;  // the stable rule is defined per 64-key tile on the GPU
  EXPECT_EQ(run_gpu(tile).fwd_status, static_cast<int>(cudaErrorNotSupported));
  Inputs dim = make_inputs(1, 1, 64, 48, true, 1.0f, 43);  // not in kCudaHeadDims
  EXPECT_EQ(run_gpu(dim).fwd_status, static_cast<int>(cudaErrorInvalidValue));
}

}  // namespace
}  // namespace rwd::kernels::test
