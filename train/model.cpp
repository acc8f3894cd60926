// GPT-2 forward pass with the autocast(bfloat16) rounding points made explicit.
//
// Rounding points (low precision = the default plan, mirroring torch.autocast(bfloat16)):
//   embeddings        FP32 lookup + add (autocast leaves embedding in FP32)
//   LayerNorm         FP32 math; output rounded to BF16 (the cast the next matmul makes;
//                     producers own the rounding of what they feed to a matmul)
//   qkv linear        BF16 W, FP32 accumulate; Q/K/V rounded inside attention per qk/pv op
//   attention         kernels::attention (flash emulation; rounding points in kernels/)
//   proj, fc, mlp_proj  BF16 W, FP32 accumulate, output rounded to BF16 (x arrives BF16 from
//                     its producer: attention's O, LayerNorm, GELU)
//   GELU              on BF16 input, output rounded to BF16 (autocast runs it in BF16)
//   residual adds     FP32
//   LM head (tied)    BF16 x, W -> BF16 logits; cross-entropy in FP32
// Promoting a module (plan `Lx.qkv=fp32`, `Lx.mlp=fp32`, `Lx.ln=fp32`, `head=fp32`) removes
// its rounding points, forward and backward.
#include "train/model.h"

#include <torch/nn/functional/activation.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "common/switches.h"
#include "kernels/stochastic_round.h"
#include "train/fast_block.h"
#include "train/mixed.h"

namespace rwd::train {

namespace {

namespace F = torch::nn::functional;


bool module_low(const plan::LayerPlan& lp, plan::Module m) {
  return !lp.module_fp32[static_cast<int>(m)];
}

// linear() plus a bias (undefined: none, the same op as before biases existed). Low: the
// bias is rounded to BF16 (autocast's cast) and added to the FP32 accumulator before the
// output is rounded, as a BF16 GEMM with a bias epilogue does.
torch::Tensor linear_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          bool low, bool round_out, bool x_bf16) {
  if (!b.defined()) return linear(x, w, low, round_out, x_bf16);
  torch::Tensor y = linear(x, w, low, /*round_out=*/false, x_bf16) + (low ? round_bf16(b) : b);
  return (low && round_out) ? round_bf16(y) : y;
}

// Whether the attention output holds BF16 values: SDPA's always does, ours unless a head
// keeps O in FP32 (o=fp32); PyTorch's FP32 math never does.
bool o_is_bf16(AttentionImpl impl, const plan::LayerPlan& lp) {
  if (impl == AttentionImpl::kSdpa) return true;
  if (impl == AttentionImpl::kTorchMath) return false;
  for (const auto& f : lp.heads)
    if (f.prec[static_cast<int>(kernels::Op::kO)] == kernels::Prec::kFp32) return false;
  return true;
}

// A parameter as ParamAlloc asks: filled with `value` on the CPU, or left uninitialized where
// it will live (a restore's checkpoint overwrites it: no CPU fill, no host-to-device copy).
torch::Tensor param_tensor(at::IntArrayRef shape, double value, const ParamAlloc& alloc) {
  if (!alloc.filled) return torch::empty(shape, torch::TensorOptions().device(alloc.device));
  return torch::full(shape, value, torch::TensorOptions().device(alloc.device));
}

}  // namespace

