// Golden et al. ("Is Flash Attention Stable?") Figs 3-6 with the CPU kernels: max and mean
// |O - O_fp64| of flash (tiled) and naive attention per numeric regime (BF16, FP16, FP32).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "experiments/flash_deviation/fp16_attention.h"
#include "kernels/attention_cpu.h"
#include "kernels/bf16.h"

namespace {

namespace k = rwd::kernels;

// splitmix64 + Box-Muller: the same inputs on every standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t s_;
};

// Numeric regimes, one head each (docs/design.md). The paper's own flash is pure PyTorch in the
// working precision, i.e. BF16 running Ō/l (acc=bf16) and S in BF16 (qk=bf16).
struct Regime {
  const char* name;
  bool s_bf16, acc_bf16, fp32;
};
const Regime kRegimes[] = {
    {"bf16-kernel", false, false, false},  // real FA2: S, Ō, l in FP32 registers
    {"s_bf16", true, false, false},        // eager autocast: S rounded to BF16
    {"acc_bf16", false, true, false},      // running Ō, l in BF16
    {"s+acc_bf16", true, true, false},     // both: the paper's BF16 PyTorch flash
    {"fp32", false, false, true},          // every op FP32 (all=fp32)
};
constexpr int kNumRegimes = sizeof(kRegimes) / sizeof(kRegimes[0]);
// FP16 columns (experiment-local emulation, fp16_attention.h): the kernel's rounding points with
// FP16 in place of BF16, and the same with running Ō, l in FP16 (the paper's PyTorch flash).
const char* const kFp16Names[] = {"fp16-kernel", "fp16-acc"};
constexpr int kNumFp16 = 2;
constexpr int kNumCols = kNumRegimes + kNumFp16;
constexpr int kBatch = 2;  // independent inputs per measurement
constexpr int kDim = 64;

struct Errors {
  double max_abs = 0, mean_abs = 0;  // of the output O (BF16 except fp32)
  double max_pre = 0, mean_pre = 0;  // of Ō / l before the final rounding (o_f32)
};

// One problem: B independent (T, D) inputs, q and k ~ N(0, sigma^2), v ~ N(0, 1), all rounded
// to BF16 so the FP64 reference and every regime see identical inputs (this isolates the
// attention arithmetic from input quantization).
struct Problem {
  int t = 0;
  double sigma = 1;
  std::vector<float> q, k, v;      // (B, H, T, D): every head holds the same input
  std::vector<double> ref;         // (B, 1, T, D) FP64 reference output
  std::vector<float> q16, k16, v16;  // (B, T, D): the inputs rounded to FP16 (fp16 columns)
  std::vector<double> ref16;         // FP64 reference output of the FP16 inputs
};

std::vector<double> reference(int t, const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v) {
  std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end());
  std::vector<double> out(q.size()), lse(static_cast<size_t>(kBatch) * t);
  k::AttentionParams p;
  p.batch = kBatch;
  p.heads = 1;
  p.seq = t;
  p.dim = kDim;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim)));
  p.causal = true;
  k::attention_reference_forward(p, qd.data(), kd.data(), vd.data(), out.data(), lse.data());
  return out;
}

