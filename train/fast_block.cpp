// The GPT block over BF16 tensors in one autograd node (see fast_block.h). Each step below
// names the op of the module path (model.cpp, mixed.cpp) whose values it reproduces.
#include "train/fast_block.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "kernels/attention_layout.h"
#include "train/mixed.h"
#include "train/norm.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "kernels/cuda/cross_entropy.h"
#endif

namespace rwd::train {

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr auto kBf16 = torch::kBFloat16;

struct FastBlockState : torch::CustomClassHolder {
  kernels::AttentionOptions opt;
  std::shared_ptr<kernels::AttentionCapture> capture;
  int64_t heads = 0;
  Tensor wa, wp, wf, wm;  // the GEMM weights' BF16 casts, when kept by the caller
};

// A weight's BF16 cast kept by the caller, or undefined (the function casts).
struct KeptCast : torch::CustomClassHolder {
  Tensor w;
};

// `kept` where defined (the same values: the cast of the same weight this step), else the cast.
Tensor bf16_of(const Tensor& w, const Tensor& kept) { return kept.defined() ? kept : w.to(kBf16); }

// A BF16 GEMM x W^T as CudaBf16LinearFn runs it with round_out (BF16 result, not widened).
Tensor gemm(const Tensor& x, const Tensor& w_bf16) { return torch::matmul(x, w_bf16.t()); }
// The weight gradient g^T x of CudaBf16LinearFn::backward, widened for the FP32 master weight.
Tensor weight_grad(const Tensor& g, const Tensor& x) {
  return torch::matmul(g.reshape({-1, g.size(-1)}).t(), x.reshape({-1, x.size(-1)})).to(torch::kFloat32);
}

struct FastBlockFn : public torch::autograd::Function<FastBlockFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& ln_1,
                        const Tensor& c_attn, const Tensor& c_proj, const Tensor& ln_2,
                        const Tensor& c_fc, const Tensor& mlp_proj,
                        c10::intrusive_ptr<FastBlockState> st) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = st->heads, D = C / H;
    const Tensor wa = bf16_of(c_attn, st->wa), wp = bf16_of(c_proj, st->wp), wf = bf16_of(c_fc, st->wf),
                 wm = bf16_of(mlp_proj, st->wm);
    // LayerNorm in FP32, rounded once (round_bf16 then the GEMM's cast of its input): rewind's
    // kernels where they apply (norm.h; the module path's layer_norm uses them too), else LibTorch's.
    const NormForward n1 = norm_forward(x, Tensor(), ln_1, /*bf16_out=*/true);
    const Tensor &a_b = n1.out, &mean1 = n1.mean, &rstd1 = n1.rstd;
    // qkv in FP32 (bf16_matmul without round_out), then Q, K, V rounded into the kernels'
    // layout in one copy (attention()'s three strided BF16 copies).
    const Tensor qkv = bf16_matmul(a_b, wa.t(), /*round_out=*/false);
    const Tensor qkv_b = kernels::qkv_relayout(qkv, B, T, H, D, /*to_heads=*/true);
    Tensor lse;
    const Tensor o = kernels::attention_bf16_forward(qkv_b, st->opt, st->capture.get(), lse);
    // O back to (B, T, C) for the output projection (attention()'s FP32 assembly and the
    // GEMM's cast in one BF16 copy).
    const Tensor o_t = kernels::swap_heads_bf16(o).view({B, T, C});
    const Tensor proj = gemm(o_t, wp);
    // y = x + proj (FP32 + BF16: the widening is exact), in the LayerNorm's kernel where it runs.
    const NormForward n2 = norm_forward(x, proj, ln_2, /*bf16_out=*/true);
    const Tensor &y = n2.y, &m_b = n2.out, &mean2 = n2.mean, &rstd2 = n2.rstd;
    const Tensor h_b = gemm(m_b, wf);     // (B, T, 4C)
    const Tensor g_b = at::gelu(h_b);     // FP32 math, one rounding
    ctx->save_for_backward({x, y, a_b, mean1, rstd1, qkv_b, o, lse, o_t, m_b, mean2, rstd2, h_b, g_b,
                            wa, wp, wf, wm, ln_1, ln_2});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    ctx->saved_data["norm_kernels"] = n1.kernels;  // n2's too: the same test of the same x
    return y + gemm(g_b, wm);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto st = c10::static_intrusive_pointer_cast<FastBlockState>(ctx->saved_data["state"].toCapsule());
    const variable_list s = ctx->get_saved_variables();
    const Tensor &x = s[0], &y = s[1], &a_b = s[2], &mean1 = s[3], &rstd1 = s[4], &qkv_b = s[5],
                 &o = s[6], &lse = s[7], &o_t = s[8], &m_b = s[9], &mean2 = s[10],
                 &rstd2 = s[11], &h_b = s[12], &g_b = s[13], &wa = s[14], &wp = s[15],
                 &wf = s[16], &wm = s[17], &ln_1 = s[18], &ln_2 = s[19];
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = st->heads, D = C / H;
    const Tensor dout = grads[0];
    // MLP: the output projection's backward rounds the incoming gradient.
    const Tensor g_out = dout.to(kBf16);
    const Tensor dg_b = torch::matmul(g_out, wm);                 // (B, T, 4C)
    const Tensor d_mlp_proj = weight_grad(g_out, g_b);
    const Tensor dh_b = at::gelu_backward(dg_b, h_b);              // FP32 math, one rounding
    const Tensor d_c_fc = weight_grad(dh_b, m_b);
    // dy = dout + LayerNorm 2's input gradient, and its BF16 cast (one kernel where they apply).
    const bool kern = ctx->saved_data["norm_kernels"].toBool();
    const NormBackward n2 = norm_backward(torch::matmul(dh_b, wf), y, mean2, rstd2, ln_2, dout, /*want_bf16=*/true, kern);
    const Tensor &dy = n2.dx, &d_ln_2 = n2.dw, &g_y = n2.dx_bf16;
    // Attention: dO in the kernels' layout, then dQ, dK, dV rounded back into qkv's layout.
    const Tensor d_c_proj = weight_grad(g_y, o_t);
    const Tensor d_o = kernels::swap_heads_bf16(torch::matmul(g_y, wp).view({B, T, H, D}));
    const Tensor dqkv = kernels::attention_bf16_backward(qkv_b, o, lse, d_o, st->opt);
    const Tensor g_qkv = kernels::qkv_relayout(dqkv, B, T, H, D, /*to_heads=*/false).view({B, T, 3 * C});
    const Tensor d_c_attn = weight_grad(g_qkv, a_b);
    const NormBackward n1 = norm_backward(torch::matmul(g_qkv, wa), x, mean1, rstd1, ln_1, dy, false, kern);
    return {n1.dx, n1.dw, d_c_attn, d_c_proj, d_ln_2, d_c_fc, d_mlp_proj, Tensor()};
  }
};

