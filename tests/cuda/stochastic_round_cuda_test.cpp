// Stochastic rounding on the GPU (qk=sr, pv=sr, acc=sr; skips without a GPU): the device draws
// and rounds as the host does, element for element; the sr kernels agree with the CPU twin
// within the tolerance of the other flags (AgreesWithCpuEmulation), per head dim; a forward and
// backward repeats bit for bit, on wgmma and mma.sync and through both dQ paths alike, another
// key changes the sr heads' bits and no other head's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/stochastic_round.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/sr_device.h"

namespace rwd::kernels::test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// 2^20 cases: random calls, streams and elements (rows and columns up to 2^20 and 2^31, acc
// columns of far tiles included) and values of every magnitude, with zeros, BF16 values,
// subnormals, the largest finite floats, infinities and NaNs mixed in.
std::vector<SrCase> random_cases(size_t n) {
  std::mt19937_64 rng(20250101);
  std::vector<SrCase> cases(n);
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.99609375f, 1e-40f, -3e-39f,
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 3.3895e38f};
  for (size_t i = 0; i < n; ++i) {
    SrCase& c = cases[i];
    c.seed = rng();
    c.step = static_cast<int64_t>(rng() % 100000);
    c.micro = static_cast<int32_t>(rng() % 64);
    c.layer = static_cast<int32_t>(rng() % 96);
    c.site = 1 + static_cast<int32_t>(rng() % 3);
    c.b = static_cast<int32_t>(rng() % 64);
    c.h = static_cast<int32_t>(rng() % 128);
    c.row = static_cast<int32_t>(rng() % (1u << 20));
    c.col = static_cast<uint32_t>(rng() >> 33);
    const uint32_t u = static_cast<uint32_t>(rng());
    std::memcpy(&c.x, &u, sizeof u);  // any pattern: every exponent, NaN payloads
    if (i % 7 == 0) c.x = specials[(i / 7) % (sizeof specials / sizeof specials[0])];
    if (i % 11 == 0) c.x = std::ldexp(static_cast<float>(rng() % 65536) / 65536.0f, static_cast<int>(rng() % 60) - 30);
  }
  return cases;
}

TEST(StochasticRoundCuda, DeviceDrawsAndRoundsAsTheHost) {
  SKIP_WITHOUT_GPU();
  const std::vector<SrCase> cases = random_cases(size_t{1} << 20);
  const std::vector<SrResult> dev = sr_on_device(cases);
  size_t bad = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const SrResult host = sr_evaluate(cases[i]);
    if (host.bits != dev[i].bits || host.rounded != dev[i].rounded) {
      if (++bad <= 5)
        ADD_FAILURE() << "case " << i << ": host bits " << host.bits << " rounded " << host.rounded << ", device "
                      << dev[i].bits << " " << dev[i].rounded;
    }
  }
  EXPECT_EQ(bad, 0u);
}

struct SrCaseSetting {
  const char* name;
  void (*apply)(Inputs&);
};

void all_heads(Inputs& in, void (*set)(HeadFlags&)) {
  for (auto& f : in.flags) set(f);
}

const SrCaseSetting kSrSettings[] = {
    {"pv_sr", [](Inputs& in) { all_heads(in, [](HeadFlags& f) { f.pv_sr = true; }); }},
    {"acc_sr", [](Inputs& in) { all_heads(in, [](HeadFlags& f) { f.acc_sr = true; }); }},
    {"qk_sr", [](Inputs& in) { all_heads(in, [](HeadFlags& f) { f.s_sr = true; }); }},
    {"all_sr_stable", [](Inputs& in) {
       all_heads(in, [](HeadFlags& f) { f.s_sr = f.pv_sr = f.acc_sr = f.stable = true; });
     }},
    {"pv_sr_pv_fault", [](Inputs& in) {
       all_heads(in, [](HeadFlags& f) {
         f.pv_sr = true;
         f.prec[static_cast<int>(Op::kPv)] = Prec::kFault;
         f.fault[static_cast<int>(Op::kPv)] = 4.0f;
       });
     }},
    // FP32 heads with sr flags run the SIMT kernels (the split variants have no SR).
    {"pv_sr_qk_fp32", [](Inputs& in) {
       all_heads(in, [](HeadFlags& f) {
         f.pv_sr = f.acc_sr = true;
         f.prec[static_cast<int>(Op::kQk)] = Prec::kFp32;
       });
     }},
    {"qk_sr_bwd_fp32", [](Inputs& in) {
       all_heads(in, [](HeadFlags& f) {
         f.s_sr = true;
         f.prec[static_cast<int>(Op::kBwd)] = Prec::kFp32;
       });
     }},
    // Tiling off: every head on the SIMT kernels (acc=sr is left out: there they round Ō every
    // 64 keys, the CPU twin once).
    {"pv_qk_sr_tiling_off", [](Inputs& in) {
       in.p.block_k = 0;
       all_heads(in, [](HeadFlags& f) { f.pv_sr = f.s_sr = true; });
     }},
    {"mixed_heads", [](Inputs& in) {
       in.flags[0].pv_sr = true;
       in.flags[1].acc_sr = true;
     }},
};

class AttentionCudaSrDim : public testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(HeadDims, AttentionCudaSrDim, testing::ValuesIn(kCudaHeadDims),
                         [](const testing::TestParamInfo<int>& i) { return "D" + std::to_string(i.param); });

