// IValue <-> JSON for the plain-value parts of a checkpoint (config, model_args, param groups).
#include "interop/pickle_io.h"

#include <torch/types.h>

#include <vector>

namespace rwd::interop {

nlohmann::json to_json(const c10::IValue& v, const std::string& where) {
  if (v.isNone()) return nullptr;
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isString()) return v.toStringRef();
  if (v.isList() || v.isTuple()) {
    nlohmann::json a = nlohmann::json::array();
    size_t i = 0;
    auto add = [&](const c10::IValue& e) { a.push_back(to_json(e, where + "[" + std::to_string(i++) + "]")); };
    if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) add(e);
      return a;
    }
    for (const c10::IValue& e : v.toTupleRef().elements()) add(e);
    return nlohmann::json{{"__tuple__", a}};
  }
  if (v.isGenericDict()) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& e : v.toGenericDict()) {
      if (!e.key().isString()) throw InteropError(where + ": a dict key is not a string");
      const std::string& k = e.key().toStringRef();
      o[k] = to_json(e.value(), where + "." + k);
    }
    return o;
  }
  if (v.isTensor() && v.toTensor().dim() == 0 && v.toTensor().is_floating_point()) {
    const torch::Tensor t = v.toTensor();
    if (t.scalar_type() != torch::kFloat32 && t.scalar_type() != torch::kFloat64)
      throw InteropError(where + ": a scalar tensor of dtype " + std::string(c10::toString(t.scalar_type())));
    return nlohmann::json{{"__tensor__", t.item<double>()},
                          {"dtype", t.scalar_type() == torch::kFloat32 ? "float32" : "float64"}};
  }
  throw InteropError(where + ": unsupported value of type " + v.tagKind());
}

c10::IValue from_json(const nlohmann::json& j) {
  if (j.is_null()) return c10::IValue();
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array()) {
    c10::impl::GenericList l(c10::AnyType::get());
    for (const auto& e : j) l.push_back(from_json(e));
    return l;
  }
  if (j.contains("__tuple__")) {
    std::vector<c10::IValue> elems;
    for (const auto& e : j["__tuple__"]) elems.push_back(from_json(e));
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  if (j.contains("__tensor__")) {
    const auto dtype = j.value("dtype", "float32") == "float64" ? torch::kFloat64 : torch::kFloat32;
    return torch::tensor(j["__tensor__"].get<double>(), torch::TensorOptions().dtype(dtype)).squeeze();
  }
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  for (auto it = j.begin(); it != j.end(); ++it) d.insert(it.key(), from_json(it.value()));
  return d;
}

const c10::IValue* find_key(const c10::impl::GenericDict& d, const std::string& key) {
  auto it = d.find(c10::IValue(key));
  return it == d.end() ? nullptr : &it->value();
}

}  // namespace rwd::interop
