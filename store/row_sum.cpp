// Row checksums (see row_sum.h): the encoding, and one function per covered table so that the
// writer and every reader hash the same columns in the same order.
#include "store/row_sum.h"

#include <cmath>
#include <cstring>

#include "store/content_hash.h"
#include "store/sqlite_db.h"

namespace rwd::store {

StepRecord step_from_row(const Statement& st) {
  StepRecord r;
  r.run = st.col_int(0);
  r.step = st.col_int(1);
  r.lr = st.col_double(2);
  r.loss_bits = static_cast<uint32_t>(st.col_int(3));
  r.grad_norm_bits = static_cast<uint32_t>(st.col_int(4));
  r.param_digest = st.col_opt_text(5);
  r.batch_ref = st.col_opt_text(6);
  r.batch_hash = st.col_text(7);
  r.rng_ref = st.col_opt_text(8);
  r.extra = st.col_opt_text(9);
  return r;
}

ProbeRecord probe_from_row(const Statement& st, bool with_created) {
  ProbeRecord p;
  p.key = st.col_text(0);
  p.job = st.col_text(1);
  p.plan = st.col_text(2);
  p.plan_hash = st.col_text(3);
  p.window = st.col_text(4);
  p.verdict = st.col_text(5);
  p.metrics = st.col_text(6);
  p.wall_s = st.col_double(7);
  if (with_created) p.created = st.col_text(8);
  return p;
}

RowSum::RowSum(const char* table) : seed_(xxh64(table, std::strlen(table))) {}

void RowSum::put(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }

RowSum& RowSum::add(int64_t v) {
  buf_.push_back('I');
  put(&v, sizeof v);  // little-endian hosts only, like the rest of the store's bit patterns
  return *this;
}

RowSum& RowSum::add_real(double v) {
  if (std::isnan(v)) {
    buf_.push_back('N');
    return *this;
  }
  if (v == 0.0) v = 0.0;  // -0.0 reads back as 0.0
  buf_.push_back('R');
  put(&v, sizeof v);
  return *this;
}

RowSum& RowSum::add(const std::string& v) {
  buf_.push_back('T');
  const uint64_t n = v.size();
  put(&n, sizeof n);
  buf_.append(v);
  return *this;
}

RowSum& RowSum::add(const std::optional<std::string>& v) {
  if (!v) {
    buf_.push_back('N');
    return *this;
  }
  return add(*v);
}

int64_t RowSum::value() const {
  const uint64_t h = xxh64(buf_.data(), buf_.size(), seed_);
  int64_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

int64_t run_row_sum(int64_t id, const std::string& config, const std::string& plan,
                    const std::string& meta) {
  return RowSum("runs").add(id).add(config).add(plan).add(meta).value();
}

int64_t step_row_sum(const StepRecord& r) {
  return RowSum("steps")
      .add(r.run)
      .add(r.step)
      .add_real(r.lr)
      .add(int64_t{r.loss_bits})
      .add(int64_t{r.grad_norm_bits})
      .add(r.param_digest)
      .add(r.batch_ref)
      .add(r.batch_hash)
      .add(r.rng_ref)
      .add(r.extra)
      .value();
}

int64_t checkpoint_row_sum(int64_t run, int64_t step, const std::string& name,
                           const std::string& blob, const std::string& dtype,
                           const std::string& shape) {
  return RowSum("checkpoints").add(run).add(step).add(name).add(blob).add(dtype).add(shape).value();
}

int64_t metric_row_sum(int64_t run, int64_t step, const std::string& key, double value) {
  return RowSum("metrics").add(run).add(step).add(key).add_real(value).value();
}

int64_t probe_row_sum(const ProbeRecord& p) {
  return RowSum("probes")
      .add(p.key)
      .add(p.job)
      .add(p.plan)
      .add(p.plan_hash)
      .add(p.window)
      .add(p.verdict)
      .add(p.metrics)
      .add_real(p.wall_s)
      .value();
}

int64_t kv_row_sum(int64_t run, const std::string& key, const std::string& value) {
  return RowSum("kv").add(run).add(key).add(value).value();
}

const char* row_sum_protects(const std::string& table) {
  if (table == "runs") return "the run's config, plan and meta";
  if (table == "steps") return "lr, loss, grad norm, parameter digest, batch, RNG state, extra";
  if (table == "checkpoints") return "the checkpoint tensor's name, blob, dtype and shape";
  if (table == "metrics") return "the metric's key and value";
  if (table == "probes") return "the bisect probe's plan, window, verdict and metrics";
  if (table == "kv") return "the entry's key and value";
  return "the row";
}

std::string row_corrupt_message(const std::string& path, const std::string& table,
                                const std::string& row) {
  return "store corrupted: " + path + ": table " + table + ", " + row +
         ": the row does not match its checksum (it protects " + row_sum_protects(table) + ")";
}

}  // namespace rwd::store
