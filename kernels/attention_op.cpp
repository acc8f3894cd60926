// The attention autograd op: validates tensors once, then calls the CPU emulation (or the
// CUDA launchers for CUDA tensors in REWIND_CUDA builds); plus the LibTorch baselines.
#include "kernels/attention_op.h"

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <torch/autograd.h>
#include <torch/version.h>

#include "kernels/attention_cpu.h"

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attention_cuda.h"
#endif

namespace rwd::kernels {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Everything the backward needs besides tensors; travels in ctx->saved_data as a capsule.
struct OpState : torch::CustomClassHolder {
  std::vector<HeadFlags> flags;
  AttentionParams params;  // params.flags points into `flags`; stats unused here
  std::shared_ptr<AttentionCapture> capture;
  torch::Tensor stats_on;   // AttentionOptions::stats_on
  bool need_o_f32 = false;  // some head reads unrounded O (o=fp32 or delta=fp32)
  bool need_f32_inputs = false;  // some head has an FP32 op: pass the FP32 q, k, v twins
  bool need_do_f32 = false;      // some head reads unrounded dO (bwd=fp32 or delta=fp32)
};

bool any_head(const std::vector<HeadFlags>& flags, Op op, Prec pr) {
  for (const auto& f : flags)
    if (f.prec[static_cast<int>(op)] == pr) return true;
  return false;
}

// The launch parameters of a (B, H, T, D) problem; flags and stats left for the caller.
AttentionParams params_for(c10::IntArrayRef bhtd, const AttentionOptions& opt) {
  AttentionParams p;
  p.batch = static_cast<int>(bhtd[0]);
  p.heads = static_cast<int>(bhtd[1]);
  p.seq = static_cast<int>(bhtd[2]);
  p.dim = static_cast<int>(bhtd[3]);
  p.scale = opt.scale;
  p.causal = opt.causal;
  p.naive = opt.naive;
  p.block_q = opt.block_q;
  p.block_k = opt.block_k;
  p.sr_key = opt.sr_key;
  return p;
}

c10::intrusive_ptr<OpState> make_state(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttentionOptions& opt,
                                       std::shared_ptr<AttentionCapture> capture) {
  TORCH_CHECK(q.dim() == 4, "attention: q must be (B, H, T, D), got ", q.sizes());
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "attention: q, k, v shapes differ: ", q.sizes(), " ", k.sizes(), " ", v.sizes());
  for (const Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == torch::kFloat32, "attention: q, k, v must be float32, got ",
                t->scalar_type());
    TORCH_CHECK(t->device() == q.device(), "attention: q, k, v must be on one device");
  }
  TORCH_CHECK(q.numel() > 0, "attention: empty input ", q.sizes());
  TORCH_CHECK(std::isfinite(opt.scale) && opt.scale != 0.0f, "attention: scale must be finite and nonzero");
  const int64_t heads = q.size(1);
  TORCH_CHECK(opt.flags.empty() || static_cast<int64_t>(opt.flags.size()) == heads,
              "attention: ", opt.flags.size(), " head flags for ", heads, " heads");
  auto st = c10::make_intrusive<OpState>();
  st->flags = opt.flags.empty() ? std::vector<HeadFlags>(heads) : opt.flags;
  st->params = params_for(q.sizes(), opt);
  st->capture = std::move(capture);
  st->stats_on = opt.stats_on;
  st->need_o_f32 = any_head(st->flags, Op::kO, Prec::kFp32) || any_head(st->flags, Op::kDelta, Prec::kFp32);
  for (int op = 0; op < kNumOps; ++op)
    st->need_f32_inputs |= any_head(st->flags, static_cast<Op>(op), Prec::kFp32);
  st->need_do_f32 = any_head(st->flags, Op::kBwd, Prec::kFp32) || any_head(st->flags, Op::kDelta, Prec::kFp32);
  st->params.flags = st->flags.data();
  return st;
}

// flags_on (CUDA builds) keys its cache on HeadFlags' fields one by one: a new field must join
// that key, or launches differing only in it would share one upload.
static_assert(sizeof(HeadFlags) == 48, "HeadFlags changed: add the new field to flags_on's key");