Problem make_problem(int t, double sigma, uint64_t seed) {
  Problem pr;
  pr.t = t;
  pr.sigma = sigma;
  const size_t slice = static_cast<size_t>(t) * kDim;
  std::vector<float> q1(kBatch * slice), k1(q1.size()), v1(q1.size());
  Rng rng(seed);
  for (size_t i = 0; i < q1.size(); ++i) {
    q1[i] = k::round_bf16(static_cast<float>(sigma * rng.normal()));
    k1[i] = k::round_bf16(static_cast<float>(sigma * rng.normal()));
    v1[i] = k::round_bf16(static_cast<float>(rng.normal()));
  }
  pr.q.resize(kBatch * kNumRegimes * slice);
  pr.k.resize(pr.q.size());
  pr.v.resize(pr.q.size());
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kNumRegimes; ++h) {
      const size_t dst = (static_cast<size_t>(b) * kNumRegimes + h) * slice, src = b * slice;
      std::copy(q1.begin() + src, q1.begin() + src + slice, pr.q.begin() + dst);
      std::copy(k1.begin() + src, k1.begin() + src + slice, pr.k.begin() + dst);
      std::copy(v1.begin() + src, v1.begin() + src + slice, pr.v.begin() + dst);
    }
  pr.ref = reference(t, q1, k1, v1);
  // BF16 values are FP16 values unless below FP16's normal range; round those too and give the
  // FP16 columns their own reference of exactly the inputs they see.
  pr.q16 = q1;
  pr.k16 = k1;
  pr.v16 = v1;
  for (std::vector<float>* x : {&pr.q16, &pr.k16, &pr.v16})
    for (float& e : *x) e = rwd::experiments::round_fp16(e);
  pr.ref16 = reference(t, pr.q16, pr.k16, pr.v16);
  return pr;
}

// FP16 outputs (and Ō / l before rounding) of both FP16 variants, (variant, B, T, D).
struct Fp16Out {
  std::vector<float> o, pre;
};

Fp16Out run_fp16(const Problem& pr, bool naive, int tile) {
  const size_t slice = static_cast<size_t>(pr.t) * kDim;
  Fp16Out r;
  r.o.resize(kNumFp16 * kBatch * slice);
  r.pre.resize(r.o.size());
#pragma omp parallel for schedule(static)
  for (int job = 0; job < kNumFp16 * kBatch; ++job) {
    const int var = job / kBatch, b = job % kBatch;
    rwd::experiments::Fp16Head h;
    h.t = pr.t;
    h.dim = kDim;
    h.alpha = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim)));
    h.q = &pr.q16[b * slice];
    h.k = &pr.k16[b * slice];
    h.v = &pr.v16[b * slice];
    float* o = &r.o[job * slice];
    float* pre = &r.pre[job * slice];
    if (naive)
      rwd::experiments::fp16_naive_forward(h, var == 1, o, pre);
    else
      rwd::experiments::fp16_flash_forward(h, tile, var == 1, o, pre);
  }
  return r;
}

// Errors of one FP16 variant against the FP16 inputs' reference.
Errors fp16_errors(const Problem& pr, const Fp16Out& r, int var) {
  const size_t n = static_cast<size_t>(kBatch) * pr.t * kDim, off = var * n;
  Errors e;
  double sum = 0, sum_pre = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = std::fabs(static_cast<double>(r.o[off + i]) - pr.ref16[i]);
    const double x_pre = std::fabs(static_cast<double>(r.pre[off + i]) - pr.ref16[i]);
    e.max_abs = std::max(e.max_abs, x);
    e.max_pre = std::max(e.max_pre, x_pre);
    sum += x;
    sum_pre += x_pre;
  }
  e.mean_abs = sum / n;
  e.mean_pre = sum_pre / n;
  return e;
}

