// What a recording says about its run (config, plan schedule, data, environment) and how a
// recorded run is turned back into a Trainer. Shared by train, replay, step and bisect.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "train/config.h"
#include "train/plan_schedule.h"
#include "train/run_meta.h"
#include "train/model.h"
#include "plan/plan.h"

namespace rwd::store {
class Store;
}

namespace rwd::train {

// A recorded run: its config and plan schedule plus the metadata (RunMeta) beside them.
struct RunSpec : RunMeta {
  int64_t run_id = 0;
  Config config;
  PlanSchedule plan;

  std::string meta_json() const;  // everything but config and plan, plus versions
  // Writes keep_last, keep_every and monitor_every into the stored meta of run_id (train
  // --resume with another retention or monitor schedule), leaving its other keys as recorded.
  void store_resume_options(store::Store& s) const;
  static RunSpec load(store::Store& s, int64_t run_id);  // run_id 0 = the last run
};

// Prepares LibTorch for `device` ("cpu" | "cuda" | "cuda:N") before any CUDA work: the cuBLAS
// workspace setting, deterministic algorithms, no TF32. Throws UsageError when CUDA is absent.
torch::Device setup_device(const std::string& device);
AttentionImpl attention_impl(const std::string& name);
// What bits depend on besides the build: the CPU model (BLAS picks its kernels per processor)
// or the GPU name and compute capability.
std::string device_name(const torch::Device& device);
// Before a recorded run is computed again: one line on stderr (once per process and run) for
// each thing besides the inputs that its bits depend on and that differs here: the rewind
// numerics or LibTorch version, the processor. Replay is bitwise only when none does.
// `world`: the ranks computing it now (a run recorded on N ranks sums its gradients in another
// order on M != N ranks).
// First it refuses (UsageError) a run recorded under another value of a bit-changing switch
// (common/switches.h; an unset REWIND_FP32_GEMM or REWIND_FUSED_NORM takes the recorded one),
// then makes the GPU's FP32 GEMM the one the run was recorded with (use_recorded_numerics).
void warn_if_not_reproducible(const RunSpec& run, const torch::Device& device, int world = 1);
// On a GPU, unless REWIND_FP32_GEMM says otherwise: the FP32 linears of a run recorded under
// numerics 4 or 6 run 3xTF32, others cuBLAS's FP32 GEMM (Fp32Gemm::kSimt), so a recorded FP32
// plan replays bitwise; unless REWIND_FUSED_NORM says otherwise, LayerNorms run rewind's
// kernels for numerics 5 and 6, LibTorch's before. Process-wide, like the recording it serves.
void use_recorded_numerics(const RunSpec& run, const torch::Device& device);

std::string rewind_version();
// Bumped whenever a change alters the bits a training step computes on that kind of device
// (kernel rounding, GEMM path, optimizer arithmetic, loss). Stored with each run; replaying a
// run recorded under another numerics version (or another LibTorch) warns that divergence may
// come from that.
//   1: rewind 0.1  2: rewind 0.2 (CUDA: BF16 tensor-core qkv GEMM, multi-tensor AdamW; the
//   W_Q spectral-norm monitor by Gram-matrix power iteration and the gradient norm as one
//   FP64 reduction over all gradients, all devices)  3, CUDA only: the loss as one fused
//   cross-entropy over the BF16 logits (kernels/cuda/cross_entropy.cu); CPU runs stay at 2.
//   4, CUDA only: FP32 linears and LM head as 3xTF32 GEMMs (train/fp32_gemm.h); 3 where
//   REWIND_FP32_GEMM=simt (or a replay of a run recorded under 3) keeps cuBLAS's FP32 GEMM.
//   5 and 6, CUDA only: 3 and 4 with LayerNorm in rewind's kernels (train/norm.h), the
//   default; REWIND_FUSED_NORM=0 (or a replay of a run recorded under 3 or 4) keeps LibTorch's.
int numerics_version(bool cuda);
std::string torch_version();

}  // namespace rwd::train
