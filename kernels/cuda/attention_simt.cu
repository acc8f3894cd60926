// FP32-operand (SIMT) attention kernels: one row per thread, plain FP32 FMAs, the same rounding
// points as the tensor-core kernels. They are the reference for FP32 heads (simt_fp32: tests
// and cuda_bench's baseline; FP32 heads otherwise take the split-BF16 tensor-core variants),
// serve heads with a delta fault or delta=fp32 with delta=dpp, and every head when tiling is
// off (a full pass over the keys finds the row max first).
//
// Operand choices per head (docs/design.md):
//   S operands      Q, K      : q_f32/k_f32 when qk=fp32, else BF16 values
//   P̄V              P, V      : P̄ and v_f32 when pv=fp32, else bf16(P̄) (pv fault) and BF16 V
//   sr flags        S, P̄ (and P of dV), Ō and l rounded stochastically with the CPU twin's bits
//                   (kernels/stochastic_round.h); with tiling off Ō and l are rounded after
//                   every 64 keys, as acc=bf16 is here (the CPU twin rounds its one tile once)
//   softmax=fp32    exp, l, rescale and LSE in double; backward P from a double exp
//   backward        dV += P^T dO with P unrounded when bwd is fp32, else bf16(P);
//                   dP = dO V^T with v_f32 when pv or bwd is fp32;
//                   dQ += dS K, dK += dS^T Q with dS unrounded and q_f32/k_f32 when bwd=fp32
//                   (Q, K are also FP32 when qk=fp32), else bf16(dS) and the S operands.
// Summation over keys is sequential per row (the order of the CPU emulation); each thread owns
// its outputs, so the kernels are deterministic.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_sr.cuh"

namespace rwd::kernels::cuda {

namespace {

// Row stride of every FP32 smem tile: D + 4 floats keeps rows 16-byte aligned for float4
// loads, and a warp's float4 loads of 32 different rows hit distinct banks in each quarter
// (stride = 4 mod 32 words). Rows are read whole, 4 columns at a time, in column order: the
// FP32 operations and their order are unchanged by the vector width.
template <int D>
constexpr int kSimtStride = D + 4;

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// Cooperative load of rows [row0, row0 + n) of a (T, D) matrix into FP32 smem (stride
// kSimtStride); rows >= T become 0. FP32 source when asked and present.
template <int D>
__device__ void load_rows(float* dst, const uint16_t* b16, const float* f32, bool use_f32,
                          size_t base, int row0, int n, int T) {
  for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
    const int r = i / D, d = i % D, row = row0 + r;
    float x = 0.0f;
    if (row < T) {
      const size_t off = base + static_cast<size_t>(row) * D + d;
      x = (use_f32 && f32 != nullptr) ? f32[off] : bf16_bits_to_float(b16[off]);
    }
    dst[r * kSimtStride<D> + d] = x;
  }
}

template <int D>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  float acc = 0.0f;
#pragma unroll
  for (int d = 0; d < D; d += 4) {
    const float4 x = ld4(a + d), y = ld4(b + d);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
    acc = fmaf(x.z, y.z, acc);
    acc = fmaf(x.w, y.w, acc);
  }
  return acc;
}

// acc[0..D) += p * row[0..D) (acc a register array when fully unrolled, or a smem row).
template <int D>
__device__ __forceinline__ void axpy_row(float p, const float* row, float* acc) {
#pragma unroll
  for (int d = 0; d < D; d += 4) {
    const float4 x = ld4(row + d);
    acc[d] = fmaf(p, x.x, acc[d]);
    acc[d + 1] = fmaf(p, x.y, acc[d + 1]);
    acc[d + 2] = fmaf(p, x.z, acc[d + 2]);
    acc[d + 3] = fmaf(p, x.w, acc[d + 3]);
  }
}
template <int D>
__device__ __forceinline__ void axpy_smem_row(float p, const float* row, float* acc) {
#pragma unroll 8
  for (int d = 0; d < D; d += 4) {
    const float4 x = ld4(row + d);
    float4 y = ld4(acc + d);
    y.x = fmaf(p, x.x, y.x);
    y.y = fmaf(p, x.y, y.y);
    y.z = fmaf(p, x.z, y.z);
    y.w = fmaf(p, x.w, y.w);
    st4(acc + d, y);
  }
}

