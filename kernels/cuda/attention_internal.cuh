// Internal interface between the CUDA attention files: the by-value kernel argument block and
// the host helpers (flag validation, SIMT launches) that the public launchers share.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>
#include <functional>
#include <type_traits>

#include "kernels/attention_params.h"

namespace rwd::kernels::cuda {

struct TmaMaps;  // tma.cuh

// Everything a kernel reads, passed by value. Shapes: q,k,v,o,d_o (B,H,T,D); lse, delta (B,H,T).
struct KernelArgs {
  int batch = 0, heads = 0, seq = 0;
  float scale = 0.0f;
  bool causal = true;
  bool tiling_off = false;  // stable rule once per full row (two passes over the keys)
  uint64_t sr_key = 0;      // AttentionParams::sr_key (stochastic rounding, attention_sr.cuh)
  const HeadFlags* flags = nullptr;
  HeadStats* stats = nullptr;
  const int* stats_on = nullptr;  // forward: see ForwardArgs::stats_on
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const uint16_t* o = nullptr;    // backward: forward output
  const uint16_t* d_o = nullptr;
  const float* q32 = nullptr;
  const float* k32 = nullptr;
  const float* v32 = nullptr;
  const float* o32 = nullptr;     // backward: FP32 forward output
  const float* do32 = nullptr;    // backward: optional FP32 dO (bwd=fp32, delta=fp32 heads)
  const float* lse_in = nullptr;  // backward
  uint16_t* o_out = nullptr;      // forward
  float* o32_out = nullptr;
  float* lse_out = nullptr;
  float* delta = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  // Exact split of the FP32 twins into three BF16 planes x = x0 + x1 + x2 (split_planes),
  // (B,H,T,D) each, written only for the heads that read them (FP32 tensor-core variant).
  const uint16_t* q_pl[3] = {nullptr, nullptr, nullptr};
  const uint16_t* k_pl[3] = {nullptr, nullptr, nullptr};
  const uint16_t* v_pl[3] = {nullptr, nullptr, nullptr};
  const uint16_t* do_pl[3] = {nullptr, nullptr, nullptr};  // backward, bwd=fp32 heads
  bool simt_fp32 = false;  // FP32-operand heads take the SIMT reference kernels instead
  // Backward, dS path (attention_backward.cu): the BF16 heads without delta=dpp store their
  // dS tiles at `ds` (heads bh0 + blockIdx.y of the launch) and get dQ from them.
  bool ds_dq = false;
  uint16_t* ds = nullptr;
  int bh0 = 0;  // first (batch, head) of this launch's grid rows
};

// Head dims (kCudaHeadDims): every one runs the BF16 tensor-core kernels on mma.sync (k-steps of
// 16 over D, so 80 = 5 x 16 needs no padding). Two variants serve fewer dims:
//   - wgmma (kWg) only D = 64 and 128: its swizzle-128 tiles are 64 BF16 wide (D = 32 would
//     need the 64-byte swizzle, 80 and 96 a partial atom) and D = 256 holds 128 accumulator
//     registers for O alone; the other dims take the mma.sync kernels whatever wgmma_on() says
//     (the bits are the same either way), except 80 and 96, which run the D = 128 kernels on
//     zero-padded tiles (wgmma_pad_dim below; the forward's by TMA: wgmma_fwd_dim,
//     attention_forward_config.cuh);
//   - the FP32 split-operand variants up to D = 128: at D = 256 three planes of the 64-row
//     tiles need 405 KB of shared memory in the backward (227 KB an SM), so FP32 heads of that
//     dim take the SIMT kernels (as simt_fp32 would send them).
constexpr bool wgmma_head_dim(int dim) { return dim == 64 || dim == 128; }
// The dim whose wgmma backward kernels (dK/dV, dQ from dS) compute a BF16 head of dim `dim`
// (0: none): 80 and 96 run the D = 128 ones on tiles loaded with zeros past their D columns,
// storing only those (the zero k-steps and columns leave the bits of the mma.sync kernels).
constexpr int wgmma_pad_dim(int dim) { return wgmma_head_dim(dim) ? dim : dim == 80 || dim == 96 ? 128 : 0; }
constexpr bool split_head_dim(int dim) { return dim <= 128; }

// Calls fn(std::integral_constant<int, D>{}) with D = dim, one of kCudaHeadDims, and returns
// its result; cudaErrorInvalidValue for any other dim. The one place a runtime head dim becomes
// a template argument.
template <class Fn>
int dispatch_head_dim(int dim, Fn&& fn) {
  switch (dim) {
    case 32: return fn(std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    case 80: return fn(std::integral_constant<int, 80>{});
    case 96: return fn(std::integral_constant<int, 96>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    case 256: return fn(std::integral_constant<int, 256>{});
    default: return cudaErrorInvalidValue;
  }
}
static_assert(sizeof(kCudaHeadDims) / sizeof(kCudaHeadDims[0]) == 6, "dispatch_head_dim lists every dim");

// Specializations of the tensor-core forward (attention_forward.cu), one kernel each: bits of
// a variant number. kFwdStats (monitors requested) comes with kFwdStable (ties counted before
// the exponentials) except on a plain BF16 head, whose ties are counted after them.
// kFwdF32: qk, pv or softmax promoted: split-BF16 operands (attention_split.cuh). kFwdSr (BF16
// heads only): qk=sr, pv=sr or acc=sr, whose random bits the other variants never compute; with
// kFwdExtras for qk=sr, acc=sr, monitors or the stable rule, without it for pv=sr alone.
constexpr int kFwdStable = 1, kFwdStats = 2, kFwdExtras = 4, kFwdF32 = 8, kFwdSr = 16, kFwdVariants = 32;

// Heads that round something stochastically (HeadFlags::s_sr, pv_sr, acc_sr).
__host__ __device__ inline bool rounds_sr(const HeadFlags& f) { return f.s_sr || f.pv_sr || f.acc_sr; }

// Heads whose forward reads FP32 operands or keeps the softmax in double.
__host__ __device__ inline bool forward_fp32(const HeadFlags& f) {
  return f.prec[static_cast<int>(Op::kQk)] == Prec::kFp32 ||
         f.prec[static_cast<int>(Op::kPv)] == Prec::kFp32 ||
         f.prec[static_cast<int>(Op::kSoftmax)] == Prec::kFp32;
}

// The forward variant of a head, or -1 for a head that runs in the SIMT kernels (FP32 heads
// when simt_fp32 asks for the reference path, and FP32 heads with an sr flag). Extras: s_bf16,
// acc_bf16, a qk / softmax / pv fault or an sr flag (but pv=sr alone), whose branches the other
// variants compile away.
__host__ __device__ inline int forward_variant(const HeadFlags& f, bool stats, bool simt_fp32) {
  const Prec qk = f.prec[static_cast<int>(Op::kQk)], sm = f.prec[static_cast<int>(Op::kSoftmax)];
  const Prec pv = f.prec[static_cast<int>(Op::kPv)];
  const bool f32 = forward_fp32(f), sr = rounds_sr(f);
  if (f32 && (simt_fp32 || sr)) return -1;
  const bool faults = f.s_bf16 || f.acc_bf16 || qk == Prec::kFault || sm == Prec::kFault || pv == Prec::kFault;
  // pv=sr alone, without monitors or the stable rule, runs the plain key loops (the pipelined
  // one at D = 128) with the stochastic rounding of the P̄V operand added.
  const bool pv_sr_only = f.pv_sr && !f.s_sr && !f.acc_sr && !faults && !f.stable && !stats;
  const bool extras = faults || (sr && !pv_sr_only);
  const bool ties_first = f.stable || (stats && (extras || f32));
  return (f32 ? kFwdF32 : 0) | (extras ? kFwdExtras : 0) | (sr ? kFwdSr : 0) | (stats ? kFwdStats : 0) |
         (ties_first ? kFwdStable : 0);
}

// The backward's BF16 tensor-core heads in two groups, each with kernels of its own: the plain
// ones and those rounding S or P stochastically (qk=sr, pv=sr), whose random bits the plain
// kernels never compute; and whether a group holds a delta=dpp head.
struct Bf16Groups {
  bool plain = false, plain_dpp = false;
  bool sr = false, sr_dpp = false;
};

// What the host learned from the per-head flags (copied once from the device).
struct LaunchPlan {
  bool tiling_off = false;
  bool any_simt = false;  // some head needs the FP32/SIMT kernels
  bool any_fast = false;  // some head runs on the tensor-core kernels
  bool any_split = false;  // some head takes an FP32 tensor-core variant (needs the planes)
  bool any_fast16 = false;  // some head takes a BF16 tensor-core variant
  Bf16Groups bf16;          // backward: which BF16 tensor-core kernels run
  unsigned fwd_variants = 0;        // bit forward_variant(f, false, .) per tensor-core head
  unsigned fwd_variants_stats = 0;  // the same with monitors requested
};

// Checks shapes, tile sizes, pointers and every head's flags; fills *plan. Returns 0 or a
// cudaError_t (cudaErrorInvalidValue for bad arguments, cudaErrorNotSupported for a flag
// combination the GPU path does not implement). Reads host_flags when given, else copies
// p.flags from the device (synchronizing `stream`).
int plan_launch(const AttentionParams& p, const HeadFlags* host_flags, bool backward,
                bool have_q32, bool have_k32,
                bool have_v32, bool have_o32, bool simt_fp32, cudaStream_t stream,
                LaunchPlan* plan);

// Runs side_work on a second stream of this device, forked from `stream`, and main_work on
// `stream`, then makes `stream` wait for both: the FP32 variants of a mixed plan run beside the
// BF16 ones instead of after them (one FP32 head alone fills few SMs). Deterministic: the two
// write disjoint heads.
int launch_beside(cudaStream_t stream, const std::function<int(cudaStream_t)>& side_work,
                  const std::function<int(cudaStream_t)>& main_work);

// Bytes of the split planes (12 BF16 arrays of B*H*T*D: q, k, v, dO) when some head of
// host_flags promotes an op to FP32 (host_flags null: always), else 0.
size_t split_bytes(const AttentionParams& p, const HeadFlags* host_flags);
// Writes the three planes of the FP32 operands the FP32 heads read into `ws` and points a's
// q_pl/k_pl/v_pl/do_pl at them. Forward: q, k (qk=fp32), v (pv=fp32). Backward: q, k (qk or
// bwd fp32), v (pv or bwd), dO (bwd; from d_o when a.do32 is null).
int launch_split(KernelArgs& a, int dim, void* ws, bool backward, cudaStream_t stream);

// Whether the BF16 tensor-core kernels run their products on wgmma (sm_90a; same bits as
// mma.sync): unless REWIND_ATTN_WGMMA=0 (attention_plan.cu).
bool wgmma_on();

// The TMA tensor maps of a.q, a.k and a.v (struct TmaMaps, tma.cuh): (dim, seq, batch * heads)
// BF16, boxes of 64 x 64 x 1, 128-byte swizzle, zeros past seq. Returns 0 or a cudaError_t
// (cudaErrorNotSupported when the driver has no cuTensorMapEncodeTiled).
int encode_tma_maps(const KernelArgs& a, int dim, TmaMaps* out);

// SIMT kernels (attention_simt.cu): one query (or key) row per thread, FP32 FMAs, the
// same rounding points as the tensor-core kernels. all_heads: run every head (tiling off),
// else only heads that need FP32 operands.
int launch_simt_forward(const KernelArgs& a, int dim, bool all_heads, cudaStream_t stream);
int launch_simt_backward(const KernelArgs& a, int dim, cudaStream_t stream);

}  // namespace rwd::kernels::cuda
