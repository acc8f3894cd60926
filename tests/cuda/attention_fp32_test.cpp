// Contract of the FP32-faithful heads on the tensor cores (split-BF16 operands): per promoted
// op and head dim, on random and crafted inputs, the error against the FP64 reference (forward
// and backward) is at most twice the true-FP32 CPU twin's; the SIMT reference kernels are
// measured alongside. Every head dim: at D = 256 the FP32 heads take the SIMT kernels (no
// split-operand variant fits its shared memory), so there "tc" is the SIMT path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention_cpu.h"
#include "tests/cuda/cuda_test_util.h"

namespace rwd::kernels::test {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

// FP64 reference forward on the inputs as given (no rounding), kept in double: an FP32 copy
// would carry a rounding error as large as the errors compared here.
struct Reference {
  std::vector<double> o, lse;
};
Reference reference(const Inputs& in) {
  const std::vector<double> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()),
      v(in.v.begin(), in.v.end());
  Reference r;
  r.o.resize(q.size());
  r.lse.resize(static_cast<size_t>(in.p.batch) * in.p.heads * in.p.seq);
  attention_reference_forward(in.p, q.data(), k.data(), v.data(), r.o.data(), r.lse.data());
  return r;
}
double max_err(const std::vector<float>& x, const std::vector<double>& ref) {
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = std::fabs(x[i] - ref[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

// Which op is promoted, and where its error shows: the LSE depends on S and the softmax only,
// O (Ō/l before the output rounding) on everything. An op that is not promoted keeps its BF16
// rounding, which would swamp the FP32 errors compared, so its operands are made BF16-exact
// (q, k: multiples of 1/8, so S does not depend on the summation order either).
struct OpCase {
  const char* name;
  bool qk, softmax, pv;
  bool check_o;
};
const OpCase kOps[] = {{"qk", true, false, false, false},
                       {"softmax", false, true, false, false},
                       {"pv", false, false, true, true},
                       {"attn", true, true, true, true}};

// Inputs: random normal (peak 1 and 4: flat and peaky logits), values with a common offset
// (+8: Ō accumulates a large mean), and q, k near 1 with tiny spread (BF16 keeps none of it).
Inputs crafted(int kind, int d, uint64_t seed) {
  Inputs in = make_inputs(1, 2, 200, d, true, kind == 1 ? 4.0f : 1.0f, seed);
  if (kind == 2) {
    for (float& x : in.v) x += 8.0f;
  } else if (kind == 3) {
    for (float& x : in.q) x = 1.0f + 0.01f * x;
    for (float& x : in.k) x = 1.0f + 0.01f * x;
  }
  return in;
}

TEST(AttentionFp32, TensorCoreErrorAtMostTwiceFp32Twin) {
  SKIP_WITHOUT_GPU();
  for (const OpCase& op : kOps) {
    for (int d : kCudaHeadDims) {
      for (int kind = 0; kind < 4; ++kind) {
        Inputs in = crafted(kind, d, 500 + kind + d);
        if (!op.qk) {  // multiples of 1/8: S exact in any summation order
          for (auto* x : {&in.q, &in.k}) {
            for (float& e : *x) e = std::nearbyint(e * 8.0f) / 8.0f;
          }
        }
        if (!op.pv) in.v = bf16_round(in.v);
        for (auto& f : in.flags) {
          if (op.qk) f.prec[static_cast<int>(Op::kQk)] = Prec::kFp32;
          if (op.softmax) f.prec[static_cast<int>(Op::kSoftmax)] = Prec::kFp32;
          if (op.pv) f.prec[static_cast<int>(Op::kPv)] = Prec::kFp32;
        }
        const Reference ref = reference(in);
        const Outputs tc = run_gpu(in, false, false), simt = run_gpu(in, false, false, true),
                      cpu = run_cpu(in, false), tc_mon = run_gpu(in, false, true);
        ASSERT_EQ(tc.fwd_status, 0);
        ASSERT_EQ(simt.fwd_status, 0);
        ASSERT_EQ(tc_mon.fwd_status, 0);
        SCOPED_TRACE(testing::Message() << op.name << " D=" << d << " inputs " << kind);
        const double lse_tc = max_err(tc.lse, ref.lse), lse_cpu = max_err(cpu.lse, ref.lse);
        const double lse_simt = max_err(simt.lse, ref.lse);
        const double o_tc = max_err(tc.o32, ref.o), o_cpu = max_err(cpu.o32, ref.o);
        const double o_simt = max_err(simt.o32, ref.o);
        std::printf("fp32 %-7s D%-3d in%d: LSE err tc %.2e simt %.2e cpu %.2e | O err tc %.2e "
                    "simt %.2e cpu %.2e\n", op.name, d, kind, lse_tc, lse_simt, lse_cpu, o_tc,
                    o_simt, o_cpu);
        EXPECT_LE(lse_tc, 2.0 * lse_cpu);
        if (op.check_o) EXPECT_LE(o_tc, 2.0 * o_cpu);
        // With monitors the FP32 heads run their own specialization: same bits.
        EXPECT_EQ(std::memcmp(tc.o32.data(), tc_mon.o32.data(), tc.o32.size() * 4), 0);
        EXPECT_EQ(std::memcmp(tc.lse.data(), tc_mon.lse.data(), tc.lse.size() * 4), 0);
      }
    }
  }
}

// The backward of attn=fp32 heads (every op promoted) against the FP64 gradients: dQ, dK, dV
// each at most twice the CPU twin's error, on the same inputs as the forward contract.
TEST(AttentionFp32, BackwardErrorAtMostTwiceFp32Twin) {
  SKIP_WITHOUT_GPU();
  for (int d : kCudaHeadDims) {
    for (int kind = 0; kind < 4; ++kind) {
      Inputs in = crafted(kind, d, 700 + kind + d);
      for (auto& f : in.flags) {
        for (auto& pr : f.prec) pr = Prec::kFp32;
      }
      const size_t n = in.q.size();
      const Reference fwd = reference(in);
      const std::vector<double> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()),
          v(in.v.begin(), in.v.end()), d_o(in.d_o.begin(), in.d_o.end());
      std::vector<double> dq(n), dk(n), dv(n);
      attention_reference_backward(in.p, q.data(), k.data(), v.data(), fwd.o.data(), d_o.data(),
                                   fwd.lse.data(), dq.data(), dk.data(), dv.data());
      const Outputs tc = run_gpu(in, true, false), simt = run_gpu(in, true, false, true),
                    cpu = run_cpu(in, true);
      ASSERT_EQ(tc.bwd_status, 0);
      ASSERT_EQ(simt.bwd_status, 0);
      SCOPED_TRACE(testing::Message() << "D=" << d << " inputs " << kind);
      for (const auto& [name, g, s, c, ref] :
           {std::tuple{"dQ", &tc.dq, &simt.dq, &cpu.dq, &dq}, std::tuple{"dK", &tc.dk, &simt.dk, &cpu.dk, &dk},
            std::tuple{"dV", &tc.dv, &simt.dv, &cpu.dv, &dv}}) {
        const double e_tc = max_err(*g, *ref), e_simt = max_err(*s, *ref), e_cpu = max_err(*c, *ref);
        std::printf("fp32 bwd D%-3d in%d %s err tc %.2e simt %.2e cpu %.2e\n", d, kind, name, e_tc,
                    e_simt, e_cpu);
        EXPECT_LE(e_tc, 2.0 * e_cpu) << name;
      }
    }
  }
}

// A BF16 promotion of the same op is far off the reference: the crafted inputs of kind 3 (q, k
// near 1) make the BF16 logits useless, so the contract above cannot pass by accident.
TEST(AttentionFp32, Bf16OperandsFailTheContract) {
  SKIP_WITHOUT_GPU();
  for (int d : kCudaHeadDims) {
    const Inputs in = crafted(3, d, 900 + d);
    Inputs promoted = in;
    for (auto& f : promoted.flags) f.prec[static_cast<int>(Op::kQk)] = Prec::kFp32;
    const Reference ref = reference(in);
    const Outputs low = run_gpu(in, false, false), cpu = run_cpu(promoted, false);
    ASSERT_EQ(low.fwd_status, 0);
    EXPECT_GT(max_err(low.lse, ref.lse), 10.0 * max_err(cpu.lse, ref.lse)) << "D=" << d;
  }
}

// A mixed plan: qk, pv and all ops promoted in three heads beside BF16 heads. The BF16 heads
// keep the bits (O, dQ, dK, dV) of the all-BF16 launch, the promoted ones differ.
TEST(AttentionFp32, MixedLaunchKeepsBf16HeadsBitwise) {
  SKIP_WITHOUT_GPU();
  for (int d : kCudaHeadDims) {
    const Inputs base = make_inputs(2, 6, 260, d, true, 2.0f, 77 + d);
    Inputs mixed = base;
    mixed.flags[1].prec[static_cast<int>(Op::kQk)] = Prec::kFp32;
    mixed.flags[3].prec[static_cast<int>(Op::kPv)] = Prec::kFp32;
    for (int op = 0; op < kNumOps; ++op) mixed.flags[4].prec[op] = Prec::kFp32;
    const Outputs all_bf16 = run_gpu(base, true, false), out = run_gpu(mixed, true, false);
    ASSERT_EQ(out.fwd_status, 0);
    ASSERT_EQ(out.bwd_status, 0);
    const size_t per_head = static_cast<size_t>(base.p.seq) * d;
    for (int b = 0; b < base.p.batch; ++b) {
      for (int h = 0; h < base.p.heads; ++h) {
        const size_t at = (static_cast<size_t>(b) * base.p.heads + h) * per_head;
        bool same = true;
        for (auto x : {&Outputs::o32, &Outputs::dq, &Outputs::dk, &Outputs::dv}) {
          same = same && std::memcmp((out.*x).data() + at, (all_bf16.*x).data() + at, per_head * 4) == 0;
        }
        EXPECT_EQ(same, h == 0 || h == 2 || h == 5) << "D=" << d << " b " << b << " head " << h;
      }
    }
  }
}

}  // namespace
}  // namespace rwd::kernels::test
