// Reads nanoGPT's ckpt.pt (model state dict, AdamW state, model_args, iter_num, config) into
// rewind's parameter names, moments and Config, checking every key and shape on the way.
#include "interop/nanogpt.h"

#include <torch/types.h>

#include <cmath>
#include <map>
#include <sstream>

namespace rwd::interop {

namespace {

const char* const kPrefix = "_orig_mod.";  // torch.compile's wrapper in the state dict's keys

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  return o.str() + "]";
}

const c10::IValue& need(const c10::impl::GenericDict& d, const std::string& key, const std::string& where) {
  const c10::IValue* v = find_key(d, key);
  if (!v) throw InteropError(where + ": missing key '" + key + "' (not a nanoGPT train.py checkpoint?)");
  return *v;
}

c10::impl::GenericDict as_dict(const c10::IValue& v, const std::string& where) {
  if (!v.isGenericDict()) throw InteropError(where + ": expected a dict, found " + v.tagKind());
  return v.toGenericDict();
}

int64_t as_int(const c10::IValue& v, const std::string& where) {
  if (v.isInt()) return v.toInt();
  // A whole double (or one-element tensor) within int64's range: casting one outside it, or a
  // NaN, would be undefined.
  const bool scalar_tensor = v.isTensor() && v.toTensor().numel() == 1;
  if (v.isDouble() || scalar_tensor) {
    const double d = v.isDouble() ? v.toDouble() : v.toTensor().item<double>();
    if (std::abs(d) < 9.2e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  throw InteropError(where + ": expected an integer, found " +
                     (scalar_tensor || v.isDouble() ? "a non-integral number" : v.tagKind()));
}

torch::Tensor as_tensor(const c10::IValue& v, const std::string& where, c10::IntArrayRef shape) {
  if (!v.isTensor()) throw InteropError(where + ": expected a tensor, found " + v.tagKind());
  torch::Tensor t = v.toTensor();
  if (!t.is_floating_point()) throw InteropError(where + ": not a floating-point tensor");
  // torch.save writes a parameter's own storage; a view whose elements overlap (stride 0) could
  // stand for far more elements than the file holds.
  if (!t.is_non_overlapping_and_dense()) throw InteropError(where + ": not a dense tensor (overlapping strides)");
  if (t.sizes() != shape)
    throw InteropError(where + ": shape " + shape_str(t.sizes()) + ", expected " + shape_str(shape) +
                       " for the model in model_args");
  return t.to(torch::kFloat32).contiguous().clone();
}

// model_args -> the model's shape (bias: from the state dict when model_args lacks it).
train::Config model_shape(const c10::impl::GenericDict& args, bool has_bias_keys,
                          NanoGptCheckpoint& out) {
  train::Config c;
  auto get = [&](const char* k) {
    const std::string where = std::string("model_args.") + k;
    const int64_t v = as_int(need(args, k, "model_args"), where);
    if (v < 1 || v > (int64_t{1} << 24)) throw InteropError(where + ": " + std::to_string(v) + " is outside 1..2^24");
    return static_cast<int>(v);
  };
  c.n_layer = get("n_layer");
  c.n_head = get("n_head");
  c.n_embd = get("n_embd");
  c.block_size = get("block_size");
  c.vocab_size = get("vocab_size");
  const c10::IValue* bias = find_key(args, "bias");
  if (bias && !bias->isBool()) throw InteropError("model_args.bias: expected a bool");
  c.bias = bias ? bias->toBool() : has_bias_keys;
  if (const c10::IValue* d = find_key(args, "dropout"); d && d->isDouble() && d->toDouble() > 0)
    out.warnings.push_back("model_args.dropout is " + std::to_string(d->toDouble()) +
                           ": rewind's model has no dropout, training continues without it");
  if (c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.n_embd % c.n_head != 0)
    throw InteropError("model_args: n_layer " + std::to_string(c.n_layer) + ", n_head " +
                       std::to_string(c.n_head) + ", n_embd " + std::to_string(c.n_embd) +
                       " is not a GPT-2 shape (n_embd must be a multiple of n_head)");
  return c;
}

// train.py's hyperparameters (its `config` dict) onto rewind's Config.
void apply_hyperparameters(const c10::impl::GenericDict& cfg, train::Config& c) {
  static const char* const keys[] = {"batch_size", "gradient_accumulation_steps", "learning_rate",
                                     "min_lr", "warmup_iters", "lr_decay_iters", "max_iters",
                                     "weight_decay", "beta1", "beta2", "grad_clip"};
  for (const char* k : keys) {
    const c10::IValue* v = find_key(cfg, k);
    if (!v) continue;
    if (!v->isInt() && !v->isDouble()) throw InteropError(std::string("config.") + k + ": expected a number");
    std::ostringstream text;
    text.precision(17);
    if (v->isInt()) text << v->toInt(); else text << v->toDouble();
    train::set_config_value(c, k, text.str());
  }
  const c10::IValue* decay = find_key(cfg, "decay_lr");
  if (decay && decay->isBool() && !decay->toBool()) {  // constant learning rate
    c.warmup_iters = 0;
    c.min_lr = c.learning_rate;
  }
}

// Model tensors by nanoGPT name, prefix stripped; records the prefix and mask buffers.
std::map<std::string, torch::Tensor> model_tensors(const c10::impl::GenericDict& model,
                                                   NanoGptCheckpoint& out) {
  std::map<std::string, torch::Tensor> m;
  bool prefixed = false, plain = false;
  for (const auto& e : model) {
    if (!e.key().isString()) throw InteropError("model: a key is not a string");
    std::string k = e.key().toStringRef();
    if (k.rfind(kPrefix, 0) == 0) {
      k = k.substr(std::string(kPrefix).size());
      prefixed = true;
    } else {
      plain = true;
    }
    if (!e.value().isTensor()) throw InteropError("model." + k + ": expected a tensor, found " + e.value().tagKind());
    m[k] = e.value().toTensor();
  }
  if (prefixed && plain) throw InteropError("model: some keys have the '_orig_mod.' prefix and some do not");
  out.extra["prefix"] = prefixed ? kPrefix : "";
  return m;
}

NanoGptCheckpoint map_checkpoint(const c10::IValue& root, const std::string& path,
                                 const std::string& config_json) {
  NanoGptCheckpoint out;
  if (!root.isGenericDict())
    throw InteropError(path + " holds a " + root.tagKind() +
                       ", not a nanoGPT checkpoint (a dict with model, optimizer, model_args, iter_num)");
  const c10::impl::GenericDict top = root.toGenericDict();
  const std::string where = "checkpoint";
  std::map<std::string, torch::Tensor> model = model_tensors(as_dict(need(top, "model", where), "model"), out);
  const c10::impl::GenericDict args = as_dict(need(top, "model_args", where), "model_args");
  out.iter_num = as_int(need(top, "iter_num", where), "iter_num");
  out.extra["iter_num"] = out.iter_num;
  if (out.iter_num < 0) throw InteropError("iter_num: negative (" + std::to_string(out.iter_num) + ")");
  const c10::impl::GenericDict optim = as_dict(need(top, "optimizer", where), "optimizer");

  // Shape, then hyperparameters (nanoGPT's defaults where the checkpoint has no config).
  train::Config c = model_shape(args, model.count("transformer.ln_f.bias") > 0, out);
  const train::Config shape = c;
  // train.py's defaults: the gpt2-small preset's optimisation with nanoGPT's learning rates.
  const train::Config defaults = train::Config::preset("gpt2-small");
  c.batch_size = defaults.batch_size;
  c.gradient_accumulation_steps = defaults.gradient_accumulation_steps;
  c.warmup_iters = defaults.warmup_iters;
  c.lr_decay_iters = c.max_iters = defaults.max_iters;
  c.weight_decay = defaults.weight_decay;
  c.learning_rate = 6e-4;
  c.min_lr = 6e-5;
  out.extra["model_args"] = to_json(root.toGenericDict().at("model_args"), "model_args");
  try {
    if (const c10::IValue* cfg = find_key(top, "config")) {
      apply_hyperparameters(as_dict(*cfg, "config"), c);
      out.extra["config"] = to_json(*cfg, "config");
    }
    if (!config_json.empty()) {
      c = train::Config::from_json(config_json, c);
      for (auto& [k, val] : nlohmann::json::parse(config_json).items()) out.extra["config"][k] = val;
    }
    c.validate();
  } catch (const InteropError&) {
    throw;
  } catch (const Error& e) {
    throw InteropError(std::string("hyperparameters: ") + e.what(), e.code());
  }
  if (!c.same_model(shape))
    throw InteropError("--config: its model keys disagree with the checkpoint's model_args", ExitCode::kUsage);
  out.config = c;

  // Parameters: every expected key with its shape, the tied head, the mask buffers, nothing else.
  const std::vector<ParamName> names = param_names(c);
  std::map<std::string, torch::Tensor> params;
  for (const ParamName& p : names) {
    auto it = model.find(p.nanogpt);
    if (it == model.end()) throw InteropError("model: missing key '" + p.nanogpt + "'");
    params[p.nanogpt] = as_tensor(it->second, "model." + p.nanogpt, p.shape);
    model.erase(it);
  }
  auto head = model.find("lm_head.weight");
  if (head == model.end()) throw InteropError("model: missing key 'lm_head.weight'");
  if (!torch::equal(as_tensor(head->second, "model.lm_head.weight", names[0].shape), params[names[0].nanogpt]))
    throw InteropError("model.lm_head.weight: differs from transformer.wte.weight (rewind's model ties them)");
  model.erase(head);
  int masks = 0;
  for (int l = 0; l < c.n_layer; ++l) masks += static_cast<int>(model.erase("transformer.h." + std::to_string(l) + ".attn.bias"));
  if (masks != 0 && masks != c.n_layer) throw InteropError("model: causal-mask buffers attn.bias in some layers only");
  out.extra["mask_buffers"] = masks > 0;
  if (!model.empty())
    throw InteropError("model: unexpected key '" + model.begin()->first + "' (not part of nanoGPT's GPT)");

  // AdamW state: nanoGPT's two groups (matrices with weight decay, then the rest) or one group.
  const c10::impl::GenericDict state = as_dict(need(optim, "state", "optimizer"), "optimizer.state");
  const c10::IValue& groups_v = need(optim, "param_groups", "optimizer");
  if (!groups_v.isList()) throw InteropError("optimizer.param_groups: expected a list");
  std::vector<const ParamName*> decay, rest, order;
  for (const ParamName& p : names) (p.shape.size() >= 2 ? decay : rest).push_back(&p);
  const auto groups = groups_v.toListRef();
  if (groups.size() == 2) {
    order = decay;
    order.insert(order.end(), rest.begin(), rest.end());
  } else if (groups.size() == 1) {
    for (const ParamName& p : names) order.push_back(&p);
  } else {
    throw InteropError("optimizer.param_groups: " + std::to_string(groups.size()) +
                       " groups; rewind maps nanoGPT's two (decay, no decay) or a single one");
  }
  std::vector<int64_t> ids;
  nlohmann::json groups_json = nlohmann::json::array();
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string gw = "optimizer.param_groups[" + std::to_string(g) + "]";
    const c10::impl::GenericDict gd = as_dict(groups[g], gw);
    const c10::IValue& pv = need(gd, "params", gw);
    if (!pv.isList()) throw InteropError(gw + ".params: expected a list");
    const size_t want = groups.size() == 1 ? order.size() : (g == 0 ? decay.size() : rest.size());
    if (pv.toListRef().size() != want)
      throw InteropError(gw + ".params: " + std::to_string(pv.toListRef().size()) + " entries, nanoGPT's " +
                         (groups.size() == 1 ? "model" : (g == 0 ? "decay group" : "no-decay group")) +
                         " has " + std::to_string(want));
    for (const c10::IValue& id : pv.toListRef()) ids.push_back(as_int(id, gw + ".params"));
    nlohmann::json gj = nlohmann::json::object();
    for (const auto& e : gd)
      if (e.key().toStringRef() != "params") gj[e.key().toStringRef()] = to_json(e.value(), gw + "." + e.key().toStringRef());
    if (gj.contains("eps") && gj["eps"].is_number() && gj["eps"].get<double>() != 1e-8)
      out.warnings.push_back(gw + ".eps is " + gj["eps"].dump() + ": rewind's AdamW uses 1e-8");
    groups_json.push_back(gj);
  }
  out.extra["param_groups"] = groups_json;

  std::map<std::string, torch::Tensor> m, v;
  int64_t steps = -1;
  for (size_t i = 0; i < order.size(); ++i) {
    const ParamName& p = *order[i];
    const std::string sw = "optimizer.state[" + std::to_string(ids[i]) + "] (" + p.nanogpt + ")";
    auto it = state.find(c10::IValue(ids[i]));
    if (it == state.end()) {
      if (state.size() != 0) throw InteropError(sw + ": missing");
      m[p.rewind] = torch::zeros(p.shape);  // no optimizer step taken yet
      v[p.rewind] = torch::zeros(p.shape);
      steps = 0;
      continue;
    }
    const c10::impl::GenericDict ps = as_dict(it->value(), sw);
    m[p.rewind] = as_tensor(need(ps, "exp_avg", sw), sw + ".exp_avg", p.shape);
    v[p.rewind] = as_tensor(need(ps, "exp_avg_sq", sw), sw + ".exp_avg_sq", p.shape);
    const int64_t s = as_int(need(ps, "step", sw), sw + ".step");
    if (steps >= 0 && s != steps)
      throw InteropError(sw + ".step: " + std::to_string(s) + " while other parameters took " +
                         std::to_string(steps) + " (rewind keeps one step count)");
    steps = s;
  }
  if (steps != out.iter_num)
    out.warnings.push_back("the optimizer took " + std::to_string(steps) + " steps but iter_num is " +
                           std::to_string(out.iter_num) + ": rewind counts both from iter_num (AdamW's bias correction shifts)");

  for (const ParamName& p : names) out.state.emplace_back("param/" + p.rewind, params[p.nanogpt]);
  for (const ParamName& p : names) out.state.emplace_back("adam_m/" + p.rewind, m[p.rewind]);
  for (const ParamName& p : names) out.state.emplace_back("adam_v/" + p.rewind, v[p.rewind]);
  out.state.emplace_back("step", torch::tensor({out.iter_num}, torch::kLong));

  // Other top-level entries (best_val_loss, ...) are kept when they are plain values.
  for (const auto& e : top) {
    const std::string k = e.key().isString() ? e.key().toStringRef() : "";
    if (k == "model" || k == "optimizer" || k == "model_args" || k == "config" || k == "iter_num") continue;
    try {
      if (e.value().isString() && e.value().toStringRef().rfind("<unreadable pickled object", 0) == 0)
        throw InteropError(k + ": " + e.value().toStringRef());
      out.extra["other"][k] = to_json(e.value(), k);
    } catch (const InteropError& err) {
      out.warnings.push_back(std::string("not kept (export leaves it out): ") + err.what());
    }
  }
  return out;
}

}  // namespace

NanoGptCheckpoint read_nanogpt(const std::string& path, const std::string& config_json) {
  return nanogpt_checkpoint(load_torch_file(path), "'" + path + "'", config_json);
}

NanoGptCheckpoint nanogpt_checkpoint(const c10::IValue& root, const std::string& name,
                                     const std::string& config_json) {
  try {
    return map_checkpoint(root, name, config_json);
  } catch (const c10::Error& e) {  // a value of an unexpected kind deep inside a LibTorch call
    throw InteropError(name + ": not a nanoGPT checkpoint: " + e.what_without_backtrace());
  }
}

}  // namespace rwd::interop