#ifdef REWIND_CUDA
// The launchers take device arrays of HeadFlags / HeadStats: raw bytes in a uint8 tensor.
Tensor bytes_on(const void* data, size_t n, const torch::Device& dev) {
  // Pinned, so the copy is queued on the stream: a pageable copy would wait for the GPU.
  Tensor host = torch::empty({static_cast<int64_t>(n)},
                             torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  std::memcpy(host.data_ptr(), data, n);
  return host.to(dev, /*non_blocking=*/true);
}
// A launch's head flags on the device, uploaded once per distinct flags and device and kept
// for the process (a few hundred bytes each; a bisect meets a few thousand at most). Besides
// saving a copy per launch, a CUDA graph of the step (train/step_graph.h) must find them
// there: a copy from pinned host memory inside a capture would read a buffer freed after it.
// A capture that meets flags not seen before throws, and the step runs eagerly instead.
Tensor flags_on(const std::vector<HeadFlags>& flags, const torch::Device& dev) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, std::string>, Tensor>();  // never destroyed
  const size_t n = flags.size() * sizeof(HeadFlags);
  std::pair<int, std::string> key(dev.has_index() ? dev.index() : at::cuda::current_device(), "");
  auto put = [&key](const void* p, size_t bytes) { key.second.append(static_cast<const char*>(p), bytes); };
  for (const HeadFlags& f : flags) {  // field by field: padding bytes are not part of the key
    put(f.prec, sizeof f.prec);
    put(f.fault, sizeof f.fault);
    const bool modes[7] = {f.s_bf16, f.acc_bf16, f.stable, f.delta_dpp, f.s_sr, f.pv_sr, f.acc_sr};
    put(modes, sizeof modes);
    put(&f.beta, sizeof f.beta);
    put(&f.eps, sizeof f.eps);
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream().stream(), &capturing) == cudaSuccess &&
                  capturing == cudaStreamCaptureStatusNone,
              "attention: head flags first met inside a CUDA graph capture");
  return cache->emplace(std::move(key), bytes_on(flags.data(), n, dev)).first->second;
}
uint16_t* bf16_ptr(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }
float* f32_ptr(const Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }
// A contiguous BF16 copy of a tensor of any strides and dtype: one kernel.
Tensor bf16_contiguous(const Tensor& t) {
  return torch::empty(t.sizes(), t.options().dtype(torch::kBFloat16)).copy_(t);
}
// Contiguous FP32 q, k, v for the heads that read them (an FP32 op); undefined otherwise.
struct F32Twins {
  Tensor q, k, v;
};
F32Twins f32_twins(const OpState& st, const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!st.need_f32_inputs) return {};
  return {q.contiguous(), k.contiguous(), v.contiguous()};
}
void check_cuda(int rc, const char* what) {
  TORCH_CHECK(rc == 0, "attention: CUDA ", what, " failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
}
// Heads whose output is FP32 (o=fp32) take o_f32, all others the BF16 O. The result is a
// (B,H,T,D) view of (B,T,H,D) memory: the layout the block's output projection reads, so the
// widening copy also does the head transpose.
Tensor assemble_output(const OpState& st, const Tensor& o_bf16, const Tensor& o_f32) {
  const auto& p = st.params;
  Tensor out = torch::empty({p.batch, p.seq, p.heads, p.dim}, o_bf16.options().dtype(torch::kFloat32))
                   .transpose(1, 2);
  out.copy_(o_bf16);
  for (int h = 0; h < st.params.heads; ++h)
    if (st.flags[h].prec[static_cast<int>(Op::kO)] == Prec::kFp32)
      out.select(1, h).copy_(o_f32.select(1, h));
  return out;
}
#endif

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  // q, k, v: FP32 (B,H,T,D); contiguous on the CPU, any strides on CUDA (the GPT block passes
  // views of its qkv projection: each operand costs one strided-read BF16 copy, no FP32 copy).
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        c10::intrusive_ptr<OpState> st) {
    const AttentionParams& base = st->params;
    const int64_t b = base.batch, h = base.heads, t = base.seq;
    const auto f32 = q.options().dtype(torch::kFloat32);
    Tensor lse = torch::empty({b, h, t}, f32);
    Tensor o_f32 = st->need_o_f32 ? torch::empty(q.sizes(), f32) : Tensor();
    std::vector<HeadStats> stats(st->capture ? h : 0);
    Tensor out, o_saved, stats_pending, qb, kb, vb;
    if (q.is_cuda()) {
#ifdef REWIND_CUDA
      AttentionParams p = base;
      Tensor flags_d = flags_on(st->flags, q.device());
      p.flags = reinterpret_cast<const HeadFlags*>(flags_d.data_ptr());
      Tensor stats_d;
      if (st->capture) {
        stats_d = torch::zeros({static_cast<int64_t>(h * sizeof(HeadStats))}, q.options().dtype(torch::kUInt8));
        p.stats = reinterpret_cast<HeadStats*>(stats_d.data_ptr());
      }
      qb = bf16_contiguous(q);
      kb = bf16_contiguous(k);
      vb = bf16_contiguous(v);
      const F32Twins tw = f32_twins(*st, q, k, v);
      Tensor o_bf16 = torch::empty_like(qb);
      cuda::ForwardArgs a;
      a.q = bf16_ptr(qb); a.k = bf16_ptr(kb); a.v = bf16_ptr(vb);
      a.q_f32 = f32_ptr(tw.q); a.k_f32 = f32_ptr(tw.k); a.v_f32 = f32_ptr(tw.v);
      a.o = bf16_ptr(o_bf16);
      a.o_f32 = f32_ptr(o_f32);
      a.lse = lse.data_ptr<float>();
      a.stats = p.stats;  // null without a capture: the kernels then skip all tie counting
      if (p.stats && st->stats_on.defined()) a.stats_on = st->stats_on.data_ptr<int>();
      a.host_flags = st->flags.data();  // same contents as flags_d: no device->host sync
      // The split-BF16 planes of the FP32 operands (empty unless some head promotes qk, pv or
      // softmax).
      Tensor split_ws = torch::empty({static_cast<int64_t>(cuda::forward_workspace_bytes(p, st->flags.data()))},
                                     q.options().dtype(torch::kUInt8));
      a.workspace = split_ws.numel() ? split_ws.data_ptr() : nullptr;
      check_cuda(cuda::attention_forward(p, a, at::cuda::getCurrentCUDAStream().stream()), "forward");
      out = assemble_output(*st, o_bf16, o_f32);
      o_saved = o_bf16;
      stats_pending = stats_d;  // fetched by fetch_stats(), after the step's loss
#else
      TORCH_CHECK(false, "attention: CUDA tensors need a REWIND_CUDA build");
#endif
    } else {
      TORCH_CHECK(q.is_cpu(), "attention: unsupported device ", q.device());
      AttentionParams p = base;
      p.stats = st->capture ? stats.data() : nullptr;
      out = torch::empty_like(q);
      attention_forward_cpu(p, q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                            out.data_ptr<float>(), lse.data_ptr<float>(),
                            o_f32.defined() ? o_f32.data_ptr<float>() : nullptr);
      o_saved = out;
    }
    if (auto& c = st->capture) {
      c->stats_pending = stats_pending;
      if (stats_pending.defined()) stats.clear();
      c->stats = stats;
    }
    if (auto& c = st->capture; c && c->keep_tensors) {
      c->q = q.contiguous().clone();
      c->k = k.contiguous().clone();
      c->v = v.contiguous().clone();
      c->o = out.contiguous().clone();
      c->lse = lse.clone();
    }
    // CUDA keeps the BF16 operands for the backward instead of converting q, k, v again.
    ctx->save_for_backward({q, k, v, o_saved, lse, o_f32, qb, kb, vb});
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto st = c10::static_intrusive_pointer_cast<OpState>(ctx->saved_data["state"].toCapsule());
    variable_list s = ctx->get_saved_variables();
    const Tensor &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4], &o_f32 = s[5];
    const auto f32 = q.options().dtype(torch::kFloat32);
    Tensor dq = torch::empty(q.sizes(), f32), dk = torch::empty(q.sizes(), f32),
           dv = torch::empty(q.sizes(), f32);
    Tensor delta = torch::empty_like(lse);
    const bool keep = st->capture && st->capture->keep_tensors;
    Tensor g;  // FP32 contiguous dO: the CPU path, captures, FP32-dO heads on CUDA
    if (!q.is_cuda() || keep || st->need_do_f32) {
      g = grad_out[0].defined() ? grad_out[0].to(torch::kFloat32).contiguous()
                                : torch::zeros(q.sizes(), f32);
    }
    if (q.is_cuda()) {
#ifdef REWIND_CUDA
      const Tensor &qb = s[6], &kb = s[7], &vb = s[8];
      AttentionParams p = st->params;
      Tensor flags_d = flags_on(st->flags, q.device());
      p.flags = reinterpret_cast<const HeadFlags*>(flags_d.data_ptr());
      Tensor gb = grad_out[0].defined() ? bf16_contiguous(grad_out[0])
                                        : torch::zeros(q.sizes(), q.options().dtype(torch::kBFloat16));
      const F32Twins tw = f32_twins(*st, q, k, v);
      Tensor ws = torch::empty({static_cast<int64_t>(cuda::backward_workspace_bytes(p, st->flags.data()))},
                               q.options().dtype(torch::kUInt8));
      cuda::BackwardArgs a;
      a.q = bf16_ptr(qb); a.k = bf16_ptr(kb); a.v = bf16_ptr(vb);
      a.q_f32 = f32_ptr(tw.q); a.k_f32 = f32_ptr(tw.k); a.v_f32 = f32_ptr(tw.v);
      a.o = bf16_ptr(o);
      a.o_f32 = f32_ptr(o_f32);
      a.d_o = bf16_ptr(gb);
      a.d_o_f32 = st->need_do_f32 ? f32_ptr(g) : nullptr;
      a.lse = lse.data_ptr<float>();
      a.delta = delta.data_ptr<float>();
      a.dq = dq.data_ptr<float>(); a.dk = dk.data_ptr<float>(); a.dv = dv.data_ptr<float>();
      a.workspace = ws.numel() ? ws.data_ptr() : nullptr;
      a.host_flags = st->flags.data();
      check_cuda(cuda::attention_backward(p, a, at::cuda::getCurrentCUDAStream().stream()), "backward");
#else
      TORCH_CHECK(false, "attention: CUDA tensors need a REWIND_CUDA build");
#endif
    } else {
      attention_backward_cpu(st->params, q.data_ptr<float>(), k.data_ptr<float>(),
                             v.data_ptr<float>(), o.data_ptr<float>(),
                             o_f32.defined() ? o_f32.data_ptr<float>() : nullptr,
                             g.data_ptr<float>(), lse.data_ptr<float>(), dq.data_ptr<float>(),
                             dk.data_ptr<float>(), dv.data_ptr<float>(), delta.data_ptr<float>());
    }
    if (keep) {
      st->capture->d_o = g.clone();
      st->capture->delta = delta.clone();
    }
    return {dq, dk, dv, Tensor()};
  }
};

