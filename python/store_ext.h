// Store reading for the Python package: rewind._C.store_* functions (runs, steps, metrics,
// checkpoints, captured tensors, kv entries, probes) over the C++ store reader.
#pragma once

#include <torch/extension.h>

namespace rwd::python {

void bind_store(pybind11::module_& m);

}  // namespace rwd::python
