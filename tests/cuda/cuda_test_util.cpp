// Test helpers for the CUDA attention kernels: device buffers, random inputs and runners for
// the GPU launchers, the CPU BF16 emulation and the FP64 reference.
#include "tests/cuda/cuda_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "kernels/attention_cpu.h"
#include "kernels/bf16.h"
#include "kernels/cuda/attention_cuda.h"

namespace rwd::kernels::test {

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

template <class T>
void upload(const DeviceBuffer& dst, const std::vector<T>& src) {
  check(cudaMemcpy(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice), "H2D");
}

template <class T>
std::vector<T> download(const DeviceBuffer& src, size_t n) {
  std::vector<T> out(n);
  check(cudaMemcpy(out.data(), src.get(), n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
  return out;
}

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = float_to_bf16_bits(x[i]);
  return out;
}

std::vector<float> from_bf16_bits(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_bits_to_float(x[i]);
  return out;
}

}  // namespace

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  check(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)), "cudaMalloc");
  // Poison: NaN bytes, so an unwritten output element fails every comparison.
  check(cudaMemset(ptr_, 0xff, std::max<size_t>(bytes, 16)), "cudaMemset");
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

Inputs make_inputs(int b, int h, int t, int d, bool causal, float peak, uint64_t seed) {
  Inputs in;
  in.p.batch = b;
  in.p.heads = h;
  in.p.seq = t;
  in.p.dim = d;
  in.p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  in.p.causal = causal;
  in.p.block_q = 64;
  in.p.block_k = 64;
  in.flags.assign(static_cast<size_t>(h), HeadFlags{});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(b) * h * t * d;
  for (auto* x : {&in.q, &in.k, &in.v, &in.d_o}) {
    x->resize(n);
    for (float& e : *x) e = normal(rng);
  }
  for (size_t i = 0; i < n; ++i) {
    in.q[i] *= peak;
    in.k[i] *= peak;
  }
  return in;
}

Outputs run_gpu(const Inputs& in, bool backward, bool stats_on, bool simt_fp32, int ds_dq) {
  const AttentionParams& p = in.p;
  const size_t n = in.q.size(), rows = static_cast<size_t>(p.batch) * p.heads * p.seq;
  DeviceBuffer q(n * 2), k(n * 2), v(n * 2), d_o(n * 2), o(n * 2);
  DeviceBuffer q32(n * 4), k32(n * 4), v32(n * 4), o32(n * 4), do32(n * 4), lse(rows * 4),
      delta(rows * 4);
  DeviceBuffer dq(n * 4), dk(n * 4), dv(n * 4);
  DeviceBuffer flags(in.flags.size() * sizeof(HeadFlags)), stats(p.heads * sizeof(HeadStats));
  upload(q, to_bf16_bits(in.q));
  upload(k, to_bf16_bits(in.k));
  upload(v, to_bf16_bits(in.v));
  upload(d_o, to_bf16_bits(in.d_o));
  upload(q32, in.q);
  upload(k32, in.k);
  upload(v32, in.v);
  upload(do32, in.d_o);
  upload(flags, in.flags);
  upload(stats, std::vector<HeadStats>(static_cast<size_t>(p.heads)));

  AttentionParams gp = p;
  gp.flags = flags.as<HeadFlags>();
  gp.stats = stats_on ? stats.as<HeadStats>() : nullptr;
  cuda::ForwardArgs fa;
  fa.q = q.as<uint16_t>();
  fa.k = k.as<uint16_t>();
  fa.v = v.as<uint16_t>();
  fa.q_f32 = q32.as<float>();
  fa.k_f32 = k32.as<float>();
  fa.v_f32 = v32.as<float>();
  fa.o = o.as<uint16_t>();
  fa.o_f32 = o32.as<float>();
  fa.lse = lse.as<float>();
  fa.stats = gp.stats;
  fa.simt_fp32 = simt_fp32;
  DeviceBuffer fwd_ws(cuda::forward_workspace_bytes(gp, in.flags.data()));
  fa.workspace = fwd_ws.get();
  Outputs out;
  out.fwd_status = cuda::attention_forward(gp, fa, nullptr);
  if (out.fwd_status != 0) return out;
  check(cudaDeviceSynchronize(), "forward");
  out.o = from_bf16_bits(download<uint16_t>(o, n));
  out.o32 = download<float>(o32, n);
  out.lse = download<float>(lse, rows);
  out.stats = download<HeadStats>(stats, static_cast<size_t>(p.heads));
  if (!backward) return out;

  cuda::BackwardArgs ba = cuda::backward_args_of(fa);
  ba.d_o = d_o.as<uint16_t>();
  ba.d_o_f32 = do32.as<float>();
  ba.delta = delta.as<float>();
  ba.dq = dq.as<float>();
  ba.dk = dk.as<float>();
  ba.dv = dv.as<float>();
  ba.ds_dq = ds_dq;
  DeviceBuffer ws(cuda::backward_workspace_bytes(gp, in.flags.data(), ds_dq));
  ba.workspace = ws.get();
  out.bwd_status = cuda::attention_backward(gp, ba, nullptr);
  if (out.bwd_status != 0) return out;
  check(cudaDeviceSynchronize(), "backward");
  out.dq = download<float>(dq, n);
  out.dk = download<float>(dk, n);
  out.dv = download<float>(dv, n);
  out.delta = download<float>(delta, rows);
  return out;
}

