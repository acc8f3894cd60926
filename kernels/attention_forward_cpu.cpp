// BF16 flash-attention forward emulation on the CPU (docs/design.md): online softmax over key
// tiles, per-head precision flags, the stabilized softmax with its guard, and the monitors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_cpu.h"
#include "kernels/emulation_common.h"
#include "kernels/stable_softmax.h"

namespace rwd::kernels {
namespace {

using detail::is;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Running state of one query row across key tiles.
struct RowState {
  float m = kNegInf;       // running max (FP32: it is always a logit or a stable shift of one)
  double l = 0.0;          // running sum; holds an FP32 value unless softmax=fp32
  std::vector<float> acc;  // Ō (D), FP32 accumulator
  float gmax = kNegInf;    // monitor: the row's global max logit so far ...
  int64_t gcount = 0;      // ... and how often it occurred
  int64_t pbar_one = 0;    // monitor: entries with bf16(P̄) == 1
};

// One (b, h): the rounded V operand, the head's flags and a local copy of the monitors.
struct HeadForward {
  const detail::ScoreOperands* so;
  const HeadFlags* f;
  std::vector<float> v;    // (T, D), rounded unless pv=fp32
  HeadStats stats;
  std::vector<double> pbar;  // scratch, one tile row
  std::vector<float> pv;     // scratch, the PV operand of one tile row
  uint64_t sr_pv = 0, sr_acc = 0;  // pv=sr, acc=sr: the streams of their random bits
};

// acc=sr: Ō and l of row r rounded stochastically after the key tile starting at key c0 (the
// tile index of the stochastic_round.h columns: tiles are kSrAccTile keys, or one).
void round_acc_sr(const HeadForward& hf, RowState& st, int r, int c0) {
  const uint32_t rw = sr_row_word(hf.sr_acc, r);
  const uint32_t col0 = static_cast<uint32_t>(c0 / kSrAccTile) * kSrAccStride;
  auto bits = [&](uint32_t col) { return sr_bits_in_row(hf.sr_acc, rw, col); };
  for (int d = 0; d < hf.so->dim; ++d) st.acc[d] = round_bf16_sr(st.acc[d], bits(col0 + static_cast<uint32_t>(d)));
  st.l = round_bf16_sr(static_cast<float>(st.l), bits(col0 + kSrAccL));
}

// Merges one tile row s[0..n) (keys c0..c0+n) of query row r into the row state.
void process_row_tile(HeadForward& hf, RowState& st, const float* s, int n, int r, int c0) {
  const HeadFlags& f = *hf.f;
  const int d_dim = hf.so->dim;
  float r_m = kNegInf;
  for (int j = 0; j < n; ++j) r_m = std::max(r_m, s[j]);
  hf.stats.max_logit = std::max(hf.stats.max_logit, r_m);
  int64_t ties = 0;
  for (int j = 0; j < n; ++j) ties += (s[j] == r_m);
  if (r_m > st.gmax) {
    st.gmax = r_m;
    st.gcount = ties;
  } else if (r_m == st.gmax) {
    st.gcount += ties;
  }

  float m_tile = r_m;
  if (f.stable) {
    int64_t r_s = 0;
    for (int j = 0; j < n; ++j) r_s += (s[j] >= r_m - f.eps);
    StableShift sh = stable_shift<float>(r_m, r_s, f.beta);
    m_tile = sh.m;
    hf.stats.stable_pos += sh.pos;
    hf.stats.stable_neg += sh.neg;
    hf.stats.stable_guard += sh.guard;
  }
  const float m_old = st.m;
  const float m_new = std::max(m_old, m_tile);
  st.m = m_new;

  // P̄ and the rescale factor: FP32 expf by default, double exp for softmax=fp32.
  const bool sm64 = is(f, Op::kSoftmax, Prec::kFp32);
  hf.pbar.resize(n);
  double scale;
  if (sm64) {
    scale = m_old == kNegInf ? 0.0 : std::exp(static_cast<double>(m_old) - m_new);
    for (int j = 0; j < n; ++j) hf.pbar[j] = std::exp(static_cast<double>(s[j]) - m_new);
  } else {
    scale = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
    for (int j = 0; j < n; ++j) hf.pbar[j] = std::exp(s[j] - m_new);
  }
  if (is(f, Op::kSoftmax, Prec::kFault)) {
    const float keep = 1.0f - detail::fault_c(f, Op::kSoftmax);
    for (int j = 0; j < n; ++j)
      if (hf.pbar[j] < 1.0) hf.pbar[j] = static_cast<float>(hf.pbar[j]) * keep;
  }
  for (int j = 0; j < n; ++j) st.pbar_one += (round_bf16(static_cast<float>(hf.pbar[j])) == 1.0f);

  if (sm64) {
    double sum = 0.0;
    for (int j = 0; j < n; ++j) sum += hf.pbar[j];
    st.l = scale * st.l + sum;
  } else {
    float lf = static_cast<float>(scale) * static_cast<float>(st.l);
    for (int j = 0; j < n; ++j) lf += static_cast<float>(hf.pbar[j]);
    st.l = lf;
  }

  // The PV operand: bf16(P̄) (tensor-core input), biased for the pv fault, FP32 for pv=fp32;
  // pv=sr rounds it stochastically with the bits of (r, key).
  hf.pv.resize(n);
  const bool pv32 = is(f, Op::kPv, Prec::kFp32);
  const float pv_bias = is(f, Op::kPv, Prec::kFault) ? 1.0f + detail::fault_c(f, Op::kPv) : 1.0f;
  const uint32_t pv_rw = f.pv_sr ? sr_row_word(hf.sr_pv, r) : 0;
  for (int j = 0; j < n; ++j) {
    const float x = static_cast<float>(hf.pbar[j]);
    const uint32_t col = static_cast<uint32_t>(c0 + j);
    hf.pv[j] = pv32      ? x
             : f.pv_sr ? round_bf16_sr(x * pv_bias, sr_bits_in_row(hf.sr_pv, pv_rw, col))
                       : round_bf16(x * pv_bias);
  }
  // Ō = scale * Ō, then keys ascending: Ō += P_c V_c (FP32; products of BF16 values exact).
  const float sc = static_cast<float>(scale);
  float* acc = st.acc.data();
  for (int d = 0; d < d_dim; ++d) acc[d] *= sc;
  for (int j = 0; j < n; ++j) {
    const float pj = hf.pv[j];
    const float* vr = hf.v.data() + static_cast<size_t>(c0 + j) * d_dim;
    for (int d = 0; d < d_dim; ++d) acc[d] += pj * vr[d];
  }
  if (f.acc_bf16) {
    for (int d = 0; d < d_dim; ++d) acc[d] = round_bf16(acc[d]);
    st.l = round_bf16(static_cast<float>(st.l));
  }
  if (f.acc_sr) round_acc_sr(hf, st, r, c0);
}

// O = Ō / l with the o op's rounding, LSE = m + log l; o_f32 receives Ō / l unrounded.
void finish_row(HeadForward& hf, RowState& st, float* o, float* o_f32, float* lse) {
  const HeadFlags& f = *hf.f;
  const int d_dim = hf.so->dim;
  const bool sm64 = is(f, Op::kSoftmax, Prec::kFp32);
  for (int d = 0; d < d_dim; ++d) {
    const float x = sm64 ? static_cast<float>(st.acc[d] / st.l) : st.acc[d] / static_cast<float>(st.l);
    if (o_f32) o_f32[d] = x;
    if (is(f, Op::kO, Prec::kFp32)) {
      o[d] = x;
    } else if (is(f, Op::kO, Prec::kFault)) {
      o[d] = round_bf16_down(x - f.fault[static_cast<int>(Op::kO)] * bf16_ulp(x));
    } else {
      o[d] = round_bf16(x);
    }
  }
  *lse = sm64 ? static_cast<float>(st.m + std::log(st.l))
              : st.m + std::log(static_cast<float>(st.l));
  hf.stats.rows += 1;
  hf.stats.repeated_max_rows += (st.gcount > 1);
  hf.stats.pbar_one += std::max<int64_t>(0, st.pbar_one - 1);
}

void forward_head(const AttentionParams& p, int b, int h, const float* q, const float* k,
                  const float* v, float* o, float* lse, float* o_f32, HeadStats* out_stats) {
  const int t = p.seq, d_dim = p.dim;
  const size_t off = (static_cast<size_t>(b) * p.heads + h) * t * d_dim;
  const size_t off_row = (static_cast<size_t>(b) * p.heads + h) * t;
  const HeadFlags& f = p.flags[h];
  detail::ScoreOperands so = detail::load_score_operands(p, f, b, h, q + off, k + off);
  HeadForward hf{&so, &f, {}, HeadStats{}, {}, {}, sr_stream(p.sr_key, SrSite::kPv, b, h),
                 sr_stream(p.sr_key, SrSite::kAcc, b, h)};
  detail::load_rounded(v + off, t, d_dim, is(f, Op::kPv, Prec::kFp32), hf.v);

  // Naive: one query tile and one key tile, i.e. S materialized for the whole (T, T) block.
  // acc=sr rounds after each of the GPU's 64-key tiles (kSrAccTile) whatever the plan's key
  // tile, so its bits are keyed by that tile's index; tiling off keeps one tile.
  const int bq = p.naive ? t : detail::tile_size(p.block_q, t);
  const int bk = p.naive ? t : detail::tile_size(f.acc_sr && detail::tile_size(p.block_k, t) < t ? kSrAccTile : p.block_k, t);
  std::vector<float> s(static_cast<size_t>(bq) * bk);
  std::vector<RowState> rows(bq);
  for (int i0 = 0; i0 < t; i0 += bq) {
    const int i1 = std::min(t, i0 + bq);
    for (auto& st : rows) st = RowState{kNegInf, 0.0, std::vector<float>(d_dim, 0.0f)};
    const int key_end = p.causal ? i1 : t;  // key tiles past the last row are fully masked
    for (int j0 = 0; j0 < key_end; j0 += bk) {
      const int j1 = std::min(t, j0 + bk);
      detail::compute_scores(so, i0, i1, j0, j1, s.data(), bk);
      for (int r = i0; r < i1; ++r) {
        const int n = detail::unmasked(so, r, j0, j1);
        if (n > 0) process_row_tile(hf, rows[r - i0], s.data() + static_cast<size_t>(r - i0) * bk, n, r, j0);
      }
    }
    for (int r = i0; r < i1; ++r)
      finish_row(hf, rows[r - i0], o + off + static_cast<size_t>(r) * d_dim,
                 o_f32 ? o_f32 + off + static_cast<size_t>(r) * d_dim : nullptr, lse + off_row + r);
  }
  if (out_stats) *out_stats = hf.stats;
}

void merge_stats(HeadStats& into, const HeadStats& s) {
  into.max_logit = std::max(into.max_logit, s.max_logit);
  into.rows += s.rows;
  into.repeated_max_rows += s.repeated_max_rows;
  into.pbar_one += s.pbar_one;
  into.stable_pos += s.stable_pos;
  into.stable_neg += s.stable_neg;
  into.stable_guard += s.stable_guard;
}

}  // namespace

void check_params(const AttentionParams& p) {
  if (p.batch <= 0 || p.heads <= 0 || p.seq <= 0 || p.dim <= 0)
    throw KernelError("attention shape must be positive, got B=" + std::to_string(p.batch) +
                      " H=" + std::to_string(p.heads) + " T=" + std::to_string(p.seq) +
                      " D=" + std::to_string(p.dim));
  if (!p.flags) throw KernelError("AttentionParams.flags must point to one HeadFlags per head");
  if (!std::isfinite(p.scale)) throw KernelError("attention scale must be finite");
}

void attention_forward_cpu(const AttentionParams& p, const float* q, const float* k,
                           const float* v, float* o, float* lse, float* o_f32) {
  check_params(p);
  std::vector<HeadStats> local(p.stats ? static_cast<size_t>(p.batch) * p.heads : 0);
  detail::for_each_head(p, [&](int b, int h) {
    forward_head(p, b, h, q, k, v, o, lse, o_f32,
                 p.stats ? &local[static_cast<size_t>(b) * p.heads + h] : nullptr);
  });
  if (!p.stats) return;
  for (int h = 0; h < p.heads; ++h) p.stats[h] = HeadStats{};
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) merge_stats(p.stats[h], local[static_cast<size_t>(b) * p.heads + h]);
}

}  // namespace rwd::kernels
