// Tests of the precision-plan language (plan/plan.h): valid specs set exactly the flags they
// name, canonical() round-trips random plans, errors name the position, the hash is stable.
#include "plan/plan.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/error.h"

namespace rwd::plan {
namespace {

using kernels::HeadFlags;
using kernels::Op;
using kernels::Prec;

constexpr int kLayers = 12, kHeads = 12;

Prec prec(const Plan& p, int l, int h, Op op) {
  return p.layers[l].heads[h].prec[static_cast<int>(op)];
}

// Semantic equality, field by field (ignores fields that are dead: fault strength of a
// non-fault op, beta/eps of a non-stable softmax). Independent of canonical().
bool same_head(const HeadFlags& a, const HeadFlags& b) {
  for (int op = 0; op < kernels::kNumOps; ++op) {
    if (a.prec[op] != b.prec[op]) return false;
    if (a.prec[op] == Prec::kFault && a.fault[op] != b.fault[op]) return false;
  }
  if (a.stable != b.stable) return false;
  if (a.stable && (a.beta != b.beta || a.eps != b.eps)) return false;
  return a.s_bf16 == b.s_bf16 && a.acc_bf16 == b.acc_bf16 && a.delta_dpp == b.delta_dpp &&
         a.s_sr == b.s_sr && a.pv_sr == b.pv_sr && a.acc_sr == b.acc_sr;
}

bool same_plan(const Plan& a, const Plan& b) {
  if (a.n_layer != b.n_layer || a.n_head != b.n_head || a.head_fp32 != b.head_fp32) return false;
  if (a.block_q != b.block_q || a.block_k != b.block_k) return false;
  for (int l = 0; l < a.n_layer; ++l) {
    const auto &x = a.layers[l], &y = b.layers[l];
    if (x.naive != y.naive) return false;
    for (int m = 0; m < kNumModules; ++m) if (x.module_fp32[m] != y.module_fp32[m]) return false;
    for (int h = 0; h < a.n_head; ++h) if (!same_head(x.heads[h], y.heads[h])) return false;
  }
  return true;
}

// Counts (layer, head, op) cells whose precision is not kLow.
int promoted_cells(const Plan& p) {
  int n = 0;
  for (const auto& l : p.layers)
    for (const auto& h : l.heads)
      for (Prec q : h.prec) n += (q != Prec::kLow);
  return n;
}

TEST(Plan, DefaultsAreEmptyAndHashIsFnvOffset) {
  Plan p = Plan::defaults(kLayers, kHeads);
  EXPECT_EQ(p.canonical(), "");
  EXPECT_EQ(p.hash_hex(), "cbf29ce484222325");  // FNV-1a 64 of the empty string
  EXPECT_EQ(p.block_q, 64);
  EXPECT_TRUE(same_plan(parse("", kLayers, kHeads), p));
  EXPECT_TRUE(same_plan(parse(" ; ;", kLayers, kHeads), p));
}

TEST(Plan, SingleOpSetsExactlyOneCell) {
  Plan p = parse("L2.H8.pv=fp32", kLayers, kHeads);
  EXPECT_EQ(prec(p, 2, 8, Op::kPv), Prec::kFp32);
  EXPECT_EQ(promoted_cells(p), 1);
  EXPECT_EQ(p.canonical(), "L2.H8.pv=fp32");
}

TEST(Plan, HeadSetsRangesAndStars) {
  Plan p = parse("L2.H{1,7,8}.o=fp32", kLayers, kHeads);
  EXPECT_EQ(promoted_cells(p), 3);
  for (int h : {1, 7, 8}) EXPECT_EQ(prec(p, 2, h, Op::kO), Prec::kFp32);
  EXPECT_EQ(p.canonical(), "L2.H{1,7-8}.o=fp32");

  p = parse("L1-3.H2-4.bwd=fp32", kLayers, kHeads);
  EXPECT_EQ(promoted_cells(p), 9);
  EXPECT_EQ(p.canonical(), "L1-3.H2-4.bwd=fp32");

  p = parse("L{0,5-6}.pv=fp32", kLayers, kHeads);  // no .H: every head of the layers
  EXPECT_EQ(promoted_cells(p), 3 * kHeads);
  EXPECT_EQ(p.canonical(), "L{0,5-6}.H*.pv=fp32");

  p = parse("L*.H*.pv=fp32", kLayers, kHeads);
  EXPECT_EQ(promoted_cells(p), kLayers * kHeads);
  EXPECT_EQ(p.canonical(), "L*.H*.pv=fp32");
}

TEST(Plan, StableSoftmaxArgumentsAndDefaults) {
  Plan p = parse("L*.H*.softmax=stable(beta=2,eps=1e-3)", kLayers, kHeads);
  for (const auto& l : p.layers)
    for (const auto& h : l.heads) {
      EXPECT_TRUE(h.stable);
      EXPECT_EQ(h.beta, 2.0f);
      EXPECT_EQ(h.eps, 1e-3f);
      EXPECT_EQ(h.prec[static_cast<int>(Op::kSoftmax)], Prec::kLow);  // regime, not precision
    }
  EXPECT_EQ(p.canonical(), "L*.H*.softmax=stable(beta=2,eps=0.001)");
  p = parse("L0.H0.softmax=stable", kLayers, kHeads);
  EXPECT_EQ(p.layers[0].heads[0].beta, 2.0f);
  EXPECT_EQ(p.layers[0].heads[0].eps, 0.0f);
  p = parse("L0.H0.softmax=stable( eps = 0.5 , beta=16 )", kLayers, kHeads);
  EXPECT_EQ(p.layers[0].heads[0].beta, 16.0f);
  EXPECT_EQ(p.layers[0].heads[0].eps, 0.5f);
}

TEST(Plan, LayerLevelTargets) {
  Plan p = parse("L2=fp32", kLayers, kHeads);
  EXPECT_EQ(promoted_cells(p), kHeads * kernels::kNumOps);
  for (bool b : p.layers[2].module_fp32) EXPECT_TRUE(b);
  for (bool b : p.layers[3].module_fp32) EXPECT_FALSE(b);
  EXPECT_EQ(p.canonical(), "L2=fp32");

  p = parse("L2.attn=fp32", kLayers, kHeads);
  EXPECT_EQ(promoted_cells(p), kHeads * kernels::kNumOps);
  for (bool b : p.layers[2].module_fp32) EXPECT_FALSE(b);

  p = parse("L2.attn=naive;L3.mlp=fp32;L3.ln=fp32;L4.qkv=fp32;L5.proj=fp32", kLayers, kHeads);
  EXPECT_TRUE(p.layers[2].naive);
  EXPECT_TRUE(p.layers[3].module_fp32[static_cast<int>(Module::kMlp)]);
  EXPECT_TRUE(p.layers[3].module_fp32[static_cast<int>(Module::kLn)]);
  EXPECT_TRUE(p.layers[4].module_fp32[static_cast<int>(Module::kQkv)]);
  EXPECT_TRUE(p.layers[5].module_fp32[static_cast<int>(Module::kProj)]);
  EXPECT_EQ(promoted_cells(p), 0);
  EXPECT_FALSE(parse("L2.attn=naive;L2.attn=flash", kLayers, kHeads).layers[2].naive);

  p = parse("L2.H3=fp32", kLayers, kHeads);
  EXPECT_EQ(promoted_cells(p), kernels::kNumOps);
  for (int op = 0; op < kernels::kNumOps; ++op)
    EXPECT_EQ(p.layers[2].heads[3].prec[op], Prec::kFp32);
}

TEST(Plan, RegimesAndFaults) {
  Plan p = parse("L0.H0.qk=sbf16;L0.H1.acc=bf16;L0.H2.delta=dpp;L0.H2.delta=fp32;"
                 "L0.H3.o=fault(strength=0.25)",
                 kLayers, kHeads);
  const auto& hs = p.layers[0].heads;
  EXPECT_TRUE(hs[0].s_bf16);
  EXPECT_EQ(hs[0].prec[static_cast<int>(Op::kQk)], Prec::kLow);
  EXPECT_TRUE(hs[1].acc_bf16);
  EXPECT_TRUE(hs[2].delta_dpp);
  EXPECT_EQ(hs[2].prec[static_cast<int>(Op::kDelta)], Prec::kFp32);
  EXPECT_EQ(hs[3].prec[static_cast<int>(Op::kO)], Prec::kFault);
  EXPECT_EQ(hs[3].fault[static_cast<int>(Op::kO)], 0.25f);
  EXPECT_TRUE(same_plan(parse(p.canonical(), kLayers, kHeads), p));
}

TEST(Plan, LowResetsAndBf16IsDefaultExceptQkAndAcc) {
  Plan p = parse("L2=fp32;L2.H3.pv=low", kLayers, kHeads);
  EXPECT_EQ(prec(p, 2, 3, Op::kPv), Prec::kLow);
  EXPECT_EQ(prec(p, 2, 4, Op::kPv), Prec::kFp32);
  EXPECT_EQ(p.canonical(),
            "L2.qkv=fp32;L2.proj=fp32;L2.mlp=fp32;L2.ln=fp32;L2.H*.qk=fp32;L2.H*.softmax=fp32;"
            "L2.H{0-2,4-11}.pv=fp32;L2.H*.o=fp32;L2.H*.delta=fp32;L2.H*.bwd=fp32");
  Plan d = Plan::defaults(kLayers, kHeads);
  EXPECT_TRUE(same_plan(parse("L0.H0.pv=fp32;L0.H0.pv=bf16", kLayers, kHeads), d));
  EXPECT_TRUE(same_plan(parse("L0.H0.softmax=stable;L0.softmax=low", kLayers, kHeads), d));
  EXPECT_TRUE(same_plan(parse("L1=fp32;L1.attn=naive;L1=low", kLayers, kHeads), d));
  EXPECT_TRUE(same_plan(parse("all=fp32;tiling=off;all=low;tiling=on", kLayers, kHeads), d));
  EXPECT_TRUE(parse("L0.H0.acc=bf16", kLayers, kHeads).layers[0].heads[0].acc_bf16);
  EXPECT_FALSE(parse("L0.acc=bf16;L0.acc=fp32", kLayers, kHeads).layers[0].heads[0].acc_bf16);
  // fp32 promotes precision but keeps a regime the user chose.
  p = parse("L0.H0.qk=sbf16;L0=fp32", kLayers, kHeads);
  EXPECT_TRUE(p.layers[0].heads[0].s_bf16);
  EXPECT_EQ(p.canonical(), "L0=fp32;L0.H0.qk=sbf16");
}

// sr makes an op's BF16 rounding stochastic: per head, layer or model like the other values,
// printed back; qk=sr and acc=sr replace sbf16 and acc=bf16 (and the other way round), pv=sr
// rides on the pv precision (fp32 and faults leave it), low resets it.
TEST(Plan, StochasticRounding) {
  Plan p = parse("L1.H3.pv=sr", kLayers, kHeads);
  EXPECT_TRUE(p.layers[1].heads[3].pv_sr);
  EXPECT_EQ(prec(p, 1, 3, Op::kPv), Prec::kLow);
  EXPECT_EQ(p.canonical(), "L1.H3.pv=sr");
  EXPECT_EQ(parse("L1.pv=sr", kLayers, kHeads).canonical(), "L1.H*.pv=sr");
  p = parse("pv=sr", kLayers, kHeads);
  EXPECT_EQ(p.canonical(), "L*.H*.pv=sr");
  EXPECT_TRUE(same_plan(p, parse("L*.H*.pv=sr", kLayers, kHeads)));
  EXPECT_TRUE(rounds_stochastically(p));
  EXPECT_FALSE(rounds_stochastically(parse("L*.H*.qk=sbf16;acc=bf16", kLayers, kHeads)));

  p = parse("L0.H0.qk=sbf16;L0.H0.qk=sr;L0.H1.acc=bf16;L0.H1.acc=sr;L0.H2.qk=sr;L0.H2.qk=sbf16", kLayers, kHeads);
  const auto& hs = p.layers[0].heads;
  EXPECT_TRUE(hs[0].s_sr && !hs[0].s_bf16);
  EXPECT_TRUE(hs[1].acc_sr && !hs[1].acc_bf16);
  EXPECT_TRUE(hs[2].s_bf16 && !hs[2].s_sr);
  EXPECT_EQ(p.canonical(), "L0.H2.qk=sbf16;L0.H0.qk=sr;L0.H1.acc=sr");

  p = parse("L0.H0.pv=sr;L0.H0.pv=fault(strength=4);L0.H1.pv=sr;L0=fp32;L2.pv=sr;L2.H1.pv=low", kLayers, kHeads);
  EXPECT_TRUE(p.layers[0].heads[0].pv_sr);
  EXPECT_EQ(prec(p, 0, 0, Op::kPv), Prec::kFp32);
  EXPECT_FALSE(p.layers[2].heads[1].pv_sr);
  EXPECT_EQ(p.canonical(), "L0=fp32;L0.H0-1.pv=sr;L2.H{0,2-11}.pv=sr");
  EXPECT_TRUE(same_plan(parse(p.canonical(), kLayers, kHeads), p));
  p = parse("L1.acc=sr;L1.H2.acc=fp32;L1.H3.acc=low;qk=sr;L3.qk=low", kLayers, kHeads);
  EXPECT_EQ(p.canonical(), "L{0-2,4-11}.H*.qk=sr;L1.H{0-1,4-11}.acc=sr");
  EXPECT_TRUE(same_plan(parse(p.canonical(), kLayers, kHeads), p));

  // Bare targets are the op of every layer, modules too; sr only where BF16 is rounded.
  EXPECT_EQ(parse("mlp=fp32", kLayers, kHeads).canonical(), "L*.mlp=fp32");
  EXPECT_THROW(parse("o=sr", kLayers, kHeads), UsageError);
  EXPECT_THROW(parse("L0.H0.delta=sr", kLayers, kHeads), UsageError);
  EXPECT_THROW(parse("pv=sbf16", kLayers, kHeads), UsageError);
}

TEST(Plan, GlobalTargets) {
  Plan p = parse("tiling=off;head=fp32", kLayers, kHeads);
  EXPECT_EQ(p.block_q, 0);
  EXPECT_EQ(p.block_k, 0);
  EXPECT_TRUE(p.head_fp32);
  EXPECT_EQ(p.canonical(), "head=fp32;tiling=off");
  p = parse("tile=32x128", kLayers, kHeads);
  EXPECT_EQ(p.block_q, 32);
  EXPECT_EQ(p.block_k, 128);
  EXPECT_EQ(p.canonical(), "tile=32x128");
  EXPECT_EQ(parse("tile=64x64", kLayers, kHeads).canonical(), "");

  Plan all = Plan::all_fp32(kLayers, kHeads);
  EXPECT_EQ(all.canonical(), "head=fp32;L*=fp32");
  EXPECT_EQ(promoted_cells(all), kLayers * kHeads * kernels::kNumOps);
  EXPECT_TRUE(same_plan(parse("all=fp32", kLayers, kHeads), all));
  EXPECT_TRUE(same_plan(parse(all.canonical(), kLayers, kHeads), all));
}

TEST(Plan, WhitespaceIsTolerated) {
  Plan a = parse(" L2 . H{ 1 , 7 - 8 } . o = fp32 ;  L0.acc = bf16 ; ", kLayers, kHeads);
  Plan b = parse("L2.H{1,7-8}.o=fp32;L0.acc=bf16", kLayers, kHeads);
  EXPECT_TRUE(same_plan(a, b));
  EXPECT_EQ(a.hash(), b.hash());
}

TEST(Plan, CanonicalCompressesAgreeingLayers) {
  Plan p = parse("L0.H0.pv=fp32;L1.H0.pv=fp32;L2.H0.pv=fp32;L5.H{0,3}.pv=fp32", kLayers, kHeads);
  EXPECT_EQ(p.canonical(), "L0-2.H0.pv=fp32;L5.H{0,3}.pv=fp32");
  p = parse("L0.H0.o=fault(strength=0.5);L1.H0.o=fault(strength=0.1)", kLayers, kHeads);
  EXPECT_EQ(p.canonical(), "L1.H0.o=fault(strength=0.1);L0.H0.o=fault(strength=0.5)");
}

// Builds a random plan by setting fields directly (not through the parser), so the round trip
// also exercises combinations a user would rarely type.
Plan random_plan(std::mt19937& rng, int n_layer, int n_head) {
  auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto real = [&](double lo, double hi) {
    return static_cast<float>(std::uniform_real_distribution<double>(lo, hi)(rng));
  };
  Plan p = Plan::defaults(n_layer, n_head);
  p.head_fp32 = coin(0.3);
  if (coin(0.3)) p.block_q = p.block_k = 0;
  else if (coin(0.3)) { p.block_q = 16 << (rng() % 3); p.block_k = 16 << (rng() % 3); }
  bool dense = coin(0.5);
  for (auto& l : p.layers) {
    l.naive = coin(0.2);
    for (bool& b : l.module_fp32) b = coin(0.3);
    bool all32 = coin(0.2);
    for (auto& h : l.heads) {
      for (int op = 0; op < kernels::kNumOps; ++op) {
        double r = std::uniform_real_distribution<double>(0, 1)(rng);
        if (all32 || (dense && r < 0.3)) h.prec[op] = Prec::kFp32;
        else if (r < 0.05 && op != static_cast<int>(Op::kBwd)) {  // bwd has no fault mode
          h.prec[op] = Prec::kFault;
          h.fault[op] = real(-3, 3);
        }
      }
      // S and the accumulator round one way each: nearest-even or stochastic.
      h.s_bf16 = coin(0.1);
      h.s_sr = !h.s_bf16 && coin(0.1);
      h.acc_bf16 = coin(0.1);
      h.acc_sr = !h.acc_bf16 && coin(0.1);
      h.pv_sr = coin(0.1);
      h.delta_dpp = coin(0.1);
      if (coin(0.15)) { h.stable = true; h.beta = real(1, 16); h.eps = real(0, 0.01); }
    }
  }
  return p;
}

TEST(Plan, CanonicalRoundTripsRandomPlans) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    int nl = 1 + static_cast<int>(rng() % 12), nh = 1 + static_cast<int>(rng() % 12);
    Plan p = random_plan(rng, nl, nh);
    std::string text = p.canonical();
    Plan q = parse(text, nl, nh);
    ASSERT_TRUE(same_plan(p, q)) << "trial " << trial << ": " << text;
    ASSERT_EQ(q.canonical(), text);
    ASSERT_EQ(q.hash(), p.hash());
  }
}