struct FastHeadFn : public torch::autograd::Function<FastHeadFn> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& ln_f, const Tensor& wte,
                        c10::intrusive_ptr<KeptCast> kept) {
    const Tensor w = bf16_of(wte, kept->w);
    const NormForward n = norm_forward(x, Tensor(), ln_f, /*bf16_out=*/true);
    const Tensor &a_b = n.out, &mean = n.mean, &rstd = n.rstd;
    ctx->saved_data["norm_kernels"] = n.kernels;
    ctx->save_for_backward({x, a_b, mean, rstd, w, ln_f});
    return gemm(a_b, w);  // (B, T, V) BF16
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &x = s[0], &a_b = s[1], &mean = s[2], &rstd = s[3], &w = s[4], &ln_f = s[5];
    const Tensor g = grads[0].to(kBf16);  // BF16 already from fused_cross_entropy: no copy
    const NormBackward n = norm_backward(torch::matmul(g, w), x, mean, rstd, ln_f, Tensor(), false,
                                         ctx->saved_data["norm_kernels"].toBool());
    return {n.dx, n.dw, weight_grad(g, a_b), Tensor()};
  }
};

// Row losses and log-sum-exps of BF16 logits (N, V): the CUDA kernels, or LibTorch ops on the CPU.
std::tuple<Tensor, Tensor> ce_rows(const Tensor& logits, const Tensor& targets) {
  const int64_t n = logits.size(0), vocab = logits.size(1);
  if (!logits.is_cuda()) {
    const Tensor lf = logits.to(torch::kFloat32), lse = lf.logsumexp(1);
    return {lse - lf.gather(1, targets.unsqueeze(1)).squeeze(1), lse};
  }
  Tensor loss = torch::empty({n}, logits.options().dtype(torch::kFloat32)), lse = torch::empty_like(loss);
#ifdef REWIND_CUDA
  const int rc = kernels::cuda::cross_entropy_forward(
      reinterpret_cast<const uint16_t*>(logits.data_ptr()), targets.data_ptr<int64_t>(), n, vocab,
      lse.data_ptr<float>(), loss.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "cross-entropy: CUDA launch failed (error ", rc, ")");
#else
  (void)vocab;
  TORCH_CHECK(false, "cross-entropy: CUDA tensors need a REWIND_CUDA build");
#endif
  return {loss, lse};
}