Tensor causal_mask(int64_t t, const torch::Device& dev) {
  return torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(dev)).triu(1);
}

}  // namespace

void fetch_stats(AttentionCapture& c) { fetch_stats(std::vector<AttentionCapture*>{&c}); }

void fetch_stats(const std::vector<AttentionCapture*>& caps) {
  std::vector<Tensor> pending;
  for (AttentionCapture* c : caps)
    if (c && c->stats_pending.defined()) pending.push_back(c->stats_pending);
  if (pending.empty()) return;
  const Tensor host = (pending.size() == 1 ? pending[0] : torch::cat(pending)).to(torch::kCPU);
  const uint8_t* at = host.data_ptr<uint8_t>();
  for (AttentionCapture* c : caps) {
    if (!c || !c->stats_pending.defined()) continue;
    const int64_t bytes = c->stats_pending.numel();
    c->stats.resize(static_cast<size_t>(bytes) / sizeof(HeadStats));
    std::memcpy(c->stats.data(), at, c->stats.size() * sizeof(HeadStats));
    at += bytes;
    c->stats_pending = Tensor();
  }
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt,
                 std::shared_ptr<AttentionCapture> capture) {
  auto st = make_state(q, k, v, opt, std::move(capture));
  if (q.is_cuda()) return AttentionFunction::apply(q, k, v, st);  // strided views welcome
  return AttentionFunction::apply(q.contiguous(), k.contiguous(), v.contiguous(), st);
}