// S = alpha q.k with the qk fault and rounding (sbf16, or qk=sr with the bits of (row, col) of
// the qk stream).
template <int D>
__device__ __forceinline__ float finish_dot(const float* q_row, const float* k_row, int row, int col,
                                            const KernelArgs& a, const FlagView& f, uint64_t qk_stream) {
  const float x = finish_score(dot_row<D>(q_row, k_row), a.scale, f);
  return f.s_sr ? round_bf16_sr(x, sr_element_bits(qk_stream, row, static_cast<uint32_t>(col))) : x;
}

// S for one query row against key `col` (both rows in smem), scaled, rounded, masked.
template <int D>
__device__ __forceinline__ float score(const float* q_row, const float* k_row, int row, int col,
                                       const KernelArgs& a, const FlagView& f, uint64_t qk_stream) {
  if (col >= a.seq || (a.causal && col > row)) return -INFINITY;
  return finish_dot<D>(q_row, k_row, row, col, a, f, qk_stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CUDA kernels

// Grid (ceil(T/R), B*H), R threads, thread t owns query row q0 + t.
template <int D, int R>
__global__ void __launch_bounds__(R) simt_forward_kernel(KernelArgs a, bool all_heads) {
  constexpr int kS = kSimtStride<D>, kSimtRows = R;
  const int bh = blockIdx.y, h = bh % a.heads, q0 = blockIdx.x * kSimtRows, T = a.seq;
  if (!all_heads && forward_variant(a.flags[h], false, a.simt_fp32) >= 0) return;  // a tensor-core head
  const FlagView f = decode_flags(a.flags[h]);
  const SrStreams sr = sr_streams(a.sr_key, bh, a.heads);
  extern __shared__ __align__(16) float fsm[];
  float* s_q = fsm;                       // [R][kS]
  float* s_k = s_q + kSimtRows * kS;      // [64][kS]
  float* s_v = s_k + kBlockK * kS;        // [64][kS]
  float* s_s = s_v + kBlockK * kS;        // [R][65] S of this row and key tile
  const int t = threadIdx.x, row = q0 + t;
  const size_t base = static_cast<size_t>(bh) * T * D;
  const int n_all = (T + kBlockK - 1) / kBlockK;
  const int n_kt = a.causal ? min(n_all, (q0 + kSimtRows - 1) / kBlockK + 1) : n_all;
  const float* q_row = s_q + t * kS;
  float* s_row = s_s + t * (kBlockK + 1);
  const bool want_stats = a.stats != nullptr && row < T;
  StatAcc st;

  load_rows<D>(s_q, a.q, a.q32, f.qk_f32, base, q0, kSimtRows, T);
  float m = -INFINITY, o[D];
  double l = 0.0;  // holds an FP32 value unless softmax=fp32
#pragma unroll
  for (int d = 0; d < D; ++d) o[d] = 0.0f;

  // Tiling off: the row max (and the tie count for the stable rule) over the whole row first,
  // so m is final before any P̄ is formed (one tile: no rescaling at all).
  if (a.tiling_off) {
    float rmax = -INFINITY;
    int rs = 0;
    for (int pass = 0; pass < (f.stable ? 2 : 1); ++pass) {
      for (int j = 0; j < n_kt; ++j) {
        __syncthreads();
        load_rows<D>(s_k, a.k, a.k32, f.qk_f32, base, j * kBlockK, kBlockK, T);
        __syncthreads();
        for (int c = 0; c < kBlockK; ++c) {
          const float x = score<D>(q_row, s_k + c * kS, row, j * kBlockK + c, a, f, sr.qk);
          if (pass == 0) rmax = fmaxf(rmax, x);
          else if (x != -INFINITY && x >= rmax - f.eps) ++rs;
        }
      }
    }
    int branch;
    bool guarded;
    m = stable_max(rmax, rs, f, &branch, &guarded);
    if (want_stats) {
      st.pos += branch == 1;
      st.neg += branch == 2;
      st.guard += guarded;
    }
  }

  float run_max = -INFINITY;
  int run_cnt = 0, ones = 0;
  for (int j = 0; j < n_kt; ++j) {
    __syncthreads();
    load_rows<D>(s_k, a.k, a.k32, f.qk_f32, base, j * kBlockK, kBlockK, T);
    load_rows<D>(s_v, a.v, a.v32, f.pv_f32, base, j * kBlockK, kBlockK, T);
    __syncthreads();
    float r_m = -INFINITY;
    for (int c = 0; c < kBlockK; ++c) {
      const float x = score<D>(q_row, s_k + c * kS, row, j * kBlockK + c, a, f, sr.qk);
      s_row[c] = x;
      r_m = fmaxf(r_m, x);
    }
    int r_s = 0, ties = 0;
    for (int c = 0; c < kBlockK; ++c) {
      const float x = s_row[c];
      if (x != -INFINITY && x >= r_m - f.eps) ++r_s;
      if (x != -INFINITY && x == r_m) ++ties;
    }
    double corr = 1.0;  // softmax=fp32: exp, l and the rescale in double (CPU twin)
    if (!a.tiling_off) {
      int branch;
      bool guarded;
      const float m_new = fmaxf(m, stable_max(r_m, r_s, f, &branch, &guarded));
      corr = m == -INFINITY ? 0.0 : (f.sm_f64 ? exp(static_cast<double>(m) - m_new) : expf(m - m_new));
      m = m_new;
      if (want_stats) {
        st.pos += branch == 1;
        st.neg += branch == 2;
        st.guard += guarded;
      }
    }
    if (want_stats) {
      st.max_logit = fmaxf(st.max_logit, r_m);
      if (r_m > run_max) {
        run_max = r_m;
        run_cnt = ties;
      } else if (r_m == run_max) {
        run_cnt += ties;
      }
    }
    const float corr_f = static_cast<float>(corr);
#pragma unroll
    for (int d = 0; d < D; ++d) o[d] *= corr_f;
    // l: scaled first, then the keys ascending (the CPU twin's order).
    double l_d = f.sm_f64 ? corr * l : static_cast<double>(corr_f * static_cast<float>(l));
    for (int c = 0; c < kBlockK; ++c) {
      const float x = s_row[c];
      if (x == -INFINITY) continue;
      const double pd = f.sm_f64 ? exp(static_cast<double>(x) - m) : static_cast<double>(expf(x - m));
      const float pbar = softmax_fault(static_cast<float>(pd), f);
      const double pl = f.sm_fault && pd < 1.0 ? static_cast<double>(pbar) : pd;
      l_d = f.sm_f64 ? l_d + pl : static_cast<double>(static_cast<float>(l_d) + pbar);
      if (round_bf16(pbar) == 1.0f) ++ones;
      const float p = f.pv_sr && !f.pv_f32
                          ? round_bf16_sr(__fmul_rn(pbar, f.pv_bias),
                                          sr_element_bits(sr.pv, row, static_cast<uint32_t>(j * kBlockK + c)))
                          : pv_operand(pbar, f);
      axpy_row<D>(p, s_v + c * kS, o);
    }
    l = l_d;
    if (f.acc_bf16) {
      l = round_bf16(static_cast<float>(l));
#pragma unroll
      for (int d = 0; d < D; ++d) o[d] = round_bf16(o[d]);
    }
    if (f.acc_sr) {  // columns of key tile j (stochastic_round.h)
      const uint32_t col0 = static_cast<uint32_t>(j) * kSrAccStride;
      const uint32_t rw = sr_row_word(sr.acc, row);
      l = round_bf16_sr(static_cast<float>(l), sr_bits_in_row(sr.acc, rw, col0 + kSrAccL));
#pragma unroll
      for (int d = 0; d < D; ++d) o[d] = round_bf16_sr(o[d], sr_bits_in_row(sr.acc, rw, col0 + d));
    }
  }

  if (row < T) {
    const size_t off = base + static_cast<size_t>(row) * D;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const float x = f.sm_f64 ? static_cast<float>(o[d] / l) : o[d] / static_cast<float>(l);
      a.o_out[off + d] = float_to_bf16_bits(o_output(x, f));
      if (a.o32_out != nullptr) a.o32_out[off + d] = x;
    }
    a.lse_out[static_cast<size_t>(bh) * T + row] =
        f.sm_f64 ? static_cast<float>(m + log(l)) : m + logf(static_cast<float>(l));
  }
  if (a.stats != nullptr) {
    if (want_stats) {
      st.rows = 1;
      st.repeated = run_cnt > 1;
      st.pbar_one = ones > 1 ? ones - 1 : 0;
    }
    flush_stats(st, a.stats + h);
  }
}

// dQ and delta. Grid (ceil(T/R), B*H), R threads, thread t owns query row q0 + t.
template <int D, int R>
__global__ void __launch_bounds__(R) simt_dq_kernel(KernelArgs a) {
  constexpr int kS = kSimtStride<D>, kSimtRows = R;
  const int bh = blockIdx.y, h = bh % a.heads, q0 = blockIdx.x * kSimtRows, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (!backward_needs_simt(f, a.simt_fp32)) return;
  const uint64_t qk_stream = sr_streams(a.sr_key, bh, a.heads).qk;
  const bool grad_f32 = f.bwd_f32 || f.qk_f32, v_f32 = f.pv_f32 || f.bwd_f32;
  extern __shared__ __align__(16) float fsm[];
  float* s_q = fsm;                       // [R][kS] S operand
  float* s_do = s_q + kSimtRows * kS;     // [R][kS]
  float* s_k = s_do + kSimtRows * kS;     // [64][kS] S operand
  float* s_kg = s_k + kBlockK * kS;       // [64][kS] dQ operand (aliases s_k when equal)
  float* s_v = s_kg + kBlockK * kS;       // [64][kS]
  if (grad_f32 == f.qk_f32) s_kg = s_k;
  const int t = threadIdx.x, row = q0 + t;
  const size_t base = static_cast<size_t>(bh) * T * D;
  const int n_all = (T + kBlockK - 1) / kBlockK;
  const int n_kt = a.causal ? min(n_all, (q0 + kSimtRows - 1) / kBlockK + 1) : n_all;
  const float* q_row = s_q + t * kS;
  const float* do_row = s_do + t * kS;
  const float lse = row < T ? a.lse_in[static_cast<size_t>(bh) * T + row] : 0.0f;

  load_rows<D>(s_q, a.q, a.q32, f.qk_f32, base, q0, kSimtRows, T);
  load_rows<D>(s_do, a.d_o, a.do32, f.bwd_f32, base, q0, kSimtRows, T);
  __syncthreads();
  // delta=fp32 reads the unrounded dO (when given) even where the gradients use BF16 dO.
  const float* do_exact = (f.delta_f64 && a.do32 != nullptr && row < T)
                              ? a.do32 + base + static_cast<size_t>(row) * D : do_row;

  // delta as the CPU twin: FP32 sequential sums (with |terms| for the delta fault), or double
  // for delta=fp32 (from o_f32 and the FP32 dO).
  double sum = 0.0, abs_sum = 0.0;
  if (!f.delta_dpp) {  // rowsum(dO * O), O in FP32 for o=fp32 heads
    if (row < T) {
      const size_t off = base + static_cast<size_t>(row) * D;
      float acc = 0.0f, abs_acc = 0.0f;
      for (int d = 0; d < D; ++d) {
        if (f.delta_f64) {
          sum += static_cast<double>(do_exact[d]) * a.o32[off + d];
        } else {
          const float o = f.o_f32 ? a.o32[off + d] : bf16_bits_to_float(a.o[off + d]);
          const float x = __fmul_rn(do_row[d], o);
          acc = __fadd_rn(acc, x);
          abs_acc = __fadd_rn(abs_acc, fabsf(x));
        }
      }
      if (!f.delta_f64) {
        sum = acc;
        abs_sum = abs_acc;
      }
    }
  } else {  // rowsum(dP * P), one extra pass over the keys
    float acc = 0.0f, abs_acc = 0.0f;
    for (int j = 0; j < n_kt; ++j) {
      __syncthreads();
      load_rows<D>(s_k, a.k, a.k32, f.qk_f32, base, j * kBlockK, kBlockK, T);
      load_rows<D>(s_v, a.v, a.v32, v_f32 || f.delta_f64, base, j * kBlockK, kBlockK, T);
      __syncthreads();
      for (int c = 0; c < kBlockK; ++c) {
        const float x = score<D>(q_row, s_k + c * kS, row, j * kBlockK + c, a, f, qk_stream);
        if (x == -INFINITY || row >= T) continue;
        const float* v_row = s_v + c * kS;
        if (f.delta_f64) {
          double dp = 0.0;
          for (int d = 0; d < D; d += 4) {
            const float4 x = ld4(do_exact + d), y = ld4(v_row + d);
            dp += static_cast<double>(x.x) * y.x;
            dp += static_cast<double>(x.y) * y.y;
            dp += static_cast<double>(x.z) * y.z;
            dp += static_cast<double>(x.w) * y.w;
          }
          sum += dp * exp(static_cast<double>(x) - lse);
        } else {
          float dp = 0.0f;
          for (int d = 0; d < D; d += 4) {
            const float4 x = ld4(do_row + d), y = ld4(v_row + d);
            dp = __fadd_rn(dp, __fmul_rn(x.x, y.x));
            dp = __fadd_rn(dp, __fmul_rn(x.y, y.y));
            dp = __fadd_rn(dp, __fmul_rn(x.z, y.z));
            dp = __fadd_rn(dp, __fmul_rn(x.w, y.w));
          }
          const float pr = f.sm_f64 ? static_cast<float>(exp(static_cast<double>(x) - lse))
                                    : expf(x - lse);
          acc = __fadd_rn(acc, __fmul_rn(dp, pr));
          abs_acc = __fadd_rn(abs_acc, fabsf(__fmul_rn(dp, pr)));
        }
      }
    }
    if (!f.delta_f64) {
      sum = acc;
      abs_sum = abs_acc;
    }
  }
  const float delta = static_cast<float>(sum) + f.delta_c * static_cast<float>(abs_sum);
  if (row < T) a.delta[static_cast<size_t>(bh) * T + row] = delta;

  float dq[D];
#pragma unroll
  for (int d = 0; d < D; ++d) dq[d] = 0.0f;
  for (int j = 0; j < n_kt; ++j) {
    __syncthreads();
    load_rows<D>(s_k, a.k, a.k32, f.qk_f32, base, j * kBlockK, kBlockK, T);
    if (s_kg != s_k) load_rows<D>(s_kg, a.k, a.k32, true, base, j * kBlockK, kBlockK, T);
    load_rows<D>(s_v, a.v, a.v32, v_f32, base, j * kBlockK, kBlockK, T);
    __syncthreads();
    for (int c = 0; c < kBlockK; ++c) {
      const float x = score<D>(q_row, s_k + c * kS, row, j * kBlockK + c, a, f, qk_stream);
      if (x == -INFINITY) continue;
      const float p = f.sm_f64 ? static_cast<float>(exp(static_cast<double>(x) - lse)) : expf(x - lse);
      const float ds = p * (dot_row<D>(do_row, s_v + c * kS) - delta);
      const float dsu = f.bwd_f32 ? ds : round_bf16(ds);
      axpy_row<D>(dsu, s_kg + c * kS, dq);
    }
  }
  if (row < T) {
    const size_t off = base + static_cast<size_t>(row) * D;
#pragma unroll
    for (int d = 0; d < D; ++d) a.dq[off + d] = dq[d] * a.scale;
  }
}

// dK, dV. Grid (ceil(T/R), B*H), R threads, thread t owns key row k0 + t; query tiles of R.
template <int D, int R>
__global__ void __launch_bounds__(R) simt_dkdv_kernel(KernelArgs a) {
  constexpr int kS = kSimtStride<D>, kR = R;
  const int bh = blockIdx.y, h = bh % a.heads, k0 = blockIdx.x * kR, T = a.seq;
  const FlagView f = decode_flags(a.flags[h]);
  if (!backward_needs_simt(f, a.simt_fp32)) return;
  const SrStreams sr = sr_streams(a.sr_key, bh, a.heads);
  const bool grad_f32 = f.bwd_f32 || f.qk_f32, v_f32 = f.pv_f32 || f.bwd_f32;
  extern __shared__ __align__(16) float fsm[];
  float* s_k = fsm;            // [R][kS] own keys, S operand
  float* s_v = s_k + kR * kS;  // own values, dP operand
  float* s_q = s_v + kR * kS;  // query tile, S operand
  float* s_qg = s_q + kR * kS; // query tile, dK operand (aliases s_q when equal)
  float* s_do = s_qg + kR * kS;
  float* s_dk = s_do + kR * kS;  // accumulators, one row per thread
  float* s_dv = s_dk + kR * kS;
  float* s_lse = s_dv + kR * kS;  // [R]
  float* s_delta = s_lse + kR;    // [R]
  if (grad_f32 == f.qk_f32) s_qg = s_q;
  const int t = threadIdx.x, key = k0 + t;
  const size_t base = static_cast<size_t>(bh) * T * D;
  load_rows<D>(s_k, a.k, a.k32, f.qk_f32, base, k0, kR, T);
  load_rows<D>(s_v, a.v, a.v32, v_f32, base, k0, kR, T);
  float* dk = s_dk + t * kS;
  float* dv = s_dv + t * kS;
  for (int d = 0; d < D; ++d) dk[d] = dv[d] = 0.0f;

  const int n_qt = (T + kR - 1) / kR;
  for (int i = a.causal ? blockIdx.x : 0; i < n_qt; ++i) {
    __syncthreads();
    load_rows<D>(s_q, a.q, a.q32, f.qk_f32, base, i * kR, kR, T);
    if (s_qg != s_q) load_rows<D>(s_qg, a.q, a.q32, true, base, i * kR, kR, T);
    load_rows<D>(s_do, a.d_o, a.do32, f.bwd_f32, base, i * kR, kR, T);
    const int qr = i * kR + t;
    s_lse[t] = qr < T ? a.lse_in[static_cast<size_t>(bh) * T + qr] : 0.0f;
    s_delta[t] = qr < T ? a.delta[static_cast<size_t>(bh) * T + qr] : 0.0f;
    __syncthreads();
    if (key >= T) continue;
    for (int qq = 0; qq < kR; ++qq) {
      const int q = i * kR + qq;
      if (q >= T) break;
      if (a.causal && key > q) continue;
      const float x = finish_dot<D>(s_q + qq * kS, s_k + t * kS, q, key, a, f, sr.qk);
      const float p = f.sm_f64 ? static_cast<float>(exp(static_cast<double>(x) - s_lse[qq]))
                               : expf(x - s_lse[qq]);
      // dV's bf16(P): pv=sr draws the bits the forward drew for P̄ of (q, key).
      const float pu = f.bwd_f32 ? p
                       : f.pv_sr ? round_bf16_sr(p, sr_element_bits(sr.pv, q, static_cast<uint32_t>(key)))
                                 : round_bf16(p);
      const float* do_row = s_do + qq * kS;
      axpy_smem_row<D>(pu, do_row, dv);
      const float ds = p * (dot_row<D>(do_row, s_v + t * kS) - s_delta[qq]);
      const float dsu = f.bwd_f32 ? ds : round_bf16(ds);
      axpy_smem_row<D>(dsu, s_qg + qq * kS, dk);
    }
  }
  if (key < T) {
    const size_t off = base + static_cast<size_t>(key) * D;
    for (int d = 0; d < D; ++d) {
      a.dk[off + d] = dk[d] * a.scale;
      a.dv[off + d] = dv[d];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// kernel launchers

namespace {

// Rows per block (one per thread) of each SIMT kernel, as large as shared memory allows:
// more rows share each K/V tile load and fill more warps per SM (32-row blocks ran one warp).
// D = 256 (whose FP32 heads all come here, split_head_dim): three 64-key FP32 tiles of the dQ
// kernel take 195 KB, which leaves room for 8 query rows only; slow, but the only FP32 path.
template <int D>
struct SimtRows {
  // smem D 32 / 64 / 80 / 96 / 128 / 256: 68 / 100 / 116 / 132 / 164 / 211 KB
  static constexpr int kFwd = D <= 128 ? 128 : 64;
  // 63 / 119 / 147 / 175 / 165 / 211 KB
  static constexpr int kDq = D == 128 ? 64 : D < 128 ? 128 : 8;
  // 64 / 120 / 148 / 176 / 116 / 114 KB
  static constexpr int kDkdv = D <= 96 ? 64 : D == 128 ? 32 : 16;
};

template <typename Kernel, typename... Args>
int launch_simt(Kernel kernel, int rows, int smem, int seq, int bh, cudaStream_t stream,
                Args... args) {
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid((seq + rows - 1) / rows, bh);
  kernel<<<grid, rows, smem, stream>>>(args...);
  return cudaGetLastError();
}

template <int D>
int simt_forward(const KernelArgs& a, bool all_heads, cudaStream_t stream) {
  constexpr int kR = SimtRows<D>::kFwd;
  const int smem = static_cast<int>(sizeof(float)) *
                   ((kR + 2 * kBlockK) * kSimtStride<D> + kR * (kBlockK + 1));
  return launch_simt(simt_forward_kernel<D, kR>, kR, smem, a.seq, a.batch * a.heads, stream, a,
                     all_heads);
}

template <int D>
int simt_backward(const KernelArgs& a, cudaStream_t stream) {
  constexpr int kRq = SimtRows<D>::kDq, kRk = SimtRows<D>::kDkdv;
  const int smem_dq = static_cast<int>(sizeof(float)) * (2 * kRq + 3 * kBlockK) * kSimtStride<D>;
  int err = launch_simt(simt_dq_kernel<D, kRq>, kRq, smem_dq, a.seq, a.batch * a.heads, stream, a);
  if (err != 0) return err;
  const int smem_kv = static_cast<int>(sizeof(float)) * (7 * kRk * kSimtStride<D> + 2 * kRk);
  return launch_simt(simt_dkdv_kernel<D, kRk>, kRk, smem_kv, a.seq, a.batch * a.heads, stream, a);
}

}  // namespace

int launch_simt_forward(const KernelArgs& a, int dim, bool all_heads, cudaStream_t stream) {
  return dispatch_head_dim(dim, [&](auto d) { return simt_forward<decltype(d)::value>(a, all_heads, stream); });
}

int launch_simt_backward(const KernelArgs& a, int dim, cudaStream_t stream) {
  return dispatch_head_dim(dim, [&](auto d) { return simt_backward<decltype(d)::value>(a, stream); });
}

}  // namespace rwd::kernels::cuda
