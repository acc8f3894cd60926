// 3xTF32 GEMMs for the FP32 linears on a GPU (see fp32_gemm.h). The split runs in our kernel
// (kernels/cuda/tf32_split.cu); the GEMMs are LibTorch's cuBLAS calls with TF32 allowed for
// exactly these calls (a guard restores the setting, which setup_device leaves off).
#include "train/fp32_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/switches.h"
#include "kernels/cuda/tf32_split.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace rwd::train {

namespace {

// The Fp32Gemm the environment asks for (the default: kSimt).
int env_gemm() {
  const bool split = switches::text(switches::Switch::kFp32Gemm) == "3xtf32";
  return static_cast<int>(split ? Fp32Gemm::kSplitTf32 : Fp32Gemm::kSimt);
}

std::atomic<int>& mode() {
  static std::atomic<int> m(env_gemm());
  return m;
}

// TF32 allowed in cuBLAS for one scope. Only the autograd thread running a step issues GEMMs
// (forward on the caller's thread, backward on the device thread, never at once), so the
// process-wide flag is not seen by another GEMM meanwhile.
class AllowTf32 {
 public:
  AllowTf32() : was_(at::globalContext().allowTF32CuBLAS()) { at::globalContext().setAllowTF32CuBLAS(true); }
  ~AllowTf32() { at::globalContext().setAllowTF32CuBLAS(was_); }
  AllowTf32(const AllowTf32&) = delete;
  AllowTf32& operator=(const AllowTf32&) = delete;

 private:
  bool was_;
};

}  // namespace

Fp32Gemm fp32_gemm() { return static_cast<Fp32Gemm>(mode().load()); }
void set_fp32_gemm(Fp32Gemm g) { mode().store(static_cast<int>(g)); }
bool fp32_gemm_from_env() { return switches::is_set(switches::Switch::kFp32Gemm); }

bool split_fp32_gemm(const torch::Tensor& t) { return t.is_cuda() && fp32_gemm() == Fp32Gemm::kSplitTf32; }

std::pair<torch::Tensor, torch::Tensor> split_tf32(const torch::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "split_tf32: FP32 input, got ", x.scalar_type());
  const torch::Tensor xc = x.contiguous();
  // hi, then lo, each starting 16-byte aligned (cuBLAS's fastest kernels and our vector path).
  const int64_t n = xc.numel(), stride = (n + 3) / 4 * 4;
  torch::Tensor both = torch::empty({2, stride}, xc.options());
  torch::Tensor hi = both[0].narrow(0, 0, n).view(xc.sizes()), lo = both[1].narrow(0, 0, n).view(xc.sizes());
  if (xc.is_cuda()) {
#ifdef REWIND_CUDA
    const int rc = kernels::cuda::tf32_split(xc.data_ptr<float>(), xc.numel(), hi.data_ptr<float>(),
                                             lo.data_ptr<float>(), at::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(rc == 0, "split_tf32: CUDA launch failed (error ", rc, ")");
    return {hi, lo};
#else
    TORCH_CHECK(false, "split_tf32: CUDA tensors need a REWIND_CUDA build");
#endif
  }
  const float* px = xc.data_ptr<float>();
  float* ph = hi.data_ptr<float>();
  float* pl = lo.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) kernels::cuda::tf32_split_one(px[i], ph[i], pl[i]);
  return {hi, lo};
}

Tf32Parts tf32_parts(const torch::Tensor& x, bool exact) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "tf32_parts: 2-D FP32, got ", x.sizes(), " ",
              x.scalar_type());
  if (exact) return {x, torch::Tensor()};
  const bool transposed = !x.is_contiguous() && x.t().is_contiguous();
  auto [hi, lo] = split_tf32(transposed ? x.t() : x);
  Tf32Parts p{hi, lo};
  return transposed ? p.t() : p;
}

torch::Tensor split_tf32_mm(const Tf32Parts& a, const Tf32Parts& b) {
  TORCH_CHECK(a.hi.dim() == 2 && b.hi.dim() == 2 && a.hi.size(1) == b.hi.size(0),
              "split_tf32_mm: (M, K) x (K, N), got ", a.hi.sizes(), " and ", b.hi.sizes());
  std::optional<AllowTf32> tf32;
  if (a.hi.is_cuda()) tf32.emplace();
  if (!a.lo.defined() && !b.lo.defined()) return at::mm(a.hi, b.hi);  // exact products
  // The small products (each term at most 2^-11 of the big one's) summed apart first.
  torch::Tensor out;
  if (!a.lo.defined()) {
    out = at::mm(a.hi, b.lo);
  } else if (!b.lo.defined()) {
    out = at::mm(a.lo, b.hi);
  } else {
    out = at::mm(a.hi, b.lo);
    out.addmm_(a.lo, b.hi);
  }
  // out = a_hi b_hi + out: the big product's FP32 accumulator plus the small sum, one rounding
  // (cuBLAS's beta = 1 epilogue).
  out.addmm_(a.hi, b.hi);
  return out;
}

torch::Tensor split_tf32_mm(const torch::Tensor& a, const torch::Tensor& b, bool a_exact, bool b_exact) {
  return split_tf32_mm(tf32_parts(a, a_exact), tf32_parts(b, b_exact));
}

}  // namespace rwd::train
