// StateStager: host copies of a training state through a device snapshot or pinned buffers.
#include "train/state_stager.h"

#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace rwd::train {

// The device copy of the state's device tensors (GPU runs) and the checkpoint writer's pinned
// host buffers for it. `busy` from stage() until the writer's take() has the bytes on the host
// (or its job is dropped): the next stage() waits for that, and ready() tells it beforehand.
struct StateStager::Snapshot {
  std::vector<torch::Tensor> bufs;    // device copies of the state's device tensors, in order
  std::vector<torch::Tensor> host;    // the writer's host copies of bufs (pageable; its thread allocates them)
  std::shared_ptr<void> ring;         // the writer's two pinned chunks the copies pass through
  bool off = false;                   // too little free device memory, or a failed allocation: unused
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false;
};

namespace {

using Shapes = std::vector<std::pair<std::vector<int64_t>, at::ScalarType>>;

Shapes shapes_of(const std::vector<torch::Tensor>& ts) {
  Shapes out;
  for (const torch::Tensor& t : ts) out.emplace_back(t.sizes().vec(), t.scalar_type());
  return out;
}

// Page-locked host tensors of `shapes`. On a CUDA build in one block (one cudaHostAlloc;
// LibTorch's pinned allocator would round each tensor up to a power of two and take its own
// lock, which the loop's own pin_memory() calls share, for the whole allocation).
std::vector<torch::Tensor> pinned_set(const Shapes& shapes) {
  std::vector<torch::Tensor> out;
#ifdef REWIND_CUDA
  constexpr size_t kAlign = 256;
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const auto& [sizes, dtype] : shapes) {
    offsets.push_back(total);
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    total += (static_cast<size_t>(n) * c10::elementSize(dtype) + kAlign - 1) / kAlign * kAlign;
  }
  void* base = nullptr;
  if (total > 0 && cudaHostAlloc(&base, total, cudaHostAllocDefault) == cudaSuccess) {
    std::shared_ptr<void> block(base, [](void* p) { cudaFreeHost(p); });
    for (size_t i = 0; i < shapes.size(); ++i)
      out.push_back(torch::from_blob(static_cast<char*>(base) + offsets[i], shapes[i].first, [block](void*) {},
                                     torch::TensorOptions().dtype(shapes[i].second)));
    return out;
  }
  (void)cudaGetLastError();  // no block of that size: LibTorch's allocator, a tensor at a time
#endif
  for (const auto& [sizes, dtype] : shapes)
    out.push_back(torch::empty(sizes, torch::TensorOptions().dtype(dtype).pinned_memory(true)));
  return out;
}

#ifdef REWIND_CUDA
// Copies the contiguous device tensors `src` into the contiguous host tensors `dst` through two
// pinned chunks of `chunk` bytes at `ring` in turn, on `stream`: the D2H copy of one chunk runs
// while the host copies the other out. A 1.5 GB pinned block for the whole state took 0.67 s to
// allocate, and the allocation held up the training loop's CUDA calls (the driver's lock); the
// chunks are allocated once (64 MiB) and the host copies are plain memory.
void copy_through_ring(const std::vector<torch::Tensor>& src, std::vector<torch::Tensor>& dst, char* ring,
                       size_t chunk, at::cuda::CUDAStream stream) {
  struct Piece {
    const char* from;
    char* to;
    size_t bytes, at;
  };
  std::vector<std::vector<Piece>> chunks(1);
  size_t used = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    const char* from = static_cast<const char*>(src[i].data_ptr());
    char* to = static_cast<char*>(dst[i].data_ptr());
    for (size_t left = src[i].nbytes(); left > 0;) {
      if (used == chunk) {
        chunks.emplace_back();
        used = 0;
      }
      const size_t n = std::min(left, chunk - used);
      chunks.back().push_back({from, to, n, used});
      from += n;
      to += n;
      left -= n;
      used += n;
    }
  }
  at::cuda::CUDAEvent done[2];
  auto drain = [&](size_t k) {
    done[k % 2].synchronize();
    for (const Piece& p : chunks[k]) std::memcpy(p.to, ring + (k % 2) * chunk + p.at, p.bytes);
  };
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k >= 2) drain(k - 2);
    for (const Piece& p : chunks[k]) {
      const cudaError_t e =
          cudaMemcpyAsync(ring + (k % 2) * chunk + p.at, p.from, p.bytes, cudaMemcpyDeviceToHost, stream.stream());
      if (e != cudaSuccess) throw std::runtime_error(std::string("checkpoint copy to the host: ") + cudaGetErrorString(e));
    }
    done[k % 2].record(stream);
  }
  for (size_t k = chunks.size() >= 2 ? chunks.size() - 2 : 0; k < chunks.size(); ++k) drain(k);
}

