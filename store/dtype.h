// Element types of stored tensors (a store-level enum, independent of LibTorch), their sizes,
// names as written in the store, numpy descriptors for export, and shape <-> JSON text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rwd::store {

enum class Dtype : uint8_t { kF32, kF64, kBF16, kF16, kI64, kI32, kU16, kU8, kBool };

constexpr Dtype kAllDtypes[] = {Dtype::kF32, Dtype::kF64, Dtype::kBF16, Dtype::kF16, Dtype::kI64,
                                Dtype::kI32, Dtype::kU16, Dtype::kU8,   Dtype::kBool};

size_t dtype_size(Dtype d);       // bytes per element
const char* dtype_name(Dtype d);  // "f32", "bf16", ... (the text stored in the tables)
Dtype dtype_from_name(const std::string& name);  // throws StoreError(kData) on unknown text

// numpy descriptor used by export: '<f4', '<f8', '<f2', '<i8', '<i4', '<u2', '|u1', '|b1'.
// BF16 has no numpy type: it is exported as '<f4' after exact widening (see bf16_to_f32).
const char* npy_descr(Dtype d);
Dtype npy_export_dtype(Dtype d);  // kF32 for kBF16, d otherwise

// BF16 -> FP32 is exact: the 16 BF16 bits are the top half of the FP32 bit pattern.
float bf16_to_f32(uint16_t bits);
// FP32 -> BF16 with round-to-nearest-even (NaN stays NaN); used by tests and the benchmark.
uint16_t f32_to_bf16(float value);

// Shapes are stored as JSON arrays of non-negative integers: "[4,1024]"; "[]" is a scalar.
std::string shape_to_json(const std::vector<int64_t>& shape);
std::vector<int64_t> shape_from_json(const std::string& text);  // throws StoreError(kData)
// Elements of `shape` (1 for a scalar); StoreError(kData) when that count, or its bytes at 8
// per element, would not fit in int64 (a damaged row).
int64_t shape_numel(const std::vector<int64_t>& shape);

}  // namespace rwd::store