// Runs every regime once (naive, or flash with square tiles `tile`); errors per column
// (the BF16/FP32 regimes of the kernel emulation, then the FP16 variants).
std::vector<Errors> measure(const Problem& pr, bool naive, int tile) {
  std::vector<k::HeadFlags> flags(kNumRegimes);
  for (int h = 0; h < kNumRegimes; ++h) {
    flags[h].s_bf16 = kRegimes[h].s_bf16;
    flags[h].acc_bf16 = kRegimes[h].acc_bf16;
    if (kRegimes[h].fp32)
      for (int op = 0; op < k::kNumOps; ++op) flags[h].prec[op] = k::Prec::kFp32;
  }
  k::AttentionParams p;
  p.batch = kBatch;
  p.heads = kNumRegimes;
  p.seq = pr.t;
  p.dim = kDim;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim)));
  p.causal = true;
  p.naive = naive;
  p.block_q = tile;
  p.block_k = tile;
  p.flags = flags.data();
  std::vector<float> o(pr.q.size()), o32(pr.q.size());
  std::vector<float> lse(static_cast<size_t>(kBatch) * kNumRegimes * pr.t);
  k::attention_forward_cpu(p, pr.q.data(), pr.k.data(), pr.v.data(), o.data(), lse.data(),
                           o32.data());
  const size_t slice = static_cast<size_t>(pr.t) * kDim;
  std::vector<Errors> out(kNumRegimes);
  for (int h = 0; h < kNumRegimes; ++h) {
    double sum = 0, sum_pre = 0;
    for (int b = 0; b < kBatch; ++b) {
      const size_t off = (static_cast<size_t>(b) * kNumRegimes + h) * slice;
      const double* rb = &pr.ref[b * slice];
      for (size_t i = 0; i < slice; ++i) {
        const double e = std::fabs(static_cast<double>(o[off + i]) - rb[i]);
        const double e_pre = std::fabs(static_cast<double>(o32[off + i]) - rb[i]);
        out[h].max_abs = std::max(out[h].max_abs, e);
        out[h].max_pre = std::max(out[h].max_pre, e_pre);
        sum += e;
        sum_pre += e_pre;
      }
    }
    out[h].mean_abs = sum / (kBatch * slice);
    out[h].mean_pre = sum_pre / (kBatch * slice);
  }
  const Fp16Out r16 = run_fp16(pr, naive, tile);
  for (int var = 0; var < kNumFp16; ++var) out.push_back(fp16_errors(pr, r16, var));
  return out;
}

const char* column_name(int c) {
  return c < kNumRegimes ? kRegimes[c].name : kFp16Names[c - kNumRegimes];
}

// Self-test: FP16 flash with one key tile (tile >= T) must equal FP16 naive bit for bit.
bool fp16_one_tile_matches_naive(const Problem& pr) {
  const Fp16Out naive = run_fp16(pr, true, 0), flash = run_fp16(pr, false, pr.t);
  return naive.o.size() == flash.o.size() &&
         std::memcmp(naive.o.data(), flash.o.data(), naive.o.size() * sizeof(float)) == 0 &&
         std::memcmp(naive.pre.data(), flash.pre.data(), naive.pre.size() * sizeof(float)) == 0;
}

void csv_rows(FILE* csv, const char* sweep, const Problem& pr, const char* impl, int tile,
              const std::vector<Errors>& e) {
  for (int h = 0; h < kNumCols; ++h)
    std::fprintf(csv, "%s,%g,%d,%s,%d,%s,%.6e,%.6e,%.6e,%.6e\n", sweep, pr.sigma, pr.t, impl,
                 tile, column_name(h), e[h].max_abs, e[h].mean_abs, e[h].max_pre, e[h].mean_pre);
}

void print_header(const char* first) {
  std::printf("  %-10s", first);
  for (int c = 0; c < kNumCols; ++c) std::printf(" %21s", column_name(c));
  std::printf("\n");
}

void print_row(const std::string& label, const std::vector<Errors>& e) {
  std::printf("  %-10s", label.c_str());
  for (const Errors& x : e) std::printf("   %8.2e / %8.2e", x.max_abs, x.mean_abs);
  std::printf("\n");
}