BlockImpl::BlockImpl(const Config& c, int layer, const ParamAlloc& alloc)
    : layer_(layer), n_head_(c.n_head), n_embd_(c.n_embd) {
  const int64_t C = c.n_embd;
  auto ones = [&](at::IntArrayRef shape) { return param_tensor(shape, 1.0, alloc); };
  auto zeros = [&](at::IntArrayRef shape) { return param_tensor(shape, 0.0, alloc); };
  ln_1 = register_parameter("ln_1", ones({C}));
  c_attn = register_parameter("c_attn", zeros({3 * C, C}));
  c_proj = register_parameter("c_proj", zeros({C, C}));
  ln_2 = register_parameter("ln_2", ones({C}));
  c_fc = register_parameter("c_fc", zeros({4 * C, C}));
  mlp_proj = register_parameter("mlp_proj", zeros({C, 4 * C}));
  if (c.bias) {
    ln_1_bias = register_parameter("ln_1_bias", zeros({C}));
    c_attn_bias = register_parameter("c_attn_bias", zeros({3 * C}));
    c_proj_bias = register_parameter("c_proj_bias", zeros({C}));
    ln_2_bias = register_parameter("ln_2_bias", zeros({C}));
    c_fc_bias = register_parameter("c_fc_bias", zeros({4 * C}));
    mlp_proj_bias = register_parameter("mlp_proj_bias", zeros({C}));
  }
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const plan::Plan& plan,
                                 std::shared_ptr<kernels::AttentionCapture> capture) {
  const plan::LayerPlan& lp = plan.layers[layer_];
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_, D = C / H;
  kernels::AttentionOptions opt;
  opt.scale = 1.0f / std::sqrt(static_cast<float>(D));
  opt.causal = true;
  opt.naive = lp.naive;
  opt.block_q = plan.block_q;
  opt.block_k = plan.block_k;
  opt.flags = lp.heads;
  opt.stats_on = stats_on;
  opt.sr_key = sr_key;
  if (impl == AttentionImpl::kRewind && fast != FastPath::kOff && (x.is_cuda() || fast == FastPath::kOn) &&
      fast_block_applies(lp, ln_1_bias.defined(), capture.get())) {
    BlockWeights w{ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj};
    if (keep_bf16) {
      if (!bf16[0].defined()) {
        torch::NoGradGuard no_grad;  // a cast outside autograd: fast_block returns the weights' gradients
        bf16 = {c_attn.to(torch::kBFloat16), c_proj.to(torch::kBFloat16), c_fc.to(torch::kBFloat16),
                mlp_proj.to(torch::kBFloat16)};
      }
      w.c_attn_b = bf16[0];
      w.c_proj_b = bf16[1];
      w.c_fc_b = bf16[2];
      w.mlp_proj_b = bf16[3];
    }
    return fast_block(x, w, n_head_, opt, capture);
  }

  // Attention: (B,T,C) -> qkv (B,T,3C) -> q,k,v (B,H,T,D).
  const bool ln_low = module_low(lp, plan::Module::kLn);
  torch::Tensor a = layer_norm(x, ln_1, ln_1_bias, ln_low);
  if (capture && capture->keep_tensors) capture->x = a.detach().clone();
  torch::Tensor qkv = linear_bias(a, c_attn, c_attn_bias, module_low(lp, plan::Module::kQkv),
                                  /*round_out=*/false, /*x_bf16=*/ln_low);
  auto parts = qkv.split(C, /*dim=*/2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({B, T, H, D}).transpose(1, 2);  // (B,H,T,D) view; attention copies as it needs
  };
  torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  torch::Tensor o;                                                    // (B,H,T,D)
  switch (impl) {
    case AttentionImpl::kRewind: o = kernels::attention(q, k, v, opt, capture); break;
    case AttentionImpl::kSdpa: o = kernels::attention_sdpa(q, k, v, true).to(torch::kFloat32); break;
    case AttentionImpl::kTorchMath: o = kernels::attention_torch_fp32(q, k, v, opt.scale, true); break;
  }
  o = o.transpose(1, 2).contiguous().view({B, T, C});
  const bool proj_low = module_low(lp, plan::Module::kProj);
  torch::Tensor y = x + linear_bias(o, c_proj, c_proj_bias, proj_low, proj_low, o_is_bf16(impl, lp));

  // MLP: (B,T,C) -> (B,T,4C) -> GELU -> (B,T,C).
  const bool mlp_low = module_low(lp, plan::Module::kMlp);
  torch::Tensor m = layer_norm(y, ln_2, ln_2_bias, ln_low);
  m = linear_bias(m, c_fc, c_fc_bias, mlp_low, mlp_low, /*x_bf16=*/ln_low);
  m = F::gelu(m);
  if (mlp_low) m = round_bf16(m);
  return y + linear_bias(m, mlp_proj, mlp_proj_bias, mlp_low, mlp_low, /*x_bf16=*/mlp_low);
}

GPTImpl::GPTImpl(const Config& c, const ParamAlloc& alloc) : config_(c) {
  c.validate();
  auto ones = [&](at::IntArrayRef shape) { return param_tensor(shape, 1.0, alloc); };
  auto zeros = [&](at::IntArrayRef shape) { return param_tensor(shape, 0.0, alloc); };
  wte = register_parameter("wte", zeros({c.vocab_size, c.n_embd}));
  wpe = register_parameter("wpe", zeros({c.block_size, c.n_embd}));
  ln_f = register_parameter("ln_f", ones({c.n_embd}));
  if (c.bias) ln_f_bias = register_parameter("ln_f_bias", zeros({c.n_embd}));
  h = register_module("h", torch::nn::ModuleList());
  for (int i = 0; i < c.n_layer; ++i) {
    blocks_.emplace_back(Block(c, i, alloc));
    h->push_back(blocks_.back());
  }
  if (!switches::on(switches::Switch::kFastBlock)) set_fast_path(FastPath::kOff);
  if (!switches::on(switches::Switch::kFusedLoss)) fused_loss_ = FastPath::kOff;
}