bool bf16_attention_ok(const std::vector<HeadFlags>& flags) {
  for (const auto& f : flags)
    for (Prec pr : f.prec)
      if (pr == Prec::kFp32) return false;
  return true;
}

namespace {
// Checks the fast path's operands and returns its launch parameters (flags: host copy).
AttentionParams bf16_params(const Tensor& qkv, const AttentionOptions& opt,
                            std::vector<HeadFlags>& flags) {
  TORCH_CHECK(qkv.dim() == 5 && qkv.size(0) == 3 && qkv.scalar_type() == torch::kBFloat16 &&
                  qkv.is_contiguous(),
              "attention_bf16: qkv must be contiguous BF16 (3, B, H, T, D), got ", qkv.sizes(),
              " ", qkv.scalar_type());
  TORCH_CHECK(bf16_attention_ok(opt.flags), "attention_bf16: a head promotes an op to FP32");
  const auto bhtd = qkv.sizes().slice(1);
  flags = opt.flags.empty() ? std::vector<HeadFlags>(bhtd[1]) : opt.flags;
  TORCH_CHECK(static_cast<int64_t>(flags.size()) == bhtd[1], "attention_bf16: ", flags.size(),
              " head flags for ", bhtd[1], " heads");
  AttentionParams p = params_for(bhtd, opt);
  p.flags = flags.data();
  return p;
}
}  // namespace

