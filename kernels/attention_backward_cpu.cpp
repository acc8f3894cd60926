// BF16 flash-attention backward emulation on the CPU: delta pre-pass, then FA2 order (key
// tiles outer, query tiles inner) recomputing P = exp(S - LSE); per-head precision flags.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention_cpu.h"
#include "kernels/emulation_common.h"

namespace rwd::kernels {
namespace {

using detail::is;

// P = exp(S - LSE) for one row of n unmasked keys; double exp under softmax=fp32.
void recompute_p(const HeadFlags& f, const float* s, int n, float lse, float* p) {
  if (is(f, Op::kSoftmax, Prec::kFp32)) {
    for (int j = 0; j < n; ++j) p[j] = static_cast<float>(std::exp(static_cast<double>(s[j]) - lse));
  } else {
    for (int j = 0; j < n; ++j) p[j] = std::exp(s[j] - lse);
  }
}

// The backward operands of one (b, h).
struct HeadBackward {
  detail::ScoreOperands so;  // S recompute operands, rounded exactly as in the forward
  std::vector<float> qg, kg; // (T, D) matmul operands for dK = dS^T Q, dQ = dS K
  std::vector<float> vt;     // (D, T) operand of dP = dO V^T
  std::vector<float> dog;    // (T, D) dO operand
};

// delta for every row of one head (written to delta_out, (T)).
void compute_delta(const AttentionParams& p, const HeadFlags& f, const HeadBackward& hb,
                   const float* v, const float* o, const float* o_f32, const float* d_o,
                   const float* lse, float* delta_out) {
  const int t = p.seq, d_dim = p.dim;
  const bool d64 = is(f, Op::kDelta, Prec::kFp32);
  const float c = is(f, Op::kDelta, Prec::kFault) ? detail::fault_c(f, Op::kDelta) : 0.0f;
  std::vector<float> s(t), pr(t);
  for (int r = 0; r < t; ++r) {
    const size_t ro = static_cast<size_t>(r) * d_dim;
    double sum = 0.0, abs_sum = 0.0;
    if (!f.delta_dpp) {
      // rowsum(dO * O): O as the forward output (BF16, or FP32 for o=fp32), dO as the
      // backward operand; delta=fp32 uses unrounded dO and unrounded O in double.
      if (d64) {
        for (int d = 0; d < d_dim; ++d) sum += static_cast<double>(d_o[ro + d]) * o_f32[ro + d];
      } else {
        float acc = 0.0f, abs_acc = 0.0f;
        for (int d = 0; d < d_dim; ++d) {
          const float x = hb.dog[ro + d] * o[ro + d];
          acc += x;
          abs_acc += std::fabs(x);
        }
        sum = acc;
        abs_sum = abs_acc;
      }
    } else {
      // rowsum(dP * P) over the unmasked keys of the row, P recomputed from LSE.
      const int n = detail::unmasked(hb.so, r, 0, t);
      detail::compute_scores(hb.so, r, r + 1, 0, t, s.data(), t);
      recompute_p(f, s.data(), n, lse[r], pr.data());
      float acc = 0.0f, abs_acc = 0.0f;
      for (int j = 0; j < n; ++j) {
        if (d64) {
          double dp = 0.0;
          for (int d = 0; d < d_dim; ++d)
            dp += static_cast<double>(d_o[ro + d]) * v[static_cast<size_t>(j) * d_dim + d];
          sum += dp * std::exp(static_cast<double>(s[j]) - lse[r]);
        } else {
          float dp = 0.0f;
          for (int d = 0; d < d_dim; ++d) dp += hb.dog[ro + d] * hb.vt[static_cast<size_t>(d) * t + j];
          acc += dp * pr[j];
          abs_acc += std::fabs(dp * pr[j]);
        }
      }
      if (!d64) {
        sum = acc;
        abs_sum = abs_acc;
      }
    }
    delta_out[r] = static_cast<float>(sum) + c * static_cast<float>(abs_sum);
  }
}

void backward_head(const AttentionParams& p, int b, int h, const float* q, const float* k,
                   const float* v, const float* o, const float* o_f32, const float* d_o,
                   const float* lse, float* dq, float* dk, float* dv, float* delta) {
  const int t = p.seq, d_dim = p.dim;
  const size_t off = (static_cast<size_t>(b) * p.heads + h) * t * d_dim;
  const size_t off_row = (static_cast<size_t>(b) * p.heads + h) * t;
  const HeadFlags& f = p.flags[h];
  const bool b32 = is(f, Op::kBwd, Prec::kFp32);
  HeadBackward hb;
  hb.so = detail::load_score_operands(p, f, b, h, q + off, k + off);
  const uint64_t sr_pv = sr_stream(p.sr_key, SrSite::kPv, b, h);  // pv=sr: the forward's P̄ bits
  if (b32) {
    hb.qg.assign(q + off, q + off + static_cast<size_t>(t) * d_dim);
    hb.kg.assign(k + off, k + off + static_cast<size_t>(t) * d_dim);
  } else {
    hb.qg = hb.so.q;
    hb.kg = detail::transpose(hb.so.kt, d_dim, t);
  }
  std::vector<float> vg;
  detail::load_rounded(v + off, t, d_dim, b32 || is(f, Op::kPv, Prec::kFp32), vg);
  hb.vt = detail::transpose(vg, t, d_dim);
  detail::load_rounded(d_o + off, t, d_dim, b32, hb.dog);

  float* delta_h = delta + off_row;
  const float* lse_h = lse + off_row;
  compute_delta(p, f, hb, v + off, o + off, o_f32 ? o_f32 + off : nullptr, d_o + off, lse_h, delta_h);

  std::vector<float> dq_acc(static_cast<size_t>(t) * d_dim, 0.0f);
  std::vector<float> dk_acc(dq_acc.size(), 0.0f), dv_acc(dq_acc.size(), 0.0f);
  const int bq = p.naive ? t : detail::tile_size(p.block_q, t);
  const int bk = p.naive ? t : detail::tile_size(p.block_k, t);
  std::vector<float> s(static_cast<size_t>(bq) * bk), pr(bk), ds(bk), pround(bk);
  for (int j0 = 0; j0 < t; j0 += bk) {
    const int j1 = std::min(t, j0 + bk);
    const int i_start = p.causal ? (j0 / bq) * bq : 0;  // earlier query tiles are masked
    for (int i0 = i_start; i0 < t; i0 += bq) {
      const int i1 = std::min(t, i0 + bq);
      detail::compute_scores(hb.so, i0, i1, j0, j1, s.data(), bk);
      for (int r = i0; r < i1; ++r) {
        const int n = detail::unmasked(hb.so, r, j0, j1);
        if (n == 0) continue;
        const size_t ro = static_cast<size_t>(r) * d_dim;
        recompute_p(f, s.data() + static_cast<size_t>(r - i0) * bk, n, lse_h[r], pr.data());
        // dV_c += bf16(P_rc) dO_r  (rows ascending per key); pv=sr rounds P with the bits the
        // forward's P̄ of (r, c) drew.
        const uint32_t pv_rw = f.pv_sr ? sr_row_word(sr_pv, r) : 0;
        for (int j = 0; j < n; ++j) {
          const uint32_t col = static_cast<uint32_t>(j0 + j);
          const float pj = b32       ? pr[j]
                         : f.pv_sr ? round_bf16_sr(pr[j], sr_bits_in_row(sr_pv, pv_rw, col))
                                   : round_bf16(pr[j]);
          float* dvr = dv_acc.data() + static_cast<size_t>(j0 + j) * d_dim;
          for (int d = 0; d < d_dim; ++d) dvr[d] += pj * hb.dog[ro + d];
        }
        // dP_rc = sum_d dO_rd V_cd (FP32, d ascending), dS = P (dP - delta), rounded to BF16.
        for (int j = 0; j < n; ++j) ds[j] = 0.0f;
        for (int d = 0; d < d_dim; ++d) {
          const float g = hb.dog[ro + d];
          const float* vd = hb.vt.data() + static_cast<size_t>(d) * t + j0;
          for (int j = 0; j < n; ++j) ds[j] += g * vd[j];
        }
        for (int j = 0; j < n; ++j) {
          const float x = pr[j] * (ds[j] - delta_h[r]);
          ds[j] = b32 ? x : round_bf16(x);
        }
        // dQ_r += dS_rc K_c (keys ascending); dK_c += dS_rc Q_r (rows ascending).
        float* dqr = dq_acc.data() + ro;
        for (int j = 0; j < n; ++j) {
          const float g = ds[j];
          const float* kr = hb.kg.data() + static_cast<size_t>(j0 + j) * d_dim;
          for (int d = 0; d < d_dim; ++d) dqr[d] += g * kr[d];
          float* dkr = dk_acc.data() + static_cast<size_t>(j0 + j) * d_dim;
          const float* qr = hb.qg.data() + ro;
          for (int d = 0; d < d_dim; ++d) dkr[d] += g * qr[d];
        }
      }
    }
  }
  // alpha applied once at the end (FA2 scales dQ, dK by softmax_scale on write-out).
  for (size_t i = 0; i < dq_acc.size(); ++i) {
    const float a = p.scale * dq_acc[i], bb = p.scale * dk_acc[i], c = dv_acc[i];
    dq[off + i] = b32 ? a : round_bf16(a);
    dk[off + i] = b32 ? bb : round_bf16(bb);
    dv[off + i] = b32 ? c : round_bf16(c);
  }
}

}  // namespace

void attention_backward_cpu(const AttentionParams& p, const float* q, const float* k,
                            const float* v, const float* o, const float* o_f32,
                            const float* d_o, const float* lse, float* dq, float* dk, float* dv,
                            float* delta) {
  check_params(p);
  for (int h = 0; h < p.heads; ++h)
    if (!o_f32 && is(p.flags[h], Op::kDelta, Prec::kFp32))
      throw KernelError("head " + std::to_string(h) + " has delta=fp32 but no FP32 O was given");
  detail::for_each_head(p, [&](int b, int h) {
    backward_head(p, b, h, q, k, v, o, o_f32, d_o, lse, dq, dk, dv, delta);
  });
}

}  // namespace rwd::kernels