Outputs run_cpu(const Inputs& in, bool backward) {
  AttentionParams p = in.p;
  p.flags = in.flags.data();
  const size_t n = in.q.size(), rows = static_cast<size_t>(p.batch) * p.heads * p.seq;
  Outputs out;
  out.stats.assign(static_cast<size_t>(p.heads), HeadStats{});
  p.stats = out.stats.data();
  out.o.resize(n);
  out.o32.resize(n);
  out.lse.resize(rows);
  attention_forward_cpu(p, in.q.data(), in.k.data(), in.v.data(), out.o.data(), out.lse.data(),
                        out.o32.data());
  if (!backward) return out;
  // Both see the unrounded dO (the GPU also gets its BF16 copy): low heads round it, bwd=fp32
  // and delta=fp32 heads read it as it is.
  const std::vector<float>& d_o = in.d_o;
  out.dq.resize(n);
  out.dk.resize(n);
  out.dv.resize(n);
  out.delta.resize(rows);
  attention_backward_cpu(p, in.q.data(), in.k.data(), in.v.data(), out.o.data(), out.o32.data(),
                         d_o.data(), out.lse.data(), out.dq.data(), out.dk.data(), out.dv.data(),
                         out.delta.data());
  return out;
}

Outputs run_reference(const Inputs& in, bool round_inputs) {
  const AttentionParams& p = in.p;
  const size_t n = in.q.size(), rows = static_cast<size_t>(p.batch) * p.heads * p.seq;
  auto widen = [&](const std::vector<float>& x) {
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = round_inputs ? bf16_round(x[i]) : x[i];
    return y;
  };
  const std::vector<double> q = widen(in.q), k = widen(in.k), v = widen(in.v);
  std::vector<double> d_o(n);
  for (size_t i = 0; i < n; ++i) d_o[i] = round_inputs ? bf16_round(in.d_o[i]) : in.d_o[i];
  std::vector<double> o(n), lse(rows), dq(n), dk(n), dv(n);
  attention_reference_forward(p, q.data(), k.data(), v.data(), o.data(), lse.data());
  attention_reference_backward(p, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(),
                               dq.data(), dk.data(), dv.data());
  auto narrow = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  Outputs out;
  out.o = narrow(o);
  out.o32 = out.o;
  out.lse = narrow(lse);
  out.dq = narrow(dq);
  out.dk = narrow(dk);
  out.dv = narrow(dv);
  return out;
}

float bf16_round(float x) { return round_bf16(x); }

std::vector<float> bf16_round(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = round_bf16(x[i]);
  return y;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, const Inputs& in,
                    int per_row, int head) {
  const size_t per_head = static_cast<size_t>(in.p.seq) * per_row;
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (head >= 0 && static_cast<int>((i / per_head) % in.p.heads) != head) continue;
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return d;  // an unwritten (poisoned) or NaN element fails at once
    m = std::max(m, d);
  }
  return m;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b, const Inputs& in, int per_row,
               int head) {
  const size_t per_head = static_cast<size_t>(in.p.seq) * per_row;
  for (size_t i = 0; i < a.size(); ++i) {
    if (static_cast<int>((i / per_head) % in.p.heads) != head) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += std::fabs(static_cast<double>(a[i]) - b[i]);
  return s / static_cast<double>(a.size());
}

double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

void expect_agree(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                  const char* what, size_t slack) {
  ASSERT_EQ(gpu.size(), cpu.size());
  const double scale = max_abs(cpu);
  size_t bad = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double tol = rel * std::fabs(cpu[i]) + 1e-3 * scale + 1e-6;
    const double diff = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    ASSERT_TRUE(std::isfinite(diff)) << what << " element " << i;
    if (!(diff <= tol)) ++bad;
  }
  // A logit that lands on a BF16 rounding boundary (s_bf16, acc_bf16) may round the other way
  // under a different FP32 summation order; allow such isolated flips (1 in 500), nothing more.
  EXPECT_LE(bad, gpu.size() / 500 + slack) << what << ": " << bad << " of " << gpu.size() << " differ";
}

void expect_outputs_agree(const Outputs& gpu, const Outputs& cpu, int d, size_t slack_rows) {
  const size_t row = slack_rows, elems = slack_rows * static_cast<size_t>(d);
  expect_agree(gpu.o, bf16_round(cpu.o), 2.0 / 128, "O", elems);
  expect_agree(gpu.lse, cpu.lse, 1e-5, "LSE", row);
  expect_agree(gpu.delta, cpu.delta, 1e-3, "delta", row);
  expect_agree(bf16_round(gpu.dq), bf16_round(cpu.dq), 2.0 / 128, "dQ", elems);
  expect_agree(bf16_round(gpu.dk), bf16_round(cpu.dk), 2.0 / 128, "dK", elems);
  expect_agree(bf16_round(gpu.dv), bf16_round(cpu.dv), 2.0 / 128, "dV", elems);
}

}  // namespace rwd::kernels::test
