// `rewind doctor --cmd "python3 train.py ..."`: is the user's loop bitwise repeatable, as replay
// needs? Runs the script's first steps twice with REWIND_DOCTOR set (python/rewind/_doctor.py
// hashes every op's outputs, the batch, the loss and the parameters), names the first tensor
// whose bits differ between the two runs and the switch that fixes it.
#include <algorithm>
#include <cstdio>
#include <cxxopts.hpp>
#include <initializer_list>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/script_window.h"
#include "common/error.h"

namespace rwd::cli {

namespace {

using nlohmann::json;

// One hashed tensor: an op's output ("op"), the step's batch, loss or parameters.
struct Hashed {
  int64_t step = 0, index = -1;
  std::string what, name, phase, module, dtype, hash, shape;
  bool same_as(const Hashed& o) const {
    return what == o.what && name == o.name && shape == o.shape && dtype == o.dtype && hash == o.hash;
  }
};

struct DoctorRun {
  bool deterministic = false;
  std::string torch;
  std::map<std::string, std::string> module_types;  // module name -> class name
  std::vector<Hashed> hashed;
};

std::string shape_text(const json& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + shape[i].dump();
  return s + ")";
}

// Runs the script once and reads its report; a script that does not get through the steps is
// a one-line UsageError.
DoctorRun run_once(const std::string& cmd, int steps) {
  const std::string what = "doctor --cmd";
  ReportFile report(what);
  const int rc = run_script(cmd, "REWIND_DOCTOR", json{{"steps", steps}, {"report", report.path}}.dump(), what,
                            /*quiet=*/true);
  std::ifstream in(report.path);
  std::string line;
  DoctorRun run;
  bool started = false, done = false;
  int64_t last_step = -1;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;  // a line cut short by a killed script
    if (j.contains("start")) {
      started = true;
      run.deterministic = j.value("deterministic", false);
      run.torch = j.value("torch", "");
      const json modules = j.value("modules", json::object());
      for (const auto& [name, type] : modules.items())
        run.module_types[name] = type.is_string() ? type.get<std::string>() : "";
    }
    if (j.contains("done")) done = true;
    if (!j.contains("hash")) continue;
    Hashed h;
    h.step = j.value("step", int64_t{0});
    h.index = j.value("i", int64_t{-1});
    h.what = j.value("what", "");
    h.name = j.value("name", "");
    h.phase = j.value("phase", "");
    h.module = j.value("module", "");
    h.dtype = j.value("dtype", "");
    h.hash = j.value("hash", "");
    if (j.contains("shape")) h.shape = shape_text(j["shape"]);
    last_step = std::max(last_step, h.step);
    run.hashed.push_back(h);
  }
  const std::string status = "the script exited with status " + std::to_string(rc);
  if (!started) throw UsageError(what + ": " + status + " without calling rewind.record (nothing to check)");
  if (!done)
    throw UsageError(what + ": " + status + (last_step < 0 ? " before its first step" : " in step " + std::to_string(last_step)) +
                     ", before the end of step " + std::to_string(steps - 1) + " (does its loop run that far?)");
  return run;
}

bool has(const std::string& s, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (s.find(p) != std::string::npos) return true;
  return false;
}

// The switch that makes `h` repeatable, by what it is and, for an op, by its aten name.
std::string fix_for(const Hashed& h, bool deterministic) {
  if (h.what == "parameters" && h.step < 0)
    return "seed the model's initialization: torch.manual_seed(...) before the model is built";
  if (h.what == "batch")
    return "make the batch source fixed: seed what draws the batches (torch.manual_seed, random.seed, "
           "numpy.random.seed) before the loop, or read them in a fixed order";
  if (h.what != "op")
    return "every op's outputs agree, yet the " + h.what + " differs: something outside torch's ops changes it "
           "(a C extension, NumPy on the tensors' memory, writes through .data)";
  const std::string& n = h.name;
  if (has(n, {"scaled_dot_product", "flash_attention", "efficient_attention", "_fused_sdp"}))
    return "replace F.scaled_dot_product_attention with rewind.attention(q, k, v, layer=i): its forward and "
           "backward are bitwise deterministic (SDPA's flash and memory-efficient backward sum dQ with atomics)";
  if (has(n, {"index_add", "scatter_add", "scatter_reduce", "index_put", "put_", "embedding_dense_backward",
              "embedding_bag", "index_copy", "histc", "bincount"}))
    return deterministic
               ? "torch.use_deterministic_algorithms is already on, so this op has no deterministic kernel for "
                 "these inputs here: compute it another way (a one-hot matmul, or sorted indices and a segment sum)"
               : "torch.use_deterministic_algorithms(True) (on CUDA with CUBLAS_WORKSPACE_CONFIG=:4096:8): "
                 "index_add and the other accumulating scatters then run a deterministic kernel, or raise "
                 "naming an op that has none";
  if (has(n, {"rand", "normal", "uniform", "bernoulli", "multinomial", "dropout", "exponential", "geometric",
              "cauchy", "log_normal", "random_"}))
    return "a random op whose generator is in another state in the second run: seed it (torch.manual_seed before "
           "the model is built; a torch.Generator of the script's own: gen.manual_seed(...)); rewind.record "
           "restores torch's, Python's and NumPy's generators on replay, not one the script makes itself";
  if (has(n, {"lift_fresh", "aten.lift"}))
    return "a tensor made from data outside torch (torch.tensor, torch.from_numpy) differs: make its source "
           "(NumPy, Python, a file) the same in every run";
  if (has(n, {"triton", "inductor", "compiled"}))
    return "torch.compile's autotuning picks kernels per run: compile without max-autotune, or replay without "
           "torch.compile";
  if (has(n, {"mm", "matmul", "linear", "conv"}))
    return deterministic
               ? "a GEMM that differs with deterministic algorithms on: on CUDA set CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                 "before CUDA starts, torch.backends.cudnn.benchmark = False and "
                 "torch.backends.cuda.matmul.allow_tf32 = False"
               : "torch.use_deterministic_algorithms(True), and on CUDA CUBLAS_WORKSPACE_CONFIG=:4096:8 and "
                 "torch.backends.cudnn.benchmark = False";
  return deterministic ? "this op gives other bits from the same inputs even with deterministic algorithms on: "
                         "replace it, or run it on the CPU"
                       : "torch.use_deterministic_algorithms(True): PyTorch then picks a deterministic kernel "
                         "for this op, or raises naming it";
}

std::string where(const Hashed& h, const DoctorRun& run) {
  if (h.what != "op") return h.name;
  std::string s = "op #" + std::to_string(h.index) + " " + h.name + " ";
  if (h.phase == "forward" && !h.module.empty()) {
    const auto t = run.module_types.find(h.module);
    s += "in the forward of module '" + h.module + "'" +
         (t != run.module_types.end() && !t->second.empty() ? " (" + t->second + ")" : "");
  } else if (h.phase == "forward") {
    s += "in the forward, outside the model's modules";
  } else if (h.phase == "optimizer") {
    s += "in optimizer.step";
  } else {
    s += "in the backward (or no_grad code such as gradient clipping)";
  }
  return s + ": its output " + h.shape + " " + h.dtype;
}

}  // namespace

