// Conversions between LibTorch tensors and store records (dtype, shape, raw bytes).
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "train/trainer.h"
#include "store/store.h"

namespace rwd::train {

store::Dtype store_dtype(const torch::Tensor& t);  // throws Error(kInternal) for others
torch::Tensor to_torch(const store::TensorRecord& r);
std::vector<int64_t> shape_of(const torch::Tensor& t);

// Writes a whole training state as one checkpoint at `step`: blobs first (each in its own
// short transaction, so the writer lock is held briefly), then every row in ONE transaction,
// so a crash leaves either the complete checkpoint or none of it.
void write_checkpoint(store::Store& s, int64_t run, int64_t step, const NamedTensors& state);
// read_checkpoint checks the rows against the manifest row write_checkpoint adds ("store
// corrupted" when a row is missing or extra) and returns the state without it.
NamedTensors read_checkpoint(store::Store& s, int64_t run, int64_t step);

}  // namespace rwd::train
