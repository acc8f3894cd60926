// What a store's runs.meta says about a recorded run besides its config and plan: the data,
// the device, the recording options and what recorded it. Torch-free, so it is fuzzed with the
// other parsers of user-reachable text (a store file is user input too).
#pragma once

#include <map>
#include <string>

namespace rwd::train {

struct RunMeta {
  std::string data_path;
  std::string data_fingerprint;
  int threads = 1;
  std::string device = "cpu";        // "cpu" or "cuda" (LibTorch deterministic mode)
  std::string device_name;           // the processor: CPU model or GPU name and sm_XY ("" if unknown)
  // What recorded the run (filled by parse(); RunSpec::meta_json() writes this build's values).
  std::string recorded_rewind, recorded_torch;
  int recorded_numerics = 0;
  std::string attention = "rewind";  // "rewind" (our kernels, plan) or "sdpa" (baseline)
  int checkpoint_every = 0;
  int digest_every = 1;
  // Per-head monitors recorded on every N-th step from step 0 (train --monitor-every; the other
  // steps store none). 1: every step, as in stores older than the key.
  int monitor_every = 1;
  bool full_batches = false;
  int world_size = 1;                // data-parallel ranks (--nproc-per-node / torchrun)
  // Checkpoint retention while recording (train --keep-last / --keep-every; 0: off), kept with
  // the run so that a resume applies it too.
  int keep_last = 0;
  int keep_every = 0;
  // The bit-changing switches' values the run was recorded with, by name (common/switches.h);
  // empty for stores older than the key.
  std::map<std::string, std::string> switches;

  // Reads the JSON object RunSpec::meta_json() wrote; absent keys keep the defaults above
  // (stores older than the key). Throws Error(kData) naming the key for anything else: not an
  // object, a value of the wrong type, an integer out of its range.
  static RunMeta parse(const std::string& json);
};

}  // namespace rwd::train
