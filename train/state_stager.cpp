// StateStager: host copies of a training state through pinned buffers and a device snapshot.
#include "train/state_stager.h"

#include <optional>
#include <utility>

#ifdef REWIND_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace rwd::train {

namespace {

// Page-locked host memory for a device tensor's copy.
torch::Tensor pinned_empty(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return torch::empty(sizes, torch::TensorOptions().dtype(dtype).pinned_memory(true));
}

using Copies = std::vector<std::pair<torch::Tensor*, torch::Tensor>>;  // (pinned buffer, source)

#ifdef REWIND_CUDA
// Whether `snap` can hold the device tensors of `copies`, allocating it on first use (or when
// a shape changed) where the device has the room: the state's size, a quarter more, and 1 GiB
// to spare for the training that goes on.
bool device_snapshot_ready(DeviceSnapshot& snap, const Copies& copies) {
  if (snap.off) return false;
  bool same = snap.bufs.size() == copies.size();
  for (size_t i = 0; same && i < copies.size(); ++i)
    same = snap.bufs[i].sizes() == copies[i].second.sizes() && snap.bufs[i].dtype() == copies[i].second.dtype();
  if (same) return true;
  snap.bufs.clear();
  size_t bytes = 0, free = 0, total = 0;
  for (const auto& c : copies) bytes += c.second.nbytes();
  if (cudaMemGetInfo(&free, &total) != cudaSuccess || free < bytes + bytes / 4 + (size_t{1} << 30)) {
    snap.off = true;
    return false;
  }
  try {
    for (const auto& c : copies) snap.bufs.push_back(torch::empty_like(c.second, at::MemoryFormat::Contiguous));
  } catch (const c10::Error&) {
    snap.bufs.clear();
    snap.off = true;
  }
  return !snap.off;
}
#endif

// Copies device tensors into their pinned host buffers on a side stream, after the work
// queued so far on the current stream (the last step's update). Through the device snapshot
// where there is one (the training stream copies the state there first, and training goes
// on); else the state's next update waits for the copy on the device (set_before_update, or
// at once). Returns what blocks until the copy is done.
std::function<void()> copy_from_device(const Copies& copies, DeviceSnapshot& snap,
                                       const std::function<void(std::function<void()>)>& set_before_update) {
#ifdef REWIND_CUDA
  const c10::DeviceIndex dev = copies.front().second.device().index();
  at::cuda::CUDAStream main = at::cuda::getCurrentCUDAStream(dev);
  at::cuda::CUDAStream side = at::cuda::getStreamFromPool(false, dev);
  const bool via_snapshot = device_snapshot_ready(snap, copies);
  if (via_snapshot) {
    // The previous checkpoint's host copy has read the snapshot before it is overwritten.
    if (snap.last_copy) static_cast<at::cuda::CUDAEvent*>(snap.last_copy.get())->block(main);
    for (size_t i = 0; i < copies.size(); ++i) snap.bufs[i].copy_(copies[i].second, /*non_blocking=*/true);
  }
  at::cuda::CUDAEvent state_ready;
  state_ready.record(main);
  state_ready.block(side);
  auto copied = std::make_shared<at::cuda::CUDAEvent>();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    for (size_t i = 0; i < copies.size(); ++i) {
      const torch::Tensor& src = via_snapshot ? snap.bufs[i] : copies[i].second;
      if (!via_snapshot) src.record_stream(side);  // not reused by the allocator before the copy
      copies[i].first->copy_(src, /*non_blocking=*/true);
    }
  }
  copied->record(side);
  if (via_snapshot) {
    snap.last_copy = copied;
    if (set_before_update) set_before_update({});
  } else if (set_before_update) {
    // Waiting again on a finished copy costs nothing, so the hook stays until the next one.
    set_before_update([copied, dev] { copied->block(at::cuda::getCurrentCUDAStream(dev)); });
  } else {
    copied->block(main);
  }
  return [copied] { copied->synchronize(); };
#else
  (void)snap, (void)set_before_update;
  for (const auto& [buf, src] : copies) buf->copy_(src);
  return {};
#endif
}

}  // namespace

StateStager::Staged StateStager::stage(const NamedTensors& state,
                                       const std::function<void(std::function<void()>)>& set_before_update) {
  Staged out;
  if (pinned_next_ == 1 && pinned_spare_.valid()) pinned_[1] = pinned_spare_.get();
  std::vector<torch::Tensor>& pinned = pinned_[pinned_next_];
  pinned_next_ ^= 1;
  pinned.resize(state.size());
  Copies device_copies;
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, t] = state[i];
    torch::Tensor d = t.detach();
    if (d.is_cpu()) {
      out.host.emplace_back(name, d.clone());
      continue;
    }
    torch::Tensor& buf = pinned[i];  // allocated once, again only if a tensor changed shape
    if (!buf.defined() || buf.sizes() != d.sizes() || buf.scalar_type() != d.scalar_type())
      buf = pinned_empty(d.sizes(), d.scalar_type());
    device_copies.emplace_back(&buf, d);
    out.host.emplace_back(name, buf);
  }
  if (!device_copies.empty() && pinned_[1].empty() && !pinned_spare_.valid()) {
    // The second set, shaped like the first (undefined where a tensor lives on the host).
    std::vector<std::optional<std::pair<std::vector<int64_t>, at::ScalarType>>> shapes;
    for (const torch::Tensor& b : pinned) {
      shapes.emplace_back();
      if (b.defined()) shapes.back().emplace(b.sizes().vec(), b.scalar_type());
    }
    pinned_spare_ = std::async(std::launch::async, [shapes = std::move(shapes)] {
      std::vector<torch::Tensor> set(shapes.size());
      for (size_t i = 0; i < shapes.size(); ++i)
        if (shapes[i]) set[i] = pinned_empty(shapes[i]->first, shapes[i]->second);
      return set;
    });
  }
  if (!device_copies.empty()) out.wait_ready = copy_from_device(device_copies, snapshot_, set_before_update);
  return out;
}

}  // namespace rwd::train
