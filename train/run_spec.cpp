// Run metadata JSON and plan schedules.
#include "train/run_spec.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/version.h>

#ifdef REWIND_CUDA
#include <cuda_runtime.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/switches.h"
#include "train/fp32_gemm.h"
#include "train/norm.h"
#include "store/store.h"

namespace rwd::train {

torch::Device setup_device(const std::string& device) {
  if (device == "cpu") return torch::kCPU;
  if (device.rfind("cuda", 0) != 0) throw UsageError("--device must be cpu or cuda[:N], got '" + device + "'");
  // Must precede the first cuBLAS handle: deterministic cuBLAS needs a fixed workspace.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
  if (!torch::cuda::is_available())
    throw UsageError("--device " + device + ": no CUDA device (or a CPU-only LibTorch build)");
  at::globalContext().setDeterministicAlgorithms(true, false);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  // Deterministic mode also fills every new tensor with NaN (a guard against reading memory
  // nobody wrote): ~1000 fill kernels per gpt2-small step, 15% of it. Every op of the step
  // writes its whole output (the bitwise record/replay and 50-run backward tests check that
  // the bits do not depend on what the allocator hands out), so the fill is turned off.
  at::globalContext().setDeterministicFillUninitializedMemory(false);
#endif
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const torch::Device d(device);
#ifdef REWIND_CUDA
  // The rank's GPU becomes this thread's current device: our kernels launch on the current
  // device's stream, so a rank on cuda:1 that left device 0 current ran them on GPU 0 against
  // GPU 1's memory (error 700, an illegal address, at the first step of rank 1).
  if (d.has_index()) {
    const cudaError_t e = cudaSetDevice(d.index());
    if (e != cudaSuccess)
      throw UsageError("--device " + device + ": " + cudaGetErrorString(e));
  }
#endif
  return d;
}

std::string device_name(const torch::Device& device) {
  if (device.is_cuda()) {
#ifdef REWIND_CUDA
    int index = device.has_index() ? device.index() : 0;
    if (!device.has_index()) cudaGetDevice(&index);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess)
      return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
#endif
    return "";
  }
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(" \t"));
      return name;
    }
  }
  return "";
}

void warn_if_not_reproducible(const RunSpec& run, const torch::Device& device, int world) {
  switches::check_recorded(run.switches, {switches::Switch::kFp32Gemm, switches::Switch::kFusedNorm});
  use_recorded_numerics(run, device);
  static std::set<int64_t> warned;  // bisect restores the same run many times
  if (!warned.insert(run.run_id).second) return;
  const long long id = run.run_id;
  const int numerics = numerics_version(device.is_cuda());
  if (run.recorded_numerics != numerics || run.recorded_torch != torch_version())
    std::fprintf(stderr, "warning: run %lld was recorded by rewind %s (numerics %d, LibTorch %s); this is rewind %s (numerics %d, LibTorch %s): bits may differ for that reason alone\n",
                 id, run.recorded_rewind.c_str(), run.recorded_numerics, run.recorded_torch.c_str(),
                 rewind_version().c_str(), numerics, torch_version().c_str());
  const std::string here = device_name(device);
  if (!run.device_name.empty() && !here.empty() && here != run.device_name)
    std::fprintf(stderr, "warning: run %lld was recorded on %s; this is %s: bits may differ for that reason alone\n",
                 id, run.device_name.c_str(), here.c_str());
  if (run.world_size != world)
    std::fprintf(stderr, "warning: run %lld was recorded on %d rank(s); this computes it on %d: the same batches, but gradients are summed in another order, so bits may differ\n",
                 id, run.world_size, world);
}

AttentionImpl attention_impl(const std::string& name) {
  if (name == "rewind") return AttentionImpl::kRewind;
  if (name == "sdpa") return AttentionImpl::kSdpa;
  if (name == "torch") return AttentionImpl::kTorchMath;
  throw UsageError("--attention must be rewind, sdpa or torch, got '" + name + "'");
}

std::string rewind_version() { return "0.3.0"; }
std::string torch_version() { return TORCH_VERSION; }
int numerics_version(bool cuda) {
  if (!cuda) return 2;
  return (fp32_gemm() == Fp32Gemm::kSplitTf32 ? 4 : 3) + (fused_norm() ? 2 : 0);
}

void use_recorded_numerics(const RunSpec& run, const torch::Device& device) {
  if (!device.is_cuda()) return;
  const int v = run.recorded_numerics;
  if (!fp32_gemm_from_env()) set_fp32_gemm(v == 4 || v == 6 ? Fp32Gemm::kSplitTf32 : Fp32Gemm::kSimt);
  if (!fused_norm_from_env()) set_fused_norm(v >= 5);
}

std::string RunSpec::meta_json() const {
  nlohmann::ordered_json j;
  j["rewind_version"] = rewind_version();
  j["torch_version"] = torch_version();
  j["numerics"] = numerics_version(device.rfind("cuda", 0) == 0);
  j["device"] = device;
  j["device_name"] = device_name;
  j["attention"] = attention;
  j["threads"] = threads;
  j["data_path"] = data_path;
  j["data_fingerprint"] = data_fingerprint;
  j["checkpoint_every"] = checkpoint_every;
  j["digest_every"] = digest_every;
  j["monitor_every"] = monitor_every;
  j["full_batches"] = full_batches;
  j["world_size"] = world_size;
  j["keep_last"] = keep_last;
  j["keep_every"] = keep_every;
  // The GEMM and LayerNorm as this process runs them: a run continued from another takes that
  // run's (use_recorded_numerics), whatever the environment's default.
  std::map<std::string, std::string> bits = switches::bit_values();
  bits[switches::name(switches::Switch::kFp32Gemm)] = fp32_gemm() == Fp32Gemm::kSplitTf32 ? "3xtf32" : "simt";
  bits[switches::name(switches::Switch::kFusedNorm)] = fused_norm() ? "1" : "0";
  j["switches"] = bits;
  return j.dump();
}

void RunSpec::store_resume_options(store::Store& s) const {
  const std::optional<store::RunInfo> info = s.run(run_id);
  if (!info) throw Error(ExitCode::kData, "store '" + s.path() + "' has no run " + std::to_string(run_id));
  // Only these keys: the rest says what recorded the run and stays as it was.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(info->meta);
  j["keep_last"] = keep_last;
  j["keep_every"] = keep_every;
  j["monitor_every"] = monitor_every;
  s.update_run_meta(run_id, j.dump());
}

RunSpec RunSpec::load(store::Store& s, int64_t run_id) {
  std::optional<store::RunInfo> info;
  if (run_id == 0) {
    auto runs = s.runs();
    if (runs.empty()) throw Error(ExitCode::kData, "store '" + s.path() + "' holds no recorded run");
    info = runs.back();
  } else {
    info = s.run(run_id);
    if (!info) throw UsageError("store '" + s.path() + "' has no run " + std::to_string(run_id));
  }
  RunSpec r;
  static_cast<RunMeta&>(r) = RunMeta::parse(info->meta);
  r.run_id = info->id;
  r.config = Config::from_json(info->config);
  r.plan = PlanSchedule::from_json(info->plan);
  return r;
}

}  // namespace rwd::train
