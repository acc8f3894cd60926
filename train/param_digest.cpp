// The parameter digest every recorded step carries (d2: FNV-1a over each parameter's word
// count and position-weighted word sum), on the CPU or queued behind a GPU's work, and the
// word sums it is made of (also summed by gradient buckets).
#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <memory>

#include "common/error.h"
#include "common/hash.h"
#include "train/trainer.h"
#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include "kernels/cuda/param_digest.h"
#endif

namespace rwd::train {

namespace {

const std::string kDigestPrefix = "d2:";

// The d2 digest's word count per parameter (FP32: 4-byte words).
std::vector<int64_t> digest_words(const std::vector<torch::Tensor>& params) {
  std::vector<int64_t> words;
  for (const auto& p : params) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (bytes % 4 != 0) throw Error(ExitCode::kInternal, "param_digest: a parameter's size is not a whole number of 32-bit words");
    words.push_back(bytes / 4);
  }
  return words;
}

// d2: FNV-1a over each tensor's word count and its position-weighted word sum.
std::string digest_of(const std::vector<int64_t>& words, const uint64_t* sums) {
  uint64_t h = kFnvOffset;
  for (size_t k = 0; k < words.size(); ++k) {
    h = fnv1a64(&words[k], sizeof(int64_t), h);
    h = fnv1a64(&sums[k], sizeof(uint64_t), h);
  }
  return kDigestPrefix + hex64(h);
}

}  // namespace

std::string Trainer::param_digest(const std::string& like) const {
  if (!like.empty() && like.rfind(kDigestPrefix, 0) != 0) {  // recorded before digest d2
    uint64_t h = kFnvOffset;
    for (const auto& p : params_) {
      torch::Tensor c = p.detach().to(torch::kCPU).contiguous();
      h = fnv1a64(c.data_ptr(), c.numel() * c.element_size(), h);
    }
    return hex64(h);
  }
  return param_digest_queued()();
}

std::function<std::string()> Trainer::param_digest_queued() const { return queue_param_digest(params_); }

std::function<std::string()> Trainer::digest_from_sums(const torch::Tensor& sums) const {
  return queue_digest_of_sums(sums, digest_words(params_));
}

void add_word_sums(const std::vector<torch::Tensor>& tensors, torch::Tensor& sums, int64_t offset) {
  const size_t n = tensors.size();
  if (n == 0) return;
  std::vector<torch::Tensor> flat(n);
  for (size_t k = 0; k < n; ++k) flat[k] = tensors[k].detach().contiguous();
  const std::vector<int64_t> words = digest_words(flat);
  if (sums.scalar_type() != torch::kInt64 || !sums.is_contiguous() || offset < 0 ||
      offset + static_cast<int64_t>(n) > sums.numel())
    throw Error(ExitCode::kInternal, "add_word_sums: sums must be a contiguous int64 tensor with room for every tensor");
  for (const torch::Tensor& t : flat)
    if (t.device() != sums.device())
      throw Error(ExitCode::kUsage, "param_digest: the tensors lie on more than one device");
  if (sums.is_cuda()) {
#ifdef REWIND_CUDA
    const c10::DeviceGuard on_device(sums.device());
    auto* out = reinterpret_cast<unsigned long long*>(sums.data_ptr<int64_t>()) + offset;
    std::vector<kernels::cuda::DigestSegment> segs(n);
    for (size_t k = 0; k < n; ++k) segs[k] = {static_cast<const uint32_t*>(flat[k].data_ptr()), words[k], out + k};
    const int rc = kernels::cuda::digest_word_sums(segs.data(), static_cast<int>(n), at::cuda::getCurrentCUDAStream().stream());
    if (rc != 0) throw Error(ExitCode::kInternal, "param_digest: CUDA launch failed (error " + std::to_string(rc) + ")");
    return;
#else
    throw Error(ExitCode::kInternal, "param_digest: CUDA tensors need a REWIND_CUDA build");
#endif
  }
  if (!sums.is_cpu()) throw Error(ExitCode::kUsage, "param_digest: tensors on a device other than the CPU or CUDA");
  int64_t* out = sums.data_ptr<int64_t>() + offset;
  for (size_t k = 0; k < n; ++k) {
    const auto* w = static_cast<const uint32_t*>(flat[k].data_ptr());
    const uint64_t sum = at::parallel_reduce(
        0, words[k], 1 << 16, uint64_t{0},
        [w](int64_t b, int64_t e, uint64_t acc) {
          for (int64_t i = b; i < e; ++i) acc += digest_term(w[i], static_cast<uint64_t>(i));
          return acc;
        },
        [](uint64_t a, uint64_t b) { return a + b; });
    out[k] = static_cast<int64_t>(static_cast<uint64_t>(out[k]) + sum);  // wrapping, as on the GPU
  }
}

std::function<std::string()> queue_param_digest(const std::vector<torch::Tensor>& params) {
  const size_t n = params.size();
  const torch::Device device = n > 0 ? params[0].device() : torch::Device(torch::kCPU);
  // The sums' kernel, their copy and its event on the parameters' device's stream, whichever
  // device is current.
  const c10::DeviceGuard on_device(device);
  torch::Tensor sums = torch::zeros({static_cast<int64_t>(n)}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  add_word_sums(params, sums, 0);
  if (sums.is_cuda()) return queue_digest_of_sums(sums, digest_words(params));
  const std::string d = digest_of(digest_words(params), reinterpret_cast<const uint64_t*>(sums.data_ptr<int64_t>()));
  return [d] { return d; };
}

std::function<std::string()> queue_digest_of_sums(const torch::Tensor& sums, std::vector<int64_t> words) {
#ifdef REWIND_CUDA
  // The sums come back behind the work queued so far, into pinned memory; whoever calls the
  // result (the step writer, when recording) waits for that copy alone.
  auto host = std::make_shared<torch::Tensor>(
      torch::empty({sums.numel()}, torch::TensorOptions().dtype(torch::kInt64).pinned_memory(true)));
  host->copy_(sums, /*non_blocking=*/true);
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(at::cuda::getCurrentCUDAStream());
  return [host, done, words = std::move(words)] {
    done->synchronize();
    return digest_of(words, reinterpret_cast<const uint64_t*>(host->data_ptr<int64_t>()));
  };
#else
  (void)sums;
  (void)words;
  throw Error(ExitCode::kInternal, "param_digest: CUDA parameters need a REWIND_CUDA build");
#endif
}

}  // namespace rwd::train
