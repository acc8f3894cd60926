// Bytes: a std::vector<uint8_t> whose resize does not zero-fill. Used for buffers that are
// always overwritten right after they are sized (zstd frames, byte-shuffle scratch), where the
// zero-fill would be one more pass over up to 64 MiB per chunk, and on fresh pages the first.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace rwd::store {

// std::allocator whose value-less construct default-initializes (no zeroing for bytes).
template <class T>
struct UninitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() noexcept = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using Bytes = std::vector<uint8_t, UninitAllocator<uint8_t>>;

// Sizes `b` to n bytes of unspecified content, never copying the old content when it grows.
inline void resize_for_overwrite(Bytes& b, size_t n) {
  if (n > b.capacity()) b.clear();
  b.resize(n);
}

}  // namespace rwd::store
