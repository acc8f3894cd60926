// torch.save files read and written without Python (LibTorch's zip container, our pickle
// reader/writer), and the plain values inside them converted to and from JSON.
#pragma once

#include <ATen/core/ivalue.h>

#include <nlohmann/json.hpp>
#include <functional>
#include <optional>
#include <string>
#include <utility>

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
// Where a pickle's tensor storages come from: the bytes of record `name` ("data/0"), or
// nullopt when the file has none by that name.
using RecordReader =
    std::function<std::optional<std::pair<at::DataPtr, size_t>>(const std::string& name)>;
// The pickle program of a torch.save file (its data.pkl) run by our reader: dicts, lists,
// tuples, numbers, strings and tensors whose storages `records` supplies. Throws InteropError
// for anything malformed or unsupported (and for containers nested deeper than 64 or changed
// after they were stored, which torch.save never writes).
c10::IValue read_pickle(const std::string& pickle, const RecordReader& records);
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
