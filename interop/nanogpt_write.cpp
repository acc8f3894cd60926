// Writes rewind's training state as nanoGPT's ckpt.pt (model state dict in nanoGPT's names,
// AdamW state in torch.optim's layout, model_args, iter_num, best_val_loss, config), and the
// parameter name map both directions share.
#include "interop/nanogpt.h"

#include <torch/types.h>

#include <map>

namespace rwd::interop {

std::vector<ParamName> param_names(const train::Config& c) {
  const int64_t C = c.n_embd;
  std::vector<ParamName> out;
  auto add = [&](const std::string& nano, const std::string& rw, std::vector<int64_t> shape) {
    out.push_back({nano, rw, std::move(shape)});
  };
  // A weight and, with bias, its bias ("<rewind name>_bias", shape: the weight's first dim).
  auto add_wb = [&](const std::string& nano, const std::string& rw, std::vector<int64_t> shape) {
    add(nano + ".weight", rw, shape);
    if (c.bias) add(nano + ".bias", rw + "_bias", {shape[0]});
  };
  add("transformer.wte.weight", "wte", {c.vocab_size, C});
  add("transformer.wpe.weight", "wpe", {c.block_size, C});
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string n = "transformer.h." + std::to_string(l) + ".", r = "h." + std::to_string(l) + ".";
    add_wb(n + "ln_1", r + "ln_1", {C});
    add_wb(n + "attn.c_attn", r + "c_attn", {3 * C, C});
    add_wb(n + "attn.c_proj", r + "c_proj", {C, C});
    add_wb(n + "ln_2", r + "ln_2", {C});
    add_wb(n + "mlp.c_fc", r + "c_fc", {4 * C, C});
    add_wb(n + "mlp.c_proj", r + "mlp_proj", {C, 4 * C});
  }
  add_wb("transformer.ln_f", "ln_f", {C});
  return out;
}

nlohmann::json nanogpt_model_args(const train::Config& c) {
  return {{"n_layer", c.n_layer}, {"n_head", c.n_head},       {"n_embd", c.n_embd},
          {"block_size", c.block_size}, {"bias", c.bias}, {"vocab_size", c.vocab_size},
          {"dropout", 0.0}};
}

nlohmann::json nanogpt_config(const train::Config& c) {
  nlohmann::json j = nlohmann::json::parse(c.to_json());
  j.erase("seed");
  j["bias"] = c.bias;
  j["dropout"] = 0.0;
  j["decay_lr"] = true;
  j["init_from"] = "resume";
  return j;
}

namespace {

// torch.optim.AdamW's param_groups as nanoGPT's configure_optimizers makes them.
nlohmann::json default_groups(const train::Config& c) {
  nlohmann::json g = {{"betas", {{"__tuple__", {c.beta1, c.beta2}}}}, {"eps", 1e-8},
                      {"amsgrad", false}, {"maximize", false}, {"foreach", nullptr},
                      {"capturable", false}, {"differentiable", false}, {"fused", nullptr}};
  nlohmann::json decay = g, rest = g;
  decay["weight_decay"] = c.weight_decay;
  rest["weight_decay"] = 0.0;
  return nlohmann::json::array({decay, rest});
}

}  // namespace

