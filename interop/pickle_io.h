// torch.save files read and written without Python (LibTorch's zip container, our pickle
// reader/writer), and the plain values inside them converted to and from JSON.
#pragma once

#include <ATen/core/ivalue.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace rwd::interop {

// The one exception type of interop/: a checkpoint rewind cannot read or map (exit 3 unless
// the code says otherwise). Messages name the offending key.
class InteropError : public Error {
 public:
  explicit InteropError(const std::string& what, ExitCode code = ExitCode::kData)
      : Error(code, what) {}
};

// Reads a zip-format torch.save file; every tensor lands on the CPU whatever device it was
// saved from. Throws InteropError for a missing file, the legacy (pre-1.6) format or pickle
// content LibTorch cannot rebuild.
c10::IValue load_torch_file(const std::string& path);
// Writes `value` in torch.save's zip format (torch.load reads it). Throws InteropError on I/O.
void save_torch_file(const std::string& path, const c10::IValue& value);

// None, bool, int, double, string, list, tuple ({"__tuple__": [...]}), dict with string keys
// and 0-dim tensors ({"__tensor__": value, "dtype": "float32"}) as JSON; anything else throws
// InteropError naming `where`.
nlohmann::json to_json(const c10::IValue& v, const std::string& where);
// The inverse of to_json (JSON objects become dicts with string keys).
c10::IValue from_json(const nlohmann::json& j);

// Dict lookups by string key; nullptr when absent.
const c10::IValue* find_key(const c10::impl::GenericDict& d, const std::string& key);

}  // namespace rwd::interop