Tensor attention_bf16_forward(const Tensor& qkv, const AttentionOptions& opt,
                              AttentionCapture* capture, Tensor& lse) {
  std::vector<HeadFlags> flags;
  AttentionParams p = bf16_params(qkv, opt, flags);
  TORCH_CHECK(!capture || !capture->keep_tensors, "attention_bf16: tensor captures take attention()");
  const auto f32 = qkv.options().dtype(torch::kFloat32);
  lse = torch::empty({p.batch, p.heads, p.seq}, f32);
  if (!qkv.is_cuda()) {  // the CPU emulation on widened copies: tests of the fast path's plumbing
    const Tensor x = qkv.to(torch::kFloat32);
    Tensor o = torch::empty(qkv.sizes().slice(1), f32);
    std::vector<HeadStats> stats(capture ? p.heads : 0);
    p.stats = capture ? stats.data() : nullptr;
    attention_forward_cpu(p, x[0].data_ptr<float>(), x[1].data_ptr<float>(), x[2].data_ptr<float>(),
                          o.data_ptr<float>(), lse.data_ptr<float>(), nullptr);
    if (capture) capture->stats = stats;
    return o.to(torch::kBFloat16);
  }
#ifdef REWIND_CUDA
  Tensor flags_d = flags_on(flags, qkv.device());
  p.flags = reinterpret_cast<const HeadFlags*>(flags_d.data_ptr());
  Tensor stats_d;
  if (capture) {
    stats_d = torch::zeros({static_cast<int64_t>(p.heads * sizeof(HeadStats))}, qkv.options().dtype(torch::kUInt8));
    p.stats = reinterpret_cast<HeadStats*>(stats_d.data_ptr());
  }
  Tensor o = torch::empty(qkv.sizes().slice(1), qkv.options());
  cuda::ForwardArgs a;
  a.q = bf16_ptr(qkv[0]); a.k = bf16_ptr(qkv[1]); a.v = bf16_ptr(qkv[2]);
  a.o = bf16_ptr(o);
  a.lse = lse.data_ptr<float>();
  a.stats = p.stats;
  if (p.stats && opt.stats_on.defined()) a.stats_on = opt.stats_on.data_ptr<int>();
  a.host_flags = flags.data();
  check_cuda(cuda::attention_forward(p, a, at::cuda::getCurrentCUDAStream().stream()), "forward");
  if (capture) {
    capture->stats.clear();
    capture->stats_pending = stats_d;
  }
  return o;
#else
  TORCH_CHECK(false, "attention: CUDA tensors need a REWIND_CUDA build");
#endif
}

