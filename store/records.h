// Plain records exchanged with the Store: rows of the runs, steps, tensors, metrics, probes
// tables plus the info() and verify() results. No behaviour beyond tiny bit-cast helpers.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "store/dtype.h"

namespace rwd::store {

using rwd::bits_float;
using rwd::float_bits;

struct RunInfo {
  int64_t id = 0;
  std::string created;  // ISO-8601 UTC, set by the store
  std::string config;   // JSON text
  std::string plan;     // precision plan text
  std::string meta;     // JSON text: rewind/torch version, device, threads, dataset fingerprint
};

// One training step. Loss and grad norm are FP32 values kept as exact bit patterns.
struct StepRecord {
  int64_t run = 0;
  int64_t step = 0;
  double lr = 0.0;
  uint32_t loss_bits = 0;
  uint32_t grad_norm_bits = 0;
  std::optional<std::string> param_digest;  // cheap digest of the parameters, when computed
  std::optional<std::string> batch_ref;     // blob hash of the stored batch tokens
  std::string batch_hash;                   // hash of the batch (always recorded)
  std::optional<std::string> rng_ref;       // blob hash of the RNG state
  std::optional<std::string> extra;         // JSON text

  float loss() const { return bits_float(loss_bits); }
  float grad_norm() const { return bits_float(grad_norm_bits); }
};

struct BlobInfo {
  std::string hash;
  int64_t raw_size = 0;
  int64_t stored_size = 0;  // sum of zstd frame sizes
  int64_t n_chunks = 0;
  int level = 0;    // zstd level it was written with
  int shuffle = 1;  // byte-shuffle element size applied before zstd (1 = none)
};

struct TensorKey {
  int64_t run = 0;
  int64_t step = 0;
  int layer = -1;  // -1: not per layer
  int head = -1;   // -1: not per head
  std::string name;
};

// Metadata of a checkpoint tensor (layer = head = -1) or a recorded tensor.
struct TensorInfo {
  TensorKey key;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::string blob;
  int64_t raw_size = 0;
  int64_t stored_size = 0;
};

struct TensorRecord {
  TensorInfo info;
  std::vector<uint8_t> bytes;  // raw little-endian elements, C order
};

struct MetricRow {
  int64_t step = 0;
  std::string key;
  double value = 0.0;
};

struct ProbeRecord {
  std::string key;  // cache key computed by bisect (unique)
  std::string job;
  std::string plan;
  std::string plan_hash;
  std::string window;  // e.g. "6580:6680"
  std::string verdict;
  std::string metrics;  // JSON text
  double wall_s = 0.0;
  std::string created;  // set by the store
};

struct RunSummary {
  RunInfo run;
  int64_t n_steps = 0;
  std::optional<std::pair<int64_t, int64_t>> step_range;
  std::vector<int64_t> checkpoint_steps;
  int64_t n_tensors = 0;
  int64_t n_metrics = 0;
};

struct StoreInfo {
  int schema_version = 0;
  std::vector<RunSummary> runs;
  int64_t n_blobs = 0;
  int64_t raw_bytes = 0;     // sum of blob raw sizes (after dedup)
  int64_t stored_bytes = 0;  // sum of zstd frame sizes
  int64_t n_probes = 0;
  int64_t n_kv = 0;
  int64_t file_bytes = 0;  // main file plus WAL
  int64_t free_bytes = 0;  // free pages, reused by later writes or given back by `store thin`
  bool incremental_vacuum = false;  // auto_vacuum=INCREMENTAL (set when a store is created)
  // Where the bytes are: the stored (zstd) bytes of the distinct blobs each kind of
  // row refers to (a blob two kinds share counts in both), and the pages of each table.
  int64_t n_checkpoints = 0;        // (run, step) pairs with a checkpoint
  int64_t checkpoint_bytes = 0;     // blobs of checkpoint tensors
  int64_t tensor_bytes = 0;         // blobs of captured tensors
  int64_t step_blob_bytes = 0;      // blobs of steps: stored batches and RNG states
  // (table or index, bytes of its pages), largest first; empty where this SQLite lacks the
  // dbstat table.
  std::vector<std::pair<std::string, int64_t>> table_bytes;
};

// A problem found by verify(): a blob (or "" for a database-level problem), what is wrong,
// and every item that references it, e.g. "run 1 step 7 tensor 'O' L2 H8".
struct BadItem {
  std::string blob;
  std::string problem;
  std::vector<std::string> referenced_by;
  // A row that fails its checksum: "table steps, run 1 step 30" (blob is then "").
  std::string row;
};

}  // namespace rwd::store
