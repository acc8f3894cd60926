// Byte shuffle / unshuffle; plain loops (the compiler vectorizes the fixed-size cases).
#include "store/byte_shuffle.h"

#include <cstring>

namespace rwd::store {
namespace {

template <size_t kElem>
void shuffle_fixed(const uint8_t* src, size_t n_elem, uint8_t* dst) {
  for (size_t i = 0; i < n_elem; ++i) {
    for (size_t k = 0; k < kElem; ++k) dst[k * n_elem + i] = src[i * kElem + k];
  }
}

template <size_t kElem>
void unshuffle_fixed(const uint8_t* src, size_t n_elem, uint8_t* dst) {
  for (size_t i = 0; i < n_elem; ++i) {
    for (size_t k = 0; k < kElem; ++k) dst[i * kElem + k] = src[k * n_elem + i];
  }
}

}  // namespace

void byte_shuffle(const uint8_t* src, size_t n, size_t elem, uint8_t* dst) {
  const size_t n_elem = elem > 1 ? n / elem : 0;
  switch (elem) {
    case 2:
      shuffle_fixed<2>(src, n_elem, dst);
      break;
    case 4:
      shuffle_fixed<4>(src, n_elem, dst);
      break;
    case 8:
      shuffle_fixed<8>(src, n_elem, dst);
      break;
    default:
      for (size_t i = 0; i < n_elem; ++i) {
        for (size_t k = 0; k < elem; ++k) dst[k * n_elem + i] = src[i * elem + k];
      }
  }
  const size_t done = n_elem * elem;
  if (n > done) std::memcpy(dst + done, src + done, n - done);
}

void byte_unshuffle(const uint8_t* src, size_t n, size_t elem, uint8_t* dst) {
  const size_t n_elem = elem > 1 ? n / elem : 0;
  switch (elem) {
    case 2:
      unshuffle_fixed<2>(src, n_elem, dst);
      break;
    case 4:
      unshuffle_fixed<4>(src, n_elem, dst);
      break;
    case 8:
      unshuffle_fixed<8>(src, n_elem, dst);
      break;
    default:
      for (size_t i = 0; i < n_elem; ++i) {
        for (size_t k = 0; k < elem; ++k) dst[i * elem + k] = src[k * n_elem + i];
      }
  }
  const size_t done = n_elem * elem;
  if (n > done) std::memcpy(dst + done, src + done, n - done);
}

}  // namespace rwd::store