// Whether `snap` can hold `dev`, allocating it on first use (or when the state's tensors
// changed) where the device has the room: the state's size, a quarter more, and 1 GiB to
// spare for the training that goes on.
bool snapshot_fits(StateStager::Snapshot& snap, const std::vector<torch::Tensor>& dev) {
  if (snap.off) return false;
  if (shapes_of(snap.bufs) == shapes_of(dev)) return true;
  snap.bufs.clear();
  size_t bytes = 0, free = 0, total = 0;
  for (const torch::Tensor& t : dev) bytes += t.nbytes();
  if (cudaMemGetInfo(&free, &total) != cudaSuccess || free < bytes + bytes / 4 + (size_t{1} << 30)) {
    snap.off = true;
    return false;
  }
  try {
    for (const torch::Tensor& t : dev) snap.bufs.push_back(torch::empty_like(t, at::MemoryFormat::Contiguous));
  } catch (const c10::Error&) {
    snap.bufs.clear();
    snap.off = true;
  }
  return !snap.off;
}
#endif

// Copies `dev` into `pinned` on a side stream, after the work queued so far on the current
// stream (the last step's update); the state's next update waits for the copy on the device
// (through set_before_update, or at once). Returns what blocks until the copy is done.
std::function<void()> copy_to_pinned(const std::vector<torch::Tensor>& dev, std::vector<torch::Tensor>& pinned,
                                     const std::function<void(std::function<void()>)>& set_before_update) {
#ifdef REWIND_CUDA
  const c10::DeviceIndex index = dev.front().device().index();
  at::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream(index);
  at::cuda::CUDAStream side = at::cuda::getStreamFromPool(false, index);
  at::cuda::CUDAEvent state_ready;
  state_ready.record(main);
  state_ready.block(side);
  auto copied = std::make_shared<at::cuda::CUDAEvent>();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    for (size_t i = 0; i < dev.size(); ++i) {
      dev[i].record_stream(side);  // not reused by the allocator before the copy
      pinned[i].copy_(dev[i], /*non_blocking=*/true);
    }
  }
  copied->record(side);
  if (set_before_update) {
    // Waiting again on a finished copy costs nothing, so the hook stays until the next one.
    set_before_update([copied, index] { copied->block(at::cuda::getCurrentCUDAStream(index)); });
  } else {
    copied->block(main);
  }
  return [copied] { copied->synchronize(); };
#else
  (void)set_before_update;
  for (size_t i = 0; i < dev.size(); ++i) pinned[i].copy_(dev[i]);
  return {};
#endif
}

}  // namespace

bool StateStager::ready() const {
  if (snap_ && !snap_->off) {
    std::lock_guard<std::mutex> lock(snap_->mu);
    return !snap_->busy;
  }
  return !(pinned_next_ == 1 && pinned_spare_.valid() &&
           pinned_spare_.wait_for(std::chrono::seconds(0)) != std::future_status::ready);
}

