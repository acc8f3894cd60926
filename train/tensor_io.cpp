// Tensor <-> store conversions and whole-state checkpoints.
#include "train/tensor_io.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>
#include <thread>

#include "common/error.h"

namespace rwd::train {
namespace {

// The row that lists a checkpoint's other rows: the restore compares what it finds with it, so
// a row lost or moved to another step (its step changed) reads as corruption, also for rows a
// restore may go without (the generators' states), instead of "lacks tensor X" or a silent
// restore. Checkpoints written without it (older stores) are read as they were.
constexpr const char* kManifest = "rewind/manifest";

std::vector<std::string> sorted_names(const NamedTensors& state) {
  std::vector<std::string> names;
  for (const auto& [name, t] : state) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

torch::Tensor manifest_of(const NamedTensors& state) {
  std::string text;
  for (const std::string& n : sorted_names(state)) text += n + "\n";
  return torch::from_blob(text.data(), {static_cast<int64_t>(text.size())}, torch::kUInt8).clone();
}

// Throws "store corrupted" when the rows of checkpoint `step` are not the ones its manifest
// lists; returns the state without the manifest row.
NamedTensors check_manifest(const store::Store& s, int64_t run, int64_t step, NamedTensors state) {
  auto it = std::find_if(state.begin(), state.end(), [](const auto& e) { return e.first == kManifest; });
  if (it == state.end()) return state;
  const torch::Tensor m = it->second.contiguous();
  const std::string text(static_cast<const char*>(m.data_ptr()), static_cast<size_t>(m.numel()));
  state.erase(it);
  std::vector<std::string> listed;
  for (size_t b = 0, e; b < text.size(); b = e + 1) {
    e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    if (e > b) listed.push_back(text.substr(b, e - b));
  }
  const std::vector<std::string> found = sorted_names(state);
  std::vector<std::string> missing, extra;
  std::set_difference(listed.begin(), listed.end(), found.begin(), found.end(), std::back_inserter(missing));
  std::set_difference(found.begin(), found.end(), listed.begin(), listed.end(), std::back_inserter(extra));
  if (missing.empty() && extra.empty()) return state;
  const std::string where = "store corrupted: " + s.path() + ": checkpoint at step " + std::to_string(step) +
                            " of run " + std::to_string(run);
  if (!missing.empty())
    throw Error(ExitCode::kData, where + " has no row '" + missing.front() + "' that its manifest lists (" +
                                     std::to_string(missing.size()) + " missing: a row lost, or moved to another step)");
  throw Error(ExitCode::kData, where + " has a row '" + extra.front() + "' that its manifest does not list (" +
                                   std::to_string(extra.size()) + " extra: moved in from another checkpoint)");
}

}  // namespace

store::Dtype store_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return store::Dtype::kF32;
    case torch::kFloat64: return store::Dtype::kF64;
    case torch::kBFloat16: return store::Dtype::kBF16;
    case torch::kFloat16: return store::Dtype::kF16;
    case torch::kInt64: return store::Dtype::kI64;
    case torch::kInt32: return store::Dtype::kI32;
    case torch::kUInt8: return store::Dtype::kU8;
    case torch::kBool: return store::Dtype::kBool;
    default: throw Error(ExitCode::kInternal, "tensor dtype not storable");
  }
}

namespace {

torch::ScalarType torch_dtype(store::Dtype d) {
  switch (d) {
    case store::Dtype::kF32: return torch::kFloat32;
    case store::Dtype::kF64: return torch::kFloat64;
    case store::Dtype::kBF16: return torch::kBFloat16;
    case store::Dtype::kF16: return torch::kFloat16;
    case store::Dtype::kI64: return torch::kInt64;
    case store::Dtype::kI32: return torch::kInt32;
    case store::Dtype::kU8: return torch::kUInt8;
    case store::Dtype::kBool: return torch::kBool;
    case store::Dtype::kU16: return torch::kInt32;  // widened below
  }
  return torch::kFloat32;
}

}  // namespace