int run_doctor(int argc, char** argv) {
  cxxopts::Options opts(
      "rewind doctor",
      "check that a training script repeats bit for bit, as rewind replay and bisect need\n\n"
      "  rewind doctor --cmd \"python3 train.py --batch_size 8\"\n\n"
      "Runs the script's first steps twice with REWIND_DOCTOR set: its rewind.record call records\n"
      "nothing, hashes the parameters, each step's batch, the output of every aten op the step\n"
      "runs (forward, backward and optimizer, with the module whose forward ran it), the loss and\n"
      "the parameters after it, and ends the script. The first hash that differs between the two\n"
      "runs is named (every tensor before it agrees, so its inputs were the same), with the switch\n"
      "that fixes it: torch.use_deterministic_algorithms, rewind.attention for SDPA, a seeded\n"
      "generator or batch source.\n"
      "Exit codes: 0 no difference found, 4 a difference found, 2 usage (the script does not call\n"
      "rewind.record or stops early).\n");
  opts.add_options()
      ("cmd", "the command that runs the script, e.g. \"python3 train.py\"", cxxopts::value<std::string>())
      ("steps", "loop steps to run twice", cxxopts::value<int>()->default_value("2"))
      ("h,help", "show help");
  auto r = opts.parse(argc, argv);
  if (wants_help(opts, r)) return 0;
  if (!r.count("cmd")) throw UsageError("doctor: --cmd \"python3 train.py ...\" is required");
  const int steps = r["steps"].as<int>();
  if (steps < 1) throw UsageError("doctor: --steps must be at least 1");
  const std::string cmd = r["cmd"].as<std::string>();
  const DoctorRun a = run_once(cmd, steps), b = run_once(cmd, steps);
  std::printf("doctor: ran the first %d step(s) of the script twice: %zu hashed tensors (torch %s, "
              "use_deterministic_algorithms %s)\n", steps, a.hashed.size(), a.torch.c_str(),
              a.deterministic ? "on" : "off");
  const size_t n = std::min(a.hashed.size(), b.hashed.size());
  for (size_t i = 0; i < n; ++i) {
    const Hashed &x = a.hashed[i], &y = b.hashed[i];
    if (x.same_as(y)) continue;
    if (x.what != y.what || x.name != y.name || x.shape != y.shape)
      std::printf("first difference: step %lld: the runs took other paths: %s in the first, %s in the second "
                  "(control flow that depends on something that varies)\n",
                  static_cast<long long>(x.step), where(x, a).c_str(), where(y, b).c_str());
    else if (x.what == "op")
      std::printf("first difference: step %lld, %s has other bits in the second run (every tensor before it "
                  "agrees: same inputs)\n", static_cast<long long>(x.step), where(x, a).c_str());
    else
      std::printf("first difference: %s%s: other bits in the second run\n", x.name.c_str(),
                  x.step >= 0 ? (", step " + std::to_string(x.step)).c_str() : "");
    std::printf("fix: %s\n", fix_for(x, a.deterministic).c_str());
    return static_cast<int>(ExitCode::kFinding);
  }
  if (a.hashed.size() != b.hashed.size()) {
    std::printf("first difference: the second run hashed %zu tensors, the first %zu (control flow that "
                "depends on something that varies)\n", b.hashed.size(), a.hashed.size());
    return static_cast<int>(ExitCode::kFinding);
  }
  std::printf("no difference found: every op's outputs, the batches, the losses and the parameters are "
              "bitwise equal in both runs\n");
  return 0;
}

}  // namespace rwd::cli