TEST_P(AttentionCudaSrDim, AgreesWithCpuEmulation) {
  SKIP_WITHOUT_GPU();
  const int d = GetParam();
  uint64_t seed = 300 + d;
  for (const SrCaseSetting& sc : kSrSettings) {
    for (bool causal : {true, false}) {
      Inputs in = make_inputs(1, 2, causal ? 150 : 96, d, causal, 2.0f, seed++);
      in.p.sr_key = sr_call_key(seed, 17, 1, 3);
      sc.apply(in);
      SCOPED_TRACE(testing::Message() << sc.name << " D=" << d << (causal ? " causal" : ""));
      for (bool stats : {true, false}) {
        const Outputs gpu = run_gpu(in, true, stats), cpu = run_cpu(in);
        ASSERT_EQ(gpu.fwd_status, 0);
        ASSERT_EQ(gpu.bwd_status, 0);
        // all_sr_stable: S rounded (stochastically) under another summation order can flip a
        // row's repeated-max decision, as stable_eps's nearest-even S does in
        // AgreesWithCpuEmulation: one such row allowed.
        expect_outputs_agree(gpu, cpu, d, std::string(sc.name) == "all_sr_stable" ? 1 : 0);
      }
    }
  }
}

bool same(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Heads: 0 default, 1 pv=sr, 2 acc=sr, 3 qk=sr, 4 all three and stabilized, 5 pv=sr with
// delta=dpp (the dQ kernel's extra pass over P).
Inputs sr_heads(int b, int t, int d, bool causal, uint64_t key) {
  Inputs in = make_inputs(b, 6, t, d, causal, 3.0f, 500 + t + d);
  in.p.sr_key = key;
  in.flags[1].pv_sr = true;
  in.flags[2].acc_sr = true;
  in.flags[3].s_sr = true;
  in.flags[4].s_sr = in.flags[4].pv_sr = in.flags[4].acc_sr = in.flags[4].stable = true;
  in.flags[5].pv_sr = in.flags[5].delta_dpp = true;
  return in;
}

// The same call gives the same bits: twice, with monitors or without, on wgmma or mma.sync,
// dQ from stored dS tiles or recomputed. Another step's key changes every sr head and leaves
// head 0 as a plan without sr computes it.
TEST(AttentionCudaSr, RepeatsBitForBitAndChangesOnlyItsHeads) {
  SKIP_WITHOUT_GPU();
  const struct {
    int b, t, d;
    bool causal;
  } shapes[] = {{2, 200, 64, true}, {1, 333, 128, false}, {2, 130, 80, true}, {1, 150, 256, true}};
  for (const auto& sh : shapes) {
    const std::string what = "D=" + std::to_string(sh.d) + " T=" + std::to_string(sh.t);
    const Inputs in = sr_heads(sh.b, sh.t, sh.d, sh.causal, sr_call_key(1, 10, 0, 2));
    const Outputs ref = run_gpu(in);
    ASSERT_EQ(ref.fwd_status, 0) << what;
    ASSERT_EQ(ref.bwd_status, 0) << what;
    for (int mode = 0; mode < 4; ++mode) {  // again; no monitors; mma.sync; dQ the other way
      if (mode == 2) setenv("REWIND_ATTN_WGMMA", "0", 1);
      const Outputs again = run_gpu(in, true, mode != 1, false, mode == 3 ? 0 : -1);
      unsetenv("REWIND_ATTN_WGMMA");
      ASSERT_EQ(again.bwd_status, 0) << what << " mode " << mode;
      EXPECT_TRUE(same(ref.o, again.o) && same(ref.o32, again.o32) && same(ref.lse, again.lse)) << what << " mode " << mode;
      EXPECT_TRUE(same(ref.dq, again.dq) && same(ref.dk, again.dk) && same(ref.dv, again.dv) &&
                  same(ref.delta, again.delta))
          << what << " mode " << mode;
    }
    Inputs plain = in;
    plain.flags.assign(plain.flags.size(), HeadFlags{});
    plain.flags[4].stable = true;
    plain.flags[5].delta_dpp = true;
    const Outputs base = run_gpu(plain);
    const Outputs other = run_gpu(sr_heads(sh.b, sh.t, sh.d, sh.causal, sr_call_key(1, 11, 0, 2)));
    ASSERT_EQ(other.bwd_status, 0) << what;
    for (int h = 0; h < 6; ++h) {
      const bool head0_same = same_bits(ref.o32, base.o32, in, sh.d, h) && same_bits(ref.dq, base.dq, in, sh.d, h) &&
                              same_bits(ref.dk, base.dk, in, sh.d, h) && same_bits(ref.dv, base.dv, in, sh.d, h);
      if (h == 0) EXPECT_TRUE(head0_same) << what << ": an sr head changed head 0";
      // Head 3's S bits move only the forward's O and the gradients through P; every sr head's
      // outputs depend on the key.
      const bool moved = !same_bits(ref.o32, other.o32, in, sh.d, h) || !same_bits(ref.dv, other.dv, in, sh.d, h);
      EXPECT_EQ(moved, h != 0) << what << " head " << h;
    }
  }
}

}  // namespace
}  // namespace rwd::kernels::test
