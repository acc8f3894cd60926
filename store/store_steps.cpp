// Steps: writing and reading the steps table. A read also checks that no row is missing
// between recorded steps: a recording commits its steps in order and nothing deletes one, so
// a hole (a row lost, or one whose run or step changed) is corruption, not a shorter window
// that a replay would verify in silence.
#include <algorithm>
#include <string>
#include <vector>

#include "store/row_sum.h"
#include "store/store.h"

namespace rwd::store {
namespace {

// Column 10 is the row checksum (Store::row_sum_column).
constexpr const char* kStepColumns =
    "SELECT run, step, lr, loss_bits, grad_norm_bits, param_digest, batch_ref, batch_hash, "
    "rng_ref, extra";

// The recorded step of `run` nearest below (`below`) or above `step`, or -1.
int64_t neighbour(Db& db, int64_t run, int64_t step, bool below) {
  Statement st(db, below ? "SELECT max(step) FROM steps WHERE run=? AND step<?"
                         : "SELECT min(step) FROM steps WHERE run=? AND step>?");
  st.bind(1, run).bind(2, step);
  return st.step() && !st.is_null(0) ? st.col_int(0) : -1;
}

// Throws "store corrupted" when `found` (the recorded steps of `run` in [from, to], ascending)
// leaves out a step that lies between two recorded ones.
void require_no_hole(Db& db, int64_t run, int64_t from, int64_t to, const std::vector<int64_t>& found) {
  std::vector<int64_t> seq;
  if (const int64_t before = neighbour(db, run, from, true); before >= 0) seq.push_back(before);
  seq.insert(seq.end(), found.begin(), found.end());
  if (const int64_t after = neighbour(db, run, to, false); after >= 0) seq.push_back(after);
  for (size_t i = 1; i < seq.size(); ++i) {
    const int64_t a = seq[i - 1], b = seq[i];
    if (b <= a + 1 || a + 1 > to || b - 1 < from) continue;
    const int64_t missing = std::max(a + 1, from);
    throw data_error("store corrupted: " + db.path() + ": table steps, run " + std::to_string(run) + " step " +
                     std::to_string(missing) + ": the row is missing, though steps " + std::to_string(a) +
                     " and " + std::to_string(b) + " are recorded (a row lost, or one whose run or step changed)");
  }
}

}  // namespace

StepRecord Store::read_checked_step(const Statement& st) const {
  StepRecord r = step_from_row(st);
  check_row(st, 10, step_row_sum(r), "steps",
            [&] { return "run " + std::to_string(r.run) + " step " + std::to_string(r.step); });
  return r;
}

void Store::put_step(const StepRecord& r) {
  require_writable("writing a step");
  Statement st(db_, row_sums_ ? "INSERT INTO steps(run, step, lr, loss_bits, grad_norm_bits, param_digest, "
                               "batch_ref, batch_hash, rng_ref, extra, row_sum) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                             : "INSERT INTO steps(run, step, lr, loss_bits, grad_norm_bits, param_digest, "
                               "batch_ref, batch_hash, rng_ref, extra) VALUES (?,?,?,?,?,?,?,?,?,?)");
  st.bind(1, r.run)
      .bind(2, r.step)
      .bind(3, r.lr)
      .bind(4, static_cast<int64_t>(r.loss_bits))
      .bind(5, static_cast<int64_t>(r.grad_norm_bits))
      .bind_opt(6, r.param_digest)
      .bind_opt(7, r.batch_ref)
      .bind(8, r.batch_hash)
      .bind_opt(9, r.rng_ref)
      .bind_opt(10, r.extra);
  if (row_sums_) st.bind(11, step_row_sum(r));
  st.run();
}

std::optional<StepRecord> Store::get_step(int64_t run, int64_t step) {
  Statement st(db_, (std::string(kStepColumns) + row_sum_column() + " FROM steps WHERE run=? AND step=?").c_str());
  st.bind(1, run).bind(2, step);
  if (!st.step()) {
    require_no_hole(db_, run, step, step, {});
    return std::nullopt;
  }
  return read_checked_step(st);
}

std::vector<StepRecord> Store::steps(int64_t run, int64_t from, int64_t to) {
  std::vector<StepRecord> out;
  const std::string sql =
      std::string(kStepColumns) + row_sum_column() + " FROM steps WHERE run=? AND step BETWEEN ? AND ? ORDER BY step";
  Statement st(db_, sql.c_str());
  st.bind(1, run).bind(2, from).bind(3, to);
  while (st.step()) out.push_back(read_checked_step(st));
  std::vector<int64_t> found;
  for (const StepRecord& r : out) found.push_back(r.step);
  require_no_hole(db_, run, from, to, found);
  return out;
}

std::optional<std::pair<int64_t, int64_t>> Store::step_range(int64_t run) {
  Statement st(db_, "SELECT min(step), max(step) FROM steps WHERE run=?");
  st.bind(1, run);
  if (!st.step() || st.is_null(0)) return std::nullopt;
  return std::make_pair(st.col_int(0), st.col_int(1));
}

}  // namespace rwd::store