// The logits' gradient (softmax - onehot) * scale in BF16; scale: a 0-dim FP32 tensor.
Tensor ce_grad(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& scale) {
  if (!logits.is_cuda()) {
    const Tensor lf = logits.to(torch::kFloat32);
    const Tensor onehot = torch::zeros_like(lf).scatter_(1, targets.unsqueeze(1), 1.0);
    return (((lf - lse.unsqueeze(1)).exp() - onehot) * scale).to(kBf16);
  }
  Tensor d = torch::empty_like(logits);
#ifdef REWIND_CUDA
  const int rc = kernels::cuda::cross_entropy_backward(
      reinterpret_cast<const uint16_t*>(logits.data_ptr()), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
      scale.data_ptr<float>(), logits.size(0), logits.size(1), reinterpret_cast<uint16_t*>(d.data_ptr()),
      at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(rc == 0, "cross-entropy: CUDA launch failed (error ", rc, ")");
#endif
  return d;
}

struct CrossEntropyFn : public torch::autograd::Function<CrossEntropyFn> {
  // logits: (N, V) contiguous BF16, targets: (N) int64 on the same device.
  static Tensor forward(AutogradContext* ctx, const Tensor& logits, const Tensor& targets) {
    auto [loss, lse] = ce_rows(logits, targets);
    ctx->save_for_backward({logits, targets, lse});
    return loss.mean();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    // The mean's gradient per row, on the device: no host sync.
    const Tensor scale = grads[0].to(torch::kFloat32) / static_cast<double>(s[0].size(0));
    return {ce_grad(s[0], s[1], s[2], scale), Tensor()};
  }
};

}  // namespace

Tensor fast_head(const Tensor& x, const Tensor& ln_f, const Tensor& wte, const Tensor& wte_b) {
  auto kept = c10::make_intrusive<KeptCast>();
  kept->w = wte_b;
  return FastHeadFn::apply(x, ln_f, wte, kept);
}

Tensor fused_cross_entropy(const Tensor& logits, const Tensor& targets) {
  TORCH_CHECK(logits.scalar_type() == kBf16, "fused_cross_entropy: logits must be BF16, got ", logits.scalar_type());
  TORCH_CHECK(targets.scalar_type() == torch::kLong && targets.numel() * logits.size(-1) == logits.numel() &&
                  targets.device() == logits.device(),
              "fused_cross_entropy: targets must be int64 on the logits' device, one per row");
  return CrossEntropyFn::apply(logits.reshape({-1, logits.size(-1)}).contiguous(), targets.reshape({-1}).contiguous());
}

bool fast_block_applies(const plan::LayerPlan& lp, bool has_bias,
                        const kernels::AttentionCapture* capture) {
  if (has_bias || (capture && capture->keep_tensors)) return false;
  for (bool fp32 : lp.module_fp32)
    if (fp32) return false;
  return kernels::bf16_attention_ok(lp.heads);
}

Tensor fast_block(const Tensor& x, const BlockWeights& w, int n_head,
                  const kernels::AttentionOptions& opt,
                  std::shared_ptr<kernels::AttentionCapture> capture) {
  auto st = c10::make_intrusive<FastBlockState>();
  st->opt = opt;
  st->capture = std::move(capture);
  st->heads = n_head;
  st->wa = w.c_attn_b;
  st->wp = w.c_proj_b;
  st->wf = w.c_fc_b;
  st->wm = w.mlp_proj_b;
  return FastBlockFn::apply(x, w.ln_1, w.c_attn, w.c_proj, w.ln_2, w.c_fc, w.mlp_proj, st);
}

}  // namespace rwd::train
