// Row checksums: an XXH64 over a canonical encoding of a table row's columns, kept in the row's
// `row_sum` column, so that a flipped bit in a value a replay or a verdict reads (a step's
// loss, a parameter digest, a run's config) reads as corruption instead of as a divergence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "store/records.h"

namespace rwd::store {

class Statement;

// The rows the readers and verify() both decode. A steps row from columns run, step, lr,
// loss_bits, grad_norm_bits, param_digest, batch_ref, batch_hash, rng_ref, extra (0..9).
StepRecord step_from_row(const Statement& st);
// A probes row from columns key, job, plan, plan_hash, window, verdict, metrics, wall_s (0..7),
// and created (8) when `with_created`.
ProbeRecord probe_from_row(const Statement& st, bool with_created);

// Accumulates one row's columns in order. Each value is tagged with its kind (null, integer,
// real, text) and texts carry their length, so no two different rows encode alike. The seed is
// the table's name: a row copied into another table does not verify there.
class RowSum {
 public:
  explicit RowSum(const char* table);
  RowSum& add(int64_t v);
  // Real columns: SQLite keeps NaN as NULL and an integral value such as -0.0 as the integer
  // 0, so the value is hashed as it reads back (NaN as null, -0.0 as 0.0).
  RowSum& add_real(double v);
  RowSum& add(const std::string& v);
  RowSum& add(const std::optional<std::string>& v);
  // As stored in the INTEGER column (the 64 bits reinterpreted as signed).
  int64_t value() const;

 private:
  void put(const void* p, size_t n);
  std::string buf_;
  uint64_t seed_;
};

// The checksum of each covered table's row, from the values the Store writes and reads back.
// runs and probes: every column but `created`, which SQLite stamps at insert.
int64_t run_row_sum(int64_t id, const std::string& config, const std::string& plan,
                    const std::string& meta);
int64_t step_row_sum(const StepRecord& r);
int64_t checkpoint_row_sum(int64_t run, int64_t step, const std::string& name,
                           const std::string& blob, const std::string& dtype,
                           const std::string& shape);
int64_t metric_row_sum(int64_t run, int64_t step, const std::string& key, double value);
int64_t probe_row_sum(const ProbeRecord& p);
int64_t kv_row_sum(int64_t run, const std::string& key, const std::string& value);

// What each covered table's checksum protects, for messages ("loss, grad norm, ...").
const char* row_sum_protects(const std::string& table);

// The one-line error of a row that fails its checksum: "store corrupted: PATH: table steps,
// run 1 step 30: the row does not match its checksum (it protects ...)". `row` names the row.
std::string row_corrupt_message(const std::string& path, const std::string& table,
                                const std::string& row);

}  // namespace rwd::store