// Ratios flash / naive of the output's max and mean error, then of the pre-rounding mean error.
void print_ratio(const std::string& label, const std::vector<Errors>& flash,
                 const std::vector<Errors>& naive) {
  std::printf("  %-10s", label.c_str());
  for (int h = 0; h < kNumCols; ++h)
    std::printf("   %5.2f/%5.2f/%5.2f", flash[h].max_abs / naive[h].max_abs,
                flash[h].mean_abs / naive[h].mean_abs, flash[h].mean_pre / naive[h].mean_pre);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path = "flash_deviation.csv";
  int max_t = 2048;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (a == "--max-seq" && i + 1 < argc) {
      max_t = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: flash_deviation [--csv PATH] [--max-seq T (>= 128)]\n");
      return 2;
    }
  }
  if (max_t < 128) {
    std::fprintf(stderr, "flash_deviation: --max-seq must be >= 128\n");
    return 2;
  }
  const char* fp16_err = rwd::experiments::fp16_self_test();
  if (*fp16_err) {
    std::fprintf(stderr, "flash_deviation: FP16 rounding self-test failed: %s\n", fp16_err);
    return 1;
  }
  FILE* csv = std::fopen(csv_path.c_str(), "w");
  if (!csv) {
    std::fprintf(stderr, "flash_deviation: cannot write %s\n", csv_path.c_str());
    return 3;
  }
  std::fprintf(csv, "sweep,sigma,T,impl,tile,regime,max_abs_err,mean_abs_err,max_pre_round_err,"
                    "mean_pre_round_err\n");
  std::printf("flash vs naive |O - O_fp64| (max / mean), causal, D=%d, B=%d inputs, q,k ~ N(0,s^2),"
              " v ~ N(0,1), BF16-valued inputs.\n"
              "Paper (Golden et al.): flash ~10x the baseline's deviation at BF16, growing with T,"
              " shrinking with tile size.\nFP16 columns: inputs rounded to FP16, own FP64 reference;"
              " FP16 rounding self-test passed.\n",
              kDim, kBatch);
  const double kSigmas[] = {1.0, 3.0, 6.0};
  const int kTiles[] = {16, 32, 64, 128, 256};
  uint64_t seed = 7;
  for (double sigma : kSigmas) {
    const int t = std::min(1024, max_t);
    Problem pr = make_problem(t, sigma, seed++);
    if (!fp16_one_tile_matches_naive(pr)) {
      std::fprintf(stderr, "flash_deviation: FP16 flash with one tile differs from FP16 naive\n");
      std::fclose(csv);
      return 1;
    }
    std::printf("\n[tile sweep] T=%d, |q|,|k| scale s=%g\n", t, sigma);
    print_header("impl");
    std::vector<Errors> naive = measure(pr, true, 0);
    print_row("naive", naive);
    csv_rows(csv, "tile", pr, "naive", 0, naive);
    std::vector<std::vector<Errors>> flash;
    for (int tile : kTiles) {
      flash.push_back(measure(pr, false, tile));
      print_row("flash " + std::to_string(tile), flash.back());
      csv_rows(csv, "tile", pr, "flash", tile, flash.back());
    }
    std::printf("  ratio flash/naive (max / mean / mean before the final BF16/FP16 rounding of O):\n");
    for (size_t i = 0; i < flash.size(); ++i)
      print_ratio("tile " + std::to_string(kTiles[i]), flash[i], naive);
    std::printf("  self-test: FP16 flash with one %d-key tile == FP16 naive, bitwise (both variants)\n", t);
  }
  for (double sigma : kSigmas) {
    std::printf("\n[sequence sweep] tile 64, s=%g; rows: naive, flash, ratio (max/mean/mean pre-round)\n", sigma);
    print_header("T");
    for (int t = 128; t <= max_t; t *= 2) {
      Problem pr = make_problem(t, sigma, seed++);
      std::vector<Errors> naive = measure(pr, true, 0), flash = measure(pr, false, 64);
      print_row("naive " + std::to_string(t), naive);
      print_row("flash " + std::to_string(t), flash);
      print_ratio("ratio", flash, naive);
      csv_rows(csv, "seq", pr, "naive", 0, naive);
      csv_rows(csv, "seq", pr, "flash", 64, flash);
    }
  }
  std::fclose(csv);
  std::printf("\nCSV: %s\n", csv_path.c_str());
  return 0;
}
