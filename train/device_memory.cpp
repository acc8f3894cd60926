// Peak GPU memory from the CUDA caching allocator's device statistics.
#include "train/device_memory.h"

#include <cstdio>

#ifdef REWIND_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace rwd::train {

std::string peak_memory_report(const torch::Device& device) {
  if (!device.is_cuda()) return "";
#ifdef REWIND_CUDA
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  constexpr size_t kAggregate = 0;  // StatType::AGGREGATE: the small and the large pool together
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char line[160];
  std::snprintf(line, sizeof line, "peak GPU memory: %.2f GiB allocated, %.2f GiB reserved (cuda:%d)",
                static_cast<double>(stats.allocated_bytes[kAggregate].peak) / kGiB,
                static_cast<double>(stats.reserved_bytes[kAggregate].peak) / kGiB, static_cast<int>(index));
  return line;
#else
  return "";
#endif
}

}  // namespace rwd::train
