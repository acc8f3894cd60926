// Host-side launchers of the CUDA flash-attention kernels (kernels/cuda/*.cu). Plain C++:
// no LibTorch here; kernels/attention_op.cpp validates tensors and fills these structs.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace rwd::kernels::cuda {

// All pointers are device pointers to contiguous (B, H, T, D) or (B, H, T) arrays.
// BF16 arrays are raw uint16_t storage. The *_f32 inputs are optional (nullptr) and are read
// only by heads whose flags ask for FP32 operands (qk or pv promoted); the dispatch layer
// passes them only when some head needs them.
struct ForwardArgs {
  const uint16_t* q = nullptr;   // (B,H,T,D) bf16
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const float* q_f32 = nullptr;  // optional FP32 twins
  const float* k_f32 = nullptr;
  const float* v_f32 = nullptr;
  uint16_t* o = nullptr;         // (B,H,T,D) bf16 output, always written
  float* o_f32 = nullptr;        // optional: FP32 O (Ō/l before rounding), written when non-null
  float* lse = nullptr;          // (B,H,T) FP32 log-sum-exp, always written
  HeadStats* stats = nullptr;    // optional device array of `heads` entries (zeroed by caller)
  // Optional device int read by the kernels with stats: 0 runs the plain BF16 heads without
  // their monitors (stats left as they are). Lets one CUDA graph, captured with stats, serve
  // steps with monitors and steps without (sampled monitors); null: always collected.
  const int* stats_on = nullptr;
  // Optional HOST copy of p.flags (same contents). Without it the launcher reads the flags
  // back from the device, which synchronizes the stream on every call.
  const HeadFlags* host_flags = nullptr;
  // forward_workspace_bytes(p, flags) bytes of device memory: the split-BF16 planes of the FP32
  // operands. Needed (non-null) when some head promotes qk, pv or softmax.
  void* workspace = nullptr;
  // true: heads that promote qk, pv or softmax take the SIMT reference kernels (one row per
  // thread, plain FP32 FMAs) instead of the split-operand tensor-core variant. Tests and the
  // benchmark's baseline only.
  bool simt_fp32 = false;
};

struct BackwardArgs {
  const uint16_t* q = nullptr;   // same inputs as the forward
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const float* q_f32 = nullptr;
  const float* k_f32 = nullptr;
  const float* v_f32 = nullptr;
  const uint16_t* o = nullptr;   // forward output (bf16)
  const float* o_f32 = nullptr;  // optional FP32 O for heads with o=fp32
  const uint16_t* d_o = nullptr; // (B,H,T,D) bf16 upstream gradient
  // Optional FP32 upstream gradient (unrounded), read by heads with bwd=fp32 (their dO operand)
  // or delta=fp32 (rowsum in double), as the CPU twin reads it. Without it those heads read
  // the BF16 d_o, which equals it whenever the producer of dO rounds (a low output projection).
  const float* d_o_f32 = nullptr;
  const float* lse = nullptr;    // (B,H,T)
  float* delta = nullptr;        // (B,H,T) scratch, written (rowsum(dO*O) or rowsum(dP*P))
  float* dq = nullptr;           // (B,H,T,D) FP32 gradients, fully written (no accumulate)
  float* dk = nullptr;
  float* dv = nullptr;
  // backward_workspace_bytes(p, flags, ds_dq) bytes: the split planes of FP32 heads' operands
  // and, where the dS path runs, BF16 dS tiles. Needed (non-null) when either is nonzero.
  void* workspace = nullptr;
  const HeadFlags* host_flags = nullptr;  // optional host copy of p.flags (see ForwardArgs)
  bool simt_fp32 = false;  // as ForwardArgs: FP32 heads on the SIMT reference kernels
  // How the BF16 heads get dQ (bits are the same either way; only the speed differs):
  // 0: recomputed in a kernel of its own (S, dP, dS again per tile pair: 7 matrix products);
  // 1: from the BF16 dS tiles that the dK/dV kernel stores (5 matrix products + dS traffic;
  //    delta=dpp heads are recomputed still); -1: the default, ds_dq_default(p).
  int ds_dq = -1;
};

// The backward's arguments that a forward call's fix: its q, k, v and FP32 twins, its outputs
// (o, o_f32, lse) as inputs, the host flags and simt_fp32. dO, delta, the gradients, the
// workspace and ds_dq are the caller's to set.
inline BackwardArgs backward_args_of(const ForwardArgs& f) {
  BackwardArgs b;
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.q_f32 = f.q_f32;
  b.k_f32 = f.k_f32;
  b.v_f32 = f.v_f32;
  b.o = f.o;
  b.o_f32 = f.o_f32;
  b.lse = f.lse;
  b.host_flags = f.host_flags;
  b.simt_fp32 = f.simt_fp32;
  return b;
}

// Returns 0 on success or a cudaError_t value; stream is a cudaStream_t (nullptr = default).
int attention_forward(const AttentionParams& p, const ForwardArgs& a, void* stream);
int attention_backward(const AttentionParams& p, const BackwardArgs& a, void* stream);
size_t backward_workspace_bytes(const AttentionParams& p, const HeadFlags* host_flags,
                                int ds_dq = -1);
// Whether BackwardArgs::ds_dq = -1 takes the dS path: T <= 16384 (its workspace, T^2/2 BF16
// per head, is held for one chunk of heads of at most REWIND_ATTN_DS_WORKSPACE bytes, default
// 1 GiB), unless REWIND_ATTN_DS_DQ=0.
bool ds_dq_default(const AttentionParams& p);
// Forward workspace for the flags (host copy): 0 unless some head promotes qk, pv or softmax;
// host_flags null: the most any plan needs.
size_t forward_workspace_bytes(const AttentionParams& p, const HeadFlags* host_flags);
// p.flags and p.stats must point to DEVICE memory for the launchers (heads entries each).

}  // namespace rwd::kernels::cuda