void GPTImpl::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = torch::make_generator<at::CPUGeneratorImpl>(seed);
  const double std_res = 0.02 / std::sqrt(2.0 * config_.n_layer);
  auto normal = [&](torch::Tensor& t, double std) {
    t.copy_(at::normal(0.0, std, t.sizes(), gen, torch::kFloat32));
  };
  normal(wte, 0.02);
  normal(wpe, 0.02);
  ln_f.fill_(1.0);
  for (auto& b : blocks_) {
    b->ln_1.fill_(1.0);
    b->ln_2.fill_(1.0);
    normal(b->c_attn, 0.02);
    normal(b->c_proj, std_res);
    normal(b->c_fc, 0.02);
    normal(b->mlp_proj, std_res);
  }
}

torch::Tensor GPTImpl::trunk(const torch::Tensor& idx, const plan::Plan& plan, ForwardTap* tap) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= config_.block_size, "sequence longer than block_size");
  torch::Tensor pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  torch::Tensor x = wte.index_select(0, idx.reshape({-1})).view({idx.size(0), T, -1}) +
                    wpe.index_select(0, pos).unsqueeze(0);           // (B,T,C) FP32
  if (tap) tap->layers.assign(config_.n_layer, nullptr);
  for (int i = 0; i < config_.n_layer; ++i) {
    std::shared_ptr<kernels::AttentionCapture> cap;
    if (tap) {
      cap = std::make_shared<kernels::AttentionCapture>();
      cap->keep_tensors = std::find(tap->tensor_layers.begin(), tap->tensor_layers.end(), i) !=
                          tap->tensor_layers.end();
      tap->layers[i] = cap;
    }
    x = blocks_[i]->forward(x, plan, cap);
  }
  return x;
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx, const plan::Plan& plan, ForwardTap* tap) {
  return lm_head(trunk(idx, plan, tap), ln_f, ln_f_bias, wte, !plan.head_fp32);  // (B,T,V)
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets,
                            const plan::Plan& plan, ForwardTap* tap) {
  const torch::Tensor x = trunk(idx, plan, tap);
  if (fused_loss_ != FastPath::kOff && (x.is_cuda() || fused_loss_ == FastPath::kOn) && !plan.head_fp32 &&
      !ln_f_bias.defined()) {
    if (keep_bf16_ && !wte_bf16_.defined()) {
      torch::NoGradGuard no_grad;
      wte_bf16_ = wte.to(torch::kBFloat16);
    }
    return fused_cross_entropy(fast_head(x, ln_f, wte, keep_bf16_ ? wte_bf16_ : torch::Tensor()), targets);
  }
  return mean_cross_entropy(lm_head(x, ln_f, ln_f_bias, wte, !plan.head_fp32), targets);
}

void GPTImpl::set_attention_impl(AttentionImpl impl) {
  for (auto& b : blocks_) b->impl = impl;
}

void GPTImpl::set_stats_flag(const torch::Tensor& flag) {
  for (auto& b : blocks_) b->stats_on = flag;
}

void GPTImpl::set_sr_micro_batch(uint64_t seed, int64_t step, int64_t micro) {
  for (size_t l = 0; l < blocks_.size(); ++l)
    blocks_[l]->sr_key = kernels::sr_call_key(seed, step, micro, static_cast<int64_t>(l));
}

void GPTImpl::keep_bf16_weights(bool on) {
  keep_bf16_ = on;
  wte_bf16_ = torch::Tensor();
  for (auto& b : blocks_) {
    b->keep_bf16 = on;
    b->bf16 = {};
  }
}

KeepBf16Weights::KeepBf16Weights(GPT& model, bool want) : model_(model) {
  on_ = want && switches::on(switches::Switch::kBf16WeightCache);
  if (on_) model_->keep_bf16_weights(true);
}

KeepBf16Weights::~KeepBf16Weights() {
  if (on_) model_->keep_bf16_weights(false);
}

void GPTImpl::set_fast_path(FastPath fast) {
  for (auto& b : blocks_) b->fast = fast;
}

torch::Tensor GPTImpl::wq_slice(int layer, int head) const {
  const int64_t D = config_.head_dim();
  return blocks_[layer]->c_attn.slice(0, head * D, (head + 1) * D);
}

}  // namespace rwd::train
