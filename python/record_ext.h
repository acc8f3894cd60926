// Recording a user's PyTorch loop into a store and reading it back for replay, for the Python
// package: rewind._C.ScriptRecording, ScriptReplay and param_digest (python/rewind/record.py).
#pragma once

#include <torch/extension.h>

namespace rwd::python {

void bind_record(pybind11::module_& m);

}  // namespace rwd::python