TEST(Plan, ApplyLayersOnABase) {
  Plan base = parse("L1.H1.pv=fp32", kLayers, kHeads);
  Plan p = apply(base, "L1.H2.o=fp32");
  EXPECT_EQ(p.canonical(), "L1.H1.pv=fp32;L1.H2.o=fp32");
  Plan bwd_fault = base;
  bwd_fault.layers[0].heads[0].prec[static_cast<int>(Op::kBwd)] = Prec::kFault;
  EXPECT_THROW(bwd_fault.canonical(), Error);
  Plan broken = base;
  broken.layers.pop_back();
  EXPECT_THROW(apply(broken, ""), Error);
}

struct BadSpec {
  const char* spec;
  int position;         // 1-based
  const char* message;  // substring of the error
};

TEST(Plan, ErrorsNameThePosition) {
  const BadSpec cases[] = {
      {"L2.H8.pvv=fp32", 7,
       "unknown op 'pvv' (expected qk, softmax, pv, o, delta, bwd, acc, qkv, proj, mlp, ln, attn)"},
      {"L12=fp32", 2, "layer 12 out of range (model has 12 layers: L0..L11)"},
      {"L0.H3-12.pv=fp32", 5, "head 12 out of range (model has 12 heads: H0..H11)"},
      {"L2.H8.pv", 9, "expected '=' after the target, found end of text"},
      {"L2.H8.pv=fp16", 10, "unknown mode 'fp16' for pv (expected low, bf16, fp32, fault"},
      {"L2.H8.pv=fp32;;foo=1", 16, "unknown target 'foo'"},
      {"L5-2=fp32", 2, "empty layer range 5-2"},
      {"L{1,2=fp32", 6, "expected '}' to close the layer set"},
      {"Lx=fp32", 2, "expected layer, found 'x'"},
      {"L\xc3\xa9=fp32", 2, "expected layer, found '\xc3\xa9'"},  // the whole character, not half
      {"L2.pv=fp32\xe2\x80\x94", 11, "found '\xe2\x80\x94'"},     // an em dash
      {"L2.H8.qk=bf16", 10, "'qk=bf16' is ambiguous"},
      {"L2.softmax=stable(beta=40)", 12, "beta must be in [1, 16]"},
      {"L2.softmax=stable(gamma=1)", 19, "unknown argument 'gamma'"},
      {"L2.o=fault", 6, "fault needs (strength=X)"},
      {"L2.o=fault(strength=inf)", 21, "expected a finite number"},
      {"L2.bwd=fault(strength=1)", 8, "unknown mode 'fault' for bwd"},
      {"L2.H1.mlp=fp32", 7, "'mlp' is layer-level"},
      {"L2.H1=naive", 7, "unknown mode 'naive' for a head"},
      {"tile=0x64", 6, "tile sizes must be positive"},
      {"tile=32y64", 8, "expected 'x' in tile=QxK"},
      {"L2.pv=fp32 L3.pv=fp32", 12, "expected ';' between assignments"},
      {"L2.pv=", 7, "missing mode for pv"},
      {"=fp32", 1, "expected a target"},
      {"L2.=fp32", 4, "expected H<heads> or an op"},
  };
  for (const auto& c : cases) {
    try {
      parse(c.spec, kLayers, kHeads);
      ADD_FAILURE() << "no error for '" << c.spec << "'";
    } catch (const UsageError& e) {
      std::string want = "plan: position " + std::to_string(c.position) + ": ";
      std::string what = e.what();
      EXPECT_EQ(what.rfind(want, 0), 0u) << c.spec << " -> " << what;
      EXPECT_NE(what.find(c.message), std::string::npos) << c.spec << " -> " << what;
      EXPECT_EQ(e.code(), ExitCode::kUsage);
    }
  }
}

// The hash is the probe-cache key stored on disk, so it is a stability contract: this value
// was computed once (FNV-1a 64 of the canonical string below, by an independent script) and
// must never change.
TEST(Plan, HashIsStable) {
  Plan p = parse("L2.H{1,7,8}.o=fp32; L*.H*.softmax=stable(beta=2,eps=1e-3)", kLayers, kHeads);
  EXPECT_EQ(p.canonical(), "L*.H*.softmax=stable(beta=2,eps=0.001);L2.H{1,7-8}.o=fp32");
  EXPECT_EQ(p.hash_hex(), "65d28ecb4acac6b2");
  EXPECT_EQ(p.hash_hex().size(), 16u);
  EXPECT_NE(p.hash(), parse("L2.H{1,7}.o=fp32", kLayers, kHeads).hash());
  EXPECT_TRUE(p == parse(p.canonical(), kLayers, kHeads));
  EXPECT_TRUE(p != Plan::defaults(kLayers, kHeads));
}

}  // namespace
}  // namespace rwd::plan