StateStager::Staged StateStager::stage(const NamedTensors& state,
                                       const std::function<void(std::function<void()>)>& set_before_update) {
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // The host tensors cloned here; the device ones' host copies fill their places in take().
  std::vector<std::string> names;
  std::vector<torch::Tensor> host;
  std::vector<size_t> dev_at;
  std::vector<torch::Tensor> dev;
  for (const auto& [name, t] : state) {
    names.push_back(name);
    torch::Tensor d = t.detach();
    host.push_back(d.is_cpu() ? d.clone() : torch::Tensor());
    if (!d.is_cpu()) {
      dev_at.push_back(host.size() - 1);
      dev.push_back(d);
    }
  }
  auto assemble = [names = std::move(names), host = std::move(host), dev_at](const std::vector<torch::Tensor>& copies) {
    NamedTensors out;
    for (size_t i = 0, j = 0; i < names.size(); ++i)
      out.emplace_back(names[i], j < dev_at.size() && dev_at[j] == i ? copies[j++] : host[i]);
    return out;
  };
  Staged out;
  if (dev.empty()) {
    out.take = [assemble] { return assemble({}); };
    return out;
  }
#ifdef REWIND_CUDA
  if (!snap_) snap_ = std::make_shared<Snapshot>();
  {
    std::unique_lock<std::mutex> lock(snap_->mu);  // waits only where stage() came without ready()
    snap_->cv.wait(lock, [this] { return !snap_->busy; });
  }
  if (snapshot_fits(*snap_, dev)) {
    const c10::DeviceIndex index = dev.front().device().index();
    for (size_t i = 0; i < dev.size(); ++i) snap_->bufs[i].copy_(dev[i], /*non_blocking=*/true);
    auto copied_in = std::make_shared<at::cuda::CUDAEvent>();
    copied_in->record(at::cuda::getCurrentCUDAStream(index));
    {
      std::lock_guard<std::mutex> lock(snap_->mu);
      snap_->busy = true;
    }
    // Frees the snapshot once take() has the bytes, or when the writer drops the job.
    std::shared_ptr<int> release(new int(0), [snap = snap_](int* p) {
      delete p;
      {
        std::lock_guard<std::mutex> lock(snap->mu);
        snap->busy = false;
      }
      snap->cv.notify_all();
    });
    if (set_before_update) set_before_update({});
    out.buffer_seconds = seconds();
    out.take = [snap = snap_, copied_in, release, assemble = std::move(assemble), index]() mutable {
      c10::cuda::CUDAGuard on_device(index);
      at::cuda::CUDAStream side = at::cuda::getStreamFromPool(false, index);
      if (shapes_of(snap->host) != shapes_of(snap->bufs)) {
        snap->host.clear();
        for (const torch::Tensor& b : snap->bufs) snap->host.push_back(torch::empty(b.sizes(), b.options().device(torch::kCPU)));
      }
      constexpr size_t kChunk = size_t{32} << 20;
      if (!snap->ring) {
        void* p = nullptr;
        if (cudaHostAlloc(&p, 2 * kChunk, cudaHostAllocDefault) != cudaSuccess)
          throw std::runtime_error(std::string("checkpoint: no pinned host memory for its copy: ") +
                                   cudaGetErrorString(cudaGetLastError()));
        snap->ring = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
      }
      copied_in->block(side);
      copy_through_ring(snap->bufs, snap->host, static_cast<char*>(snap->ring.get()), kChunk, side);
      release.reset();  // the snapshot may take the next checkpoint's state
      return assemble(snap->host);
    };
    return out;
  }
#endif
  // No snapshot: pinned sets in turn, allocated on this thread (the second on a helper thread
  // while training runs on from the first checkpoint).
  if (pinned_next_ == 1 && pinned_spare_.valid()) pinned_[1] = pinned_spare_.get();
  std::vector<torch::Tensor>& pinned = pinned_[pinned_next_];
  pinned_next_ ^= 1;
  const Shapes shapes = shapes_of(dev);
  if (shapes_of(pinned) != shapes) pinned = pinned_set(shapes);
  if (pinned_[1].empty() && !pinned_spare_.valid())
    pinned_spare_ = std::async(std::launch::async, [shapes] { return pinned_set(shapes); });
  out.buffer_seconds = seconds();
  std::function<void()> wait = copy_to_pinned(dev, pinned, set_before_update);
  out.take = [wait = std::move(wait), assemble = std::move(assemble), copies = pinned] {
    if (wait) wait();
    return assemble(copies);
  };
  return out;
}

}  // namespace rwd::train