std::vector<int64_t> shape_of(const torch::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
}

torch::Tensor to_torch(const store::TensorRecord& r) {
  const auto& shape = r.info.shape;
  if (r.info.dtype == store::Dtype::kU16) {
    std::vector<int32_t> wide(r.bytes.size() / 2);
    const auto* p = reinterpret_cast<const uint16_t*>(r.bytes.data());
    for (size_t i = 0; i < wide.size(); ++i) wide[i] = p[i];
    return torch::from_blob(wide.data(), shape, torch::kInt32).clone();
  }
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(torch_dtype(r.info.dtype)));
  if (static_cast<size_t>(t.numel() * t.element_size()) != r.bytes.size())
    throw Error(ExitCode::kData, "stored tensor '" + r.info.key.name + "' has " +
                                     std::to_string(r.bytes.size()) + " bytes, shape says otherwise");
  if (!r.bytes.empty()) std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
  return t;
}

void write_checkpoint(store::Store& s, int64_t run, int64_t step, const NamedTensors& state) {
  // The blobs first, prepared in parallel by put_blobs and each inserted in a transaction of
  // its own, so the recorder's step commits wait at most for one blob's insert; then the
  // checkpoint rows at once, referring to the blobs by the hashes put_blobs returned (no
  // second hash pass over the state).
  for (const auto& [name, t] : state)
    if (name == kManifest) throw Error(ExitCode::kInternal, std::string("checkpoint: '") + kManifest + "' is rewind's own row");
  NamedTensors rows = state;
  rows.emplace_back(kManifest, manifest_of(state));
  std::vector<torch::Tensor> host;
  std::vector<store::BlobSource> blobs;
  for (const auto& [name, t] : rows) {
    host.push_back(t.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& h = host.back();
    blobs.push_back({h.data_ptr(), static_cast<size_t>(h.numel() * h.element_size()),
                     s.tensor_shuffle(store_dtype(h))});
  }
  const std::vector<std::string> hashes = s.put_blobs(blobs);
  auto tx = s.begin_step();
  for (size_t i = 0; i < rows.size(); ++i) {
    s.put_checkpoint_blob(run, step, rows[i].first, store_dtype(host[i]), shape_of(host[i]),
                          hashes[i]);
  }
  tx.commit();
}

NamedTensors read_checkpoint(store::Store& s, int64_t run, int64_t step) {
  const std::vector<store::TensorInfo> infos = s.checkpoint_entries(run, step);
  if (infos.empty())
    throw Error(ExitCode::kData, "missing checkpoint: run " + std::to_string(run) + " step " +
                                     std::to_string(step) + " has no tensors");
  // Decompressed on up to 8 threads straight into the tensors (a gpt2-small checkpoint, 1.5 GB,
  // took 3.1 s on one thread; through an intermediate buffer, a zero fill and a copy on this
  // thread came on top of the threads' work). U16 tensors go through bytes: they are widened.
  const int threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  std::vector<torch::Tensor> tensors(infos.size());
  std::vector<store::TensorRecord> narrow(infos.size());
  for (size_t i = 0; i < infos.size(); ++i)
    if (infos[i].dtype != store::Dtype::kU16)
      tensors[i] = torch::empty(infos[i].shape, torch::TensorOptions().dtype(torch_dtype(infos[i].dtype)));
  s.read_tensors_into(infos, threads, [&](size_t i) -> uint8_t* {
    if (tensors[i].defined()) return static_cast<uint8_t*>(tensors[i].data_ptr());
    narrow[i].info = infos[i];
    narrow[i].bytes.resize(static_cast<size_t>(store::shape_numel(infos[i].shape)) * 2);
    return narrow[i].bytes.data();
  });
  NamedTensors out;
  for (size_t i = 0; i < infos.size(); ++i)
    out.emplace_back(infos[i].key.name, tensors[i].defined() ? tensors[i] : to_torch(narrow[i]));
  return check_manifest(s, run, step, std::move(out));
}

}  // namespace rwd::train