void write_nanogpt(const std::string& path, const train::Config& config,
                   const train::NamedTensors& state, int64_t iter_num, const nlohmann::json& extra) {
  std::map<std::string, torch::Tensor> st(state.begin(), state.end());
  auto get = [&](const std::string& name) {
    auto it = st.find(name);
    if (it == st.end()) throw InteropError("checkpoint lacks tensor '" + name + "'");
    return it->second.to(torch::kCPU).contiguous();
  };
  const std::vector<ParamName> names = param_names(config);
  const std::string prefix = extra.value("prefix", "");

  c10::impl::GenericDict model(c10::StringType::get(), c10::TensorType::get());
  const torch::Tensor wte = get("param/wte");
  torch::Tensor mask;
  if (extra.value("mask_buffers", false))
    mask = torch::ones({config.block_size, config.block_size}).tril().view({1, 1, config.block_size, config.block_size});
  for (const ParamName& p : names) {
    // nanoGPT's state_dict puts the attention's mask buffer before its child modules.
    if (mask.defined() && p.nanogpt.find(".attn.c_attn.weight") != std::string::npos)
      model.insert(prefix + p.nanogpt.substr(0, p.nanogpt.find("c_attn")) + "bias", mask);
    model.insert(prefix + p.nanogpt, p.rewind == "wte" ? wte : get("param/" + p.rewind));
  }
  model.insert(prefix + "lm_head.weight", wte);  // tied: the same storage, as in nanoGPT

  // AdamW: state by index in param_groups order (decay group, then the rest, or one group).
  nlohmann::json groups = extra.contains("param_groups") ? extra["param_groups"] : default_groups(config);
  if (groups.size() != 1 && groups.size() != 2) groups = default_groups(config);
  std::vector<const ParamName*> order;
  size_t n_matrix = 0;  // nanoGPT's decay group: the parameters of dim >= 2
  for (const ParamName& p : names) n_matrix += p.shape.size() >= 2;
  if (groups.size() == 2) {
    for (const ParamName& p : names) if (p.shape.size() >= 2) order.push_back(&p);
    for (const ParamName& p : names) if (p.shape.size() < 2) order.push_back(&p);
  } else {
    for (const ParamName& p : names) order.push_back(&p);
  }
  const int64_t steps = get("step").item<int64_t>();
  c10::impl::GenericDict opt_state(c10::IntType::get(), c10::AnyType::get());
  for (size_t i = 0; steps > 0 && i < order.size(); ++i) {  // step 0: AdamW has no state yet
    c10::impl::GenericDict ps(c10::StringType::get(), c10::AnyType::get());
    ps.insert("step", torch::tensor(static_cast<float>(steps)).squeeze());
    ps.insert("exp_avg", get("adam_m/" + order[i]->rewind));
    ps.insert("exp_avg_sq", get("adam_v/" + order[i]->rewind));
    opt_state.insert(static_cast<int64_t>(i), ps);
  }
  const bool same_iter = extra.value("iter_num", int64_t{-1}) == iter_num;
  c10::impl::GenericList group_list(c10::AnyType::get());
  int64_t next = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    nlohmann::json gj = groups[g];
    if (!same_iter || !gj.contains("lr")) gj["lr"] = train::lr_at(config, iter_num);
    c10::IValue gv = from_json(gj);
    c10::impl::GenericDict gd = gv.toGenericDict();
    c10::impl::GenericList ids(c10::AnyType::get());  // a plain list (an int list pickles as a TorchScript global)
    const size_t n = groups.size() == 1 ? order.size() : (g == 0 ? n_matrix : order.size() - n_matrix);
    for (size_t k = 0; k < n; ++k) ids.push_back(next++);
    gd.insert("params", ids);
    group_list.push_back(gd);
  }
  c10::impl::GenericDict optimizer(c10::StringType::get(), c10::AnyType::get());
  optimizer.insert("state", opt_state);
  optimizer.insert("param_groups", group_list);

  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("model", model);
  top.insert("optimizer", optimizer);
  top.insert("model_args", from_json(extra.contains("model_args") ? extra["model_args"] : nanogpt_model_args(config)));
  top.insert("iter_num", iter_num);
  const nlohmann::json other = extra.value("other", nlohmann::json::object());
  top.insert("best_val_loss", from_json(other.value("best_val_loss", nlohmann::json(1e9))));
  top.insert("config", from_json(extra.contains("config") ? extra["config"] : nanogpt_config(config)));
  for (auto& [k, v] : other.items())
    if (k != "best_val_loss") top.insert(k, from_json(v));
  save_torch_file(path, top);
}

}  // namespace rwd::interop
