// LayerNorm (no bias) over FP32 rows for the GPU trainer, with the residual add before it and
// the casts around it fused in (train/norm.h; numerics 5 and 6).
//
// LibTorch's LayerNorm writes FP32 that the block then casts to BF16, adds the residual in a
// kernel of its own, and in the backward widens the BF16 gradient, runs two kernels (the input
// gradient, then the weight gradient in a slow column reduction), adds the residual's gradient
// and casts again: eight passes over the activations a LayerNorm. These kernels do it in two,
// one each way, and every sum runs in a fixed order (per lane, a fixed warp butterfly, warps and
// blocks in index order), so both are bitwise repeatable. Each value is computed with explicit
// round-to-nearest intrinsics, so a launch that writes FP32 and one that writes BF16 (or adds a
// residual) compute the same numbers: the fast block and the module path share them.
// Plain C++ header, no LibTorch.
#pragma once

#include <cstdint>

namespace rwd::kernels::cuda {

// Whether these kernels take rows of width C: C % 4 == 0 and C <= kLayerNormMaxWidth.
constexpr int64_t kLayerNormMaxWidth = 6144;
bool layer_norm_supports(int64_t C);

// x: rows x C FP32; residual: rows x C BF16 or null. v = x + residual (one FP32 add) or x;
// mean[r], rstd[r] = 1/sqrt(var + eps) of row r of v (two passes); out = (v - mean) * rstd * w,
// written as FP32 to out_f32 and/or rounded to BF16 into out_bf16 (either may be null); v is
// written to y_out when a residual is given (y_out may be null otherwise). All pointers 16-byte
// aligned. Returns 0 or a cudaError_t value.
int layer_norm_forward(const float* x, const uint16_t* residual, const float* w, int64_t rows, int64_t C,
                       float eps, float* y_out, float* out_f32, uint16_t* out_bf16, float* mean, float* rstd,
                       void* stream);

// The FP32 workspace layer_norm_backward needs for rows x C.
int64_t layer_norm_backward_workspace(int64_t rows, int64_t C);

// g: the output's gradient, rows x C, FP32 (g_f32) or BF16 (g_bf16): exactly one non-null.
// dx = residual + LayerNorm's input gradient (residual: rows x C FP32, or null: no add), also
// rounded to BF16 into dx_bf16 where non-null; dw[c] = sum over rows of g * xhat, summed per
// block of rows into `workspace` and then over the blocks in order. x, mean, rstd: the forward's
// input (v above) and statistics. Returns 0 or a cudaError_t value.
int layer_norm_backward(const float* g_f32, const uint16_t* g_bf16, const float* x, const float* mean,
                        const float* rstd, const float* w, const float* residual, int64_t rows, int64_t C,
                        float* dx, uint16_t* dx_bf16, float* dw, float* workspace, void* stream);

}  // namespace rwd::kernels::cuda
