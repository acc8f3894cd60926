// rewind._C.store_*: each call opens the store read-only, reads, closes; the Python side
// (rewind/_store.py) turns the lists into numpy arrays / pandas frames.
#include "python/store_ext.h"

#include "interop/nanogpt.h"
#include "store/store.h"
#include "train/config.h"
#include "train/tensor_io.h"

namespace rwd::python {

namespace py = pybind11;

namespace {

store::Store open_ro(const std::string& path) { return store::Store::open(path, store::Mode::kReadOnly); }

py::dict info_dict(const store::TensorInfo& t) {
  py::dict d;
  d["step"] = t.key.step;
  d["layer"] = t.key.layer;
  d["head"] = t.key.head;
  d["name"] = t.key.name;
  d["dtype"] = store::dtype_name(t.dtype);
  d["shape"] = t.shape;
  return d;
}

}  // namespace

void bind_store(py::module_& m) {
  // Errors reach Python as ValueError with rewind's one-line message.
  py::register_exception<Error>(m, "RewindError", PyExc_ValueError);
  m.def("store_runs", [](const std::string& path) {
    py::list out;
    for (const store::RunInfo& r : open_ro(path).runs()) {
      py::dict d;
      d["id"] = r.id;
      d["created"] = r.created;
      d["config"] = r.config;
      d["plan"] = r.plan;
      d["meta"] = r.meta;
      out.append(d);
    }
    return out;
  });
  m.def("store_steps", [](const std::string& path, int64_t run) {
    std::vector<int64_t> step;
    std::vector<double> lr, loss, grad_norm;
    std::vector<std::string> digest, batch_hash, extra;
    for (const store::StepRecord& s : open_ro(path).steps(run, INT64_MIN, INT64_MAX)) {
      extra.push_back(s.extra.value_or(""));
      step.push_back(s.step);
      lr.push_back(s.lr);
      loss.push_back(s.loss());
      grad_norm.push_back(s.grad_norm());
      digest.push_back(s.param_digest.value_or(""));
      batch_hash.push_back(s.batch_hash);
    }
    py::dict d;
    d["step"] = step;
    d["lr"] = lr;
    d["loss"] = loss;
    d["grad_norm"] = grad_norm;
    d["param_digest"] = digest;
    d["batch_hash"] = batch_hash;
    d["extra"] = extra;  // JSON text: the sample offsets per micro-batch, the step's seconds
    return d;
  });
  // nanoGPT's parameter names beside rewind's for a run's config JSON, in nanoGPT's
  // named_parameters() order: the map `rewind export nanogpt` writes with.
  m.def("nanogpt_names", [](const std::string& config_json) {
    py::list out;
    for (const interop::ParamName& p : interop::param_names(train::Config::from_json(config_json)))
      out.append(py::make_tuple(p.nanogpt, p.rewind));
    return out;
  });
  m.def("store_metrics", [](const std::string& path, int64_t run, const std::string& prefix) {
    std::vector<int64_t> step;
    std::vector<std::string> key;
    std::vector<double> value;
    for (const store::MetricRow& r : open_ro(path).metrics(run, INT64_MIN, INT64_MAX, prefix)) {
      step.push_back(r.step);
      key.push_back(r.key);
      value.push_back(r.value);
    }
    return py::make_tuple(step, key, value);
  });
  m.def("store_checkpoint_steps", [](const std::string& path, int64_t run) {
    return open_ro(path).checkpoint_steps(run);
  });
  m.def("store_checkpoint", [](const std::string& path, int64_t run, int64_t step) {
    store::Store s = open_ro(path);
    py::dict d;
    for (const auto& [name, t] : train::read_checkpoint(s, run, step)) d[py::str(name)] = t;
    return d;
  });
  m.def("store_tensors", [](const std::string& path, int64_t run) {
    py::list out;
    for (const store::TensorInfo& t : open_ro(path).tensors(run, INT64_MIN, INT64_MAX)) out.append(info_dict(t));
    return out;
  });
  m.def("store_tensor", [](const std::string& path, int64_t run, int64_t step, int layer, int head,
                           const std::string& name) {
    auto rec = open_ro(path).get_tensor(store::TensorKey{run, step, layer, head, name});
    if (!rec) throw Error(ExitCode::kUsage, "no tensor '" + name + "' at step " + std::to_string(step) +
                                                " layer " + std::to_string(layer) + " head " + std::to_string(head));
    return train::to_torch(*rec);
  });
  m.def("store_kv", [](const std::string& path, int64_t run, const std::string& prefix) {
    store::Store s = open_ro(path);
    py::dict d;
    for (const std::string& k : s.kv_keys(run, prefix)) d[py::str(k)] = s.get_kv(run, k).value_or("");
    return d;
  });
  m.def("store_probes", [](const std::string& path, const std::string& job) {
    py::list out;
    for (const store::ProbeRecord& p : open_ro(path).probes(job)) {
      py::dict d;
      d["job"] = p.job;
      d["plan"] = p.plan;
      d["window"] = p.window;
      d["verdict"] = p.verdict;
      d["metrics"] = p.metrics;
      d["wall_s"] = p.wall_s;
      d["created"] = p.created;
      out.append(d);
    }
    return out;
  });
}

}  // namespace rwd::python