Tensor attention_bf16_backward(const Tensor& qkv, const Tensor& o, const Tensor& lse,
                               const Tensor& d_o, const AttentionOptions& opt) {
  std::vector<HeadFlags> flags;
  AttentionParams p = bf16_params(qkv, opt, flags);
  for (const Tensor* t : {&o, &d_o})
    TORCH_CHECK(t->sizes() == qkv.sizes().slice(1) && t->scalar_type() == torch::kBFloat16 &&
                    t->is_contiguous(),
                "attention_bf16: o and d_o must be contiguous BF16 (B, H, T, D)");
  const auto f32 = qkv.options().dtype(torch::kFloat32);
  Tensor dqkv = torch::empty(qkv.sizes(), f32);
  Tensor delta = torch::empty_like(lse);
  if (!qkv.is_cuda()) {
    const Tensor x = qkv.to(torch::kFloat32), of = o.to(torch::kFloat32), gf = d_o.to(torch::kFloat32);
    attention_backward_cpu(p, x[0].data_ptr<float>(), x[1].data_ptr<float>(), x[2].data_ptr<float>(),
                           of.data_ptr<float>(), nullptr, gf.data_ptr<float>(), lse.data_ptr<float>(),
                           dqkv[0].data_ptr<float>(), dqkv[1].data_ptr<float>(), dqkv[2].data_ptr<float>(),
                           delta.data_ptr<float>());
    return dqkv;
  }
#ifdef REWIND_CUDA
  Tensor flags_d = flags_on(flags, qkv.device());
  p.flags = reinterpret_cast<const HeadFlags*>(flags_d.data_ptr());
  cuda::BackwardArgs a;
  a.q = bf16_ptr(qkv[0]); a.k = bf16_ptr(qkv[1]); a.v = bf16_ptr(qkv[2]);
  a.o = bf16_ptr(o);
  a.d_o = bf16_ptr(d_o);
  a.lse = lse.data_ptr<float>();
  a.delta = delta.data_ptr<float>();
  a.dq = dqkv[0].data_ptr<float>(); a.dk = dqkv[1].data_ptr<float>(); a.dv = dqkv[2].data_ptr<float>();
  a.host_flags = flags.data();
  Tensor ws = torch::empty({static_cast<int64_t>(cuda::backward_workspace_bytes(p, flags.data()))},
                           qkv.options().dtype(torch::kUInt8));  // dS tiles (D = 128)
  a.workspace = ws.numel() ? ws.data_ptr() : nullptr;
  check_cuda(cuda::attention_backward(p, a, at::cuda::getCurrentCUDAStream().stream()), "backward");
  return dqkv;
#else
  TORCH_CHECK(false, "attention: CUDA tensors need a REWIND_CUDA build");
#endif
}

Tensor attention_plain_bf16(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            bool causal) {
  auto rb = [](const Tensor& x) { return x.to(torch::kBFloat16).to(torch::kFloat32); };
  Tensor qb = rb(q), kb = rb(k), vb = rb(v);
  Tensor s = rb(rb(torch::matmul(qb, kb.transpose(-2, -1))) * scale);  // (B, H, T, T)
  if (causal) s = s.masked_fill(causal_mask(q.size(2), q.device()), -INFINITY);
  Tensor p = torch::softmax(s, -1);
  return rb(torch::matmul(rb(p), vb));
}

Tensor attention_torch_fp32(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            bool causal) {
  Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;  // (B, H, T, T)
  if (causal) s = s.masked_fill(causal_mask(q.size(2), q.device()), -INFINITY);
  return torch::matmul(torch::softmax(s, -1), v);
}

Tensor attention_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q.to(torch::kBFloat16), k.to(torch::kBFloat16),
                                          v.to(torch::kBFloat16), {}, 0.0, causal);
#else
  (void)q, (void)k, (void)v, (void)causal;
  TORCH_CHECK(false, "attention_sdpa needs LibTorch >= 2.0 (scaled_dot_product_attention); this "
              "build uses ", TORCH_VERSION);
#endif
}

}  // namespace rwd::kernels
