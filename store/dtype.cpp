// Dtype tables, BF16 conversions and the tiny JSON shape codec (a store needs no JSON library).
#include "store/dtype.h"

#include <cstring>

#include "common/bf16.h"
#include "store/store_error.h"

namespace rwd::store {
namespace {

struct DtypeInfo {
  Dtype dtype;
  size_t size;
  const char* name;
  const char* npy;
};

constexpr DtypeInfo kTable[] = {
    {Dtype::kF32, 4, "f32", "<f4"},   {Dtype::kF64, 8, "f64", "<f8"},
    {Dtype::kBF16, 2, "bf16", "<f4"}, {Dtype::kF16, 2, "f16", "<f2"},
    {Dtype::kI64, 8, "i64", "<i8"},   {Dtype::kI32, 4, "i32", "<i4"},
    {Dtype::kU16, 2, "u16", "<u2"},   {Dtype::kU8, 1, "u8", "|u1"},
    {Dtype::kBool, 1, "bool", "|b1"},
};

const DtypeInfo& info(Dtype d) {
  for (const DtypeInfo& i : kTable) {
    if (i.dtype == d) return i;
  }
  throw StoreError(ExitCode::kInternal, "invalid Dtype value " + std::to_string(int(d)));
}

}  // namespace

size_t dtype_size(Dtype d) { return info(d).size; }
const char* dtype_name(Dtype d) { return info(d).name; }
const char* npy_descr(Dtype d) { return info(d).npy; }
Dtype npy_export_dtype(Dtype d) { return d == Dtype::kBF16 ? Dtype::kF32 : d; }

Dtype dtype_from_name(const std::string& name) {
  for (const DtypeInfo& i : kTable) {
    if (name == i.name) return i.dtype;
  }
  throw data_error("unknown dtype '" + name + "' in store");
}

float bf16_to_f32(uint16_t bits) { return bf16_bits_to_float(bits); }

uint16_t f32_to_bf16(float value) { return float_to_bf16_bits(value); }

std::string shape_to_json(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      throw StoreError(ExitCode::kInternal, "negative dimension in shape");
    }
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

std::vector<int64_t> shape_from_json(const std::string& text) {
  std::vector<int64_t> shape;
  size_t i = 0;
  auto fail = [&]() { return data_error("malformed shape '" + text + "' in store"); };
  auto skip_ws = [&]() {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n')) ++i;
  };
  skip_ws();
  if (i >= text.size() || text[i] != '[') throw fail();
  ++i;
  skip_ws();
  if (i < text.size() && text[i] == ']') {
    ++i;
  } else {
    while (true) {
      skip_ws();
      if (i >= text.size() || text[i] < '0' || text[i] > '9') throw fail();
      int64_t v = 0;
      while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
        if (v > (INT64_MAX - 9) / 10) throw fail();
        v = v * 10 + (text[i] - '0');
        ++i;
      }
      shape.push_back(v);
      skip_ws();
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < text.size() && text[i] == ']') {
        ++i;
        break;
      }
      throw fail();
    }
  }
  skip_ws();
  if (i != text.size()) throw fail();
  return shape;
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    // A shape read from a damaged store can claim more elements than int64 holds; wrapping
    // around could make it (or its bytes, numel x 8 at most) match a blob's size.
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > INT64_MAX / 8) {
      throw data_error("shape " + shape_to_json(shape) + " has no valid element count");
    }
  }
  return n;
}

}  // namespace rwd::store
