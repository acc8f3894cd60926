// Store lifecycle (create/open), content-addressed blobs, runs and steps.
#include "store/store.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "store/byte_shuffle.h"
#include "store/content_hash.h"
#include "store/schema.h"

namespace rwd::store {
namespace {

bool missing_or_empty(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno == ENOENT;
  return S_ISREG(st.st_mode) && st.st_size == 0;
}

StepRecord read_step(const Statement& st) {
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

constexpr const char* kStepColumns =
    "SELECT run, step, lr, loss_bits, grad_norm_bits, param_digest, batch_ref, batch_hash, "
    "rng_ref, extra FROM steps ";

}  // namespace

Store::Store(Db db, Mode mode, const StoreOptions& options, int schema_version)
    : db_(std::move(db)),
      mode_(mode),
      options_(options),
      schema_version_(schema_version),
      compressor_(options.zstd_level, options.zstd_workers) {}

Store Store::create(const std::string& path, const StoreOptions& options) {
  if (!missing_or_empty(path)) {
    throw data_error("store " + path + ": already exists; refusing to overwrite it");
  }
  Db db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  configure_connection(db, Mode::kReadWrite, options.busy_timeout_ms);
  create_schema(db, options);
  return Store(std::move(db), Mode::kReadWrite, options, kSchemaVersion);
}

Store Store::open(const std::string& path, Mode mode, const StoreOptions& options) {
  precheck_store_file(path);
  Db db(path, mode == Mode::kReadOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE);
  configure_connection(db, mode, options.busy_timeout_ms);
  int version = check_schema(db, mode);
  return Store(std::move(db), mode, options, version);
}

Store Store::open_or_create(const std::string& path, const StoreOptions& options) {
  if (missing_or_empty(path)) return create(path, options);
  return open(path, Mode::kReadWrite, options);
}

void Store::require_writable(const char* doing) const {
  if (mode_ == Mode::kReadOnly) {
    throw StoreError(ExitCode::kInternal,
                     "store " + path() + ": " + doing + ": store was opened read-only");
  }
}

Transaction Store::begin_step() {
  require_writable("beginning a step");
  return Transaction(db_);
}

std::string Store::put_blob(const void* data, size_t size, int shuffle_elem) {
  require_writable("writing a blob");
  if (shuffle_elem != 1 && shuffle_elem != 2 && shuffle_elem != 4 && shuffle_elem != 8) {
    throw StoreError(ExitCode::kInternal, "put_blob: shuffle element size must be 1, 2, 4 or 8");
  }
  std::string hash = content_hash(data, size);
  if (blob_exists(hash, size)) return hash;  // a read: in WAL mode it takes no write lock
  const PreparedBlob b = prepare_blob(hash, data, size, shuffle_elem);
  in_transaction(db_, [&] {
    if (!blob_exists(b.hash, b.size)) insert_blob(b);  // another connection may have meanwhile
  });
  return hash;
}

int Store::tensor_shuffle(Dtype dtype) const {
  return options_.byte_shuffle ? static_cast<int>(dtype_size(dtype)) : 1;
}

bool Store::blob_exists(const std::string& hash, size_t size) {
  Statement st(db_, "SELECT raw_size FROM blobs WHERE hash=?");
  st.bind(1, hash);
  if (!st.step()) return false;
  if (st.col_int(0) != static_cast<int64_t>(size)) {
    throw data_error("store " + path() + ": blob " + hash + " exists with " +
                     std::to_string(st.col_int(0)) + " bytes but new content has " +
                     std::to_string(size) + " (hash collision or corrupt row)");
  }
  return true;
}

Store::PreparedBlob Store::prepare_blob(std::string hash, const void* data, size_t size,
                                        int shuffle_elem) {
  PreparedBlob b;
  b.hash = std::move(hash);
  b.size = size;
  b.shuffle = shuffle_elem;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  // Even an empty blob gets one (empty) frame, so every blob has n_chunks >= 1.
  const size_t n_chunks = std::max<size_t>(1, (size + kChunkBytes - 1) / kChunkBytes);
  for (size_t i = 0; i < n_chunks; ++i) {
    const size_t off = i * kChunkBytes;
    const size_t len = std::min(kChunkBytes, size - off);
    const uint8_t* raw = p + off;
    if (shuffle_elem > 1) {
      // kChunkBytes is a multiple of 8, so every chunk starts on an element boundary.
      scratch_.resize(len);
      byte_shuffle(raw, len, static_cast<size_t>(shuffle_elem), scratch_.data());
      raw = scratch_.data();
    }
    b.frames.push_back(compressor_.compress(raw, len));
    b.stored += static_cast<int64_t>(b.frames.back().size());
  }
  return b;
}

void Store::insert_blob(const PreparedBlob& b) {
  Statement ins(db_, "INSERT INTO blob_chunks(hash, idx, frame) VALUES (?, ?, ?)");
  for (size_t i = 0; i < b.frames.size(); ++i) {
    ins.reset();
    ins.bind(1, b.hash).bind(2, static_cast<int64_t>(i)).bind_blob(3, b.frames[i].data(), b.frames[i].size());
    ins.run();
  }
  Statement row(db_,
                "INSERT INTO blobs(hash, raw_size, stored_size, n_chunks, level, shuffle) "
                "VALUES (?, ?, ?, ?, ?, ?)");
  row.bind(1, b.hash)
      .bind(2, static_cast<int64_t>(b.size))
      .bind(3, b.stored)
      .bind(4, static_cast<int64_t>(b.frames.size()))
      .bind(5, static_cast<int64_t>(compressor_.level()))
      .bind(6, static_cast<int64_t>(b.shuffle));
  row.run();
}

// Inside the caller's transaction: hash, compress and insert (the step's own small tensors).
std::string Store::write_blob(const void* data, size_t size, int shuffle_elem) {
  std::string hash = content_hash(data, size);
  if (!blob_exists(hash, size)) insert_blob(prepare_blob(hash, data, size, shuffle_elem));
  return hash;
}

bool Store::has_blob(const std::string& hash) {
  Statement st(db_, "SELECT 1 FROM blobs WHERE hash=?");
  st.bind(1, hash);
  return st.step();
}

std::optional<BlobInfo> Store::blob_info(const std::string& hash) {
  Statement st(db_,
               "SELECT raw_size, stored_size, n_chunks, level, shuffle FROM blobs WHERE hash=?");
  st.bind(1, hash);
  if (!st.step()) return std::nullopt;
  return BlobInfo{hash,
                  st.col_int(0),
                  st.col_int(1),
                  st.col_int(2),
                  static_cast<int>(st.col_int(3)),
                  static_cast<int>(st.col_int(4))};
}

std::vector<uint8_t> Store::get_blob(const std::string& hash) {
  const std::string what = "store " + path() + ": blob " + hash;
  std::optional<BlobInfo> info = blob_info(hash);
  if (!info) throw data_error(what + " is missing");
  const int sh = info->shuffle;
  if (info->raw_size < 0 || info->n_chunks < 1 || (sh != 1 && sh != 2 && sh != 4 && sh != 8) ||
      info->n_chunks != std::max<int64_t>(1, (info->raw_size + int64_t(kChunkBytes) - 1) /
                                                 int64_t(kChunkBytes))) {
    throw data_error(what + ": inconsistent size/chunk count/shuffle in its row");
  }
  std::vector<uint8_t> out(static_cast<size_t>(info->raw_size));
  Statement st(db_, "SELECT idx, frame FROM blob_chunks WHERE hash=? ORDER BY idx");
  st.bind(1, hash);
  int64_t expect_idx = 0;
  while (st.step()) {
    if (st.col_int(0) != expect_idx || expect_idx >= info->n_chunks) {
      throw data_error(what + ": unexpected chunk " + std::to_string(st.col_int(0)));
    }
    const size_t off = static_cast<size_t>(expect_idx) * kChunkBytes;
    const size_t len = std::min(kChunkBytes, out.size() - off);
    const std::string chunk = what + " chunk " + std::to_string(expect_idx);
    if (info->shuffle == 1) {
      decompressor_.decompress(st.col_blob(1), st.col_bytes(1), out.data() + off, len,
                               chunk.c_str());
    } else {
      scratch_.resize(len);
      decompressor_.decompress(st.col_blob(1), st.col_bytes(1), scratch_.data(), len,
                               chunk.c_str());
      byte_unshuffle(scratch_.data(), len, static_cast<size_t>(info->shuffle), out.data() + off);
    }
    ++expect_idx;
  }
  if (expect_idx != info->n_chunks) {
    throw data_error(what + ": has " + std::to_string(expect_idx) + " of " +
                     std::to_string(info->n_chunks) + " chunks");
  }
  if (content_hash(out.data(), out.size()) != hash) {
    throw data_error(what + ": content hash mismatch after decompression");
  }
  return out;
}

int64_t Store::add_run(const std::string& config_json, const std::string& plan,
                       const std::string& meta_json) {
  require_writable("adding a run");
  Statement st(db_, "INSERT INTO runs(config, plan, meta) VALUES (?, ?, ?)");
  st.bind(1, config_json).bind(2, plan).bind(3, meta_json);
  st.run();
  return sqlite3_last_insert_rowid(db_.get());
}

std::vector<RunInfo> Store::runs() {
  std::vector<RunInfo> out;
  Statement st(db_, "SELECT id, created, config, plan, meta FROM runs ORDER BY id");
  while (st.step()) {
    out.push_back({st.col_int(0), st.col_text(1), st.col_text(2), st.col_text(3), st.col_text(4)});
  }
  return out;
}

std::optional<RunInfo> Store::run(int64_t id) {
  Statement st(db_, "SELECT id, created, config, plan, meta FROM runs WHERE id=?");
  st.bind(1, id);
  if (!st.step()) return std::nullopt;
  return RunInfo{st.col_int(0), st.col_text(1), st.col_text(2), st.col_text(3), st.col_text(4)};
}

void Store::put_step(const StepRecord& r) {
  require_writable("writing a step");
  Statement st(db_,
               "INSERT INTO steps(run, step, lr, loss_bits, grad_norm_bits, param_digest, "
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
  st.run();
}

std::optional<StepRecord> Store::get_step(int64_t run, int64_t step) {
  Statement st(db_, (std::string(kStepColumns) + "WHERE run=? AND step=?").c_str());
  st.bind(1, run).bind(2, step);
  if (!st.step()) return std::nullopt;
  return read_step(st);
}

std::vector<StepRecord> Store::steps(int64_t run, int64_t from, int64_t to) {
  std::vector<StepRecord> out;
  const std::string sql =
      std::string(kStepColumns) + "WHERE run=? AND step BETWEEN ? AND ? ORDER BY step";
  Statement st(db_, sql.c_str());
  st.bind(1, run).bind(2, from).bind(3, to);
  while (st.step()) out.push_back(read_step(st));
  return out;
}

std::optional<std::pair<int64_t, int64_t>> Store::step_range(int64_t run) {
  Statement st(db_, "SELECT min(step), max(step) FROM steps WHERE run=?");
  st.bind(1, run);
  if (!st.step() || st.is_null(0)) return std::nullopt;
  return std::make_pair(st.col_int(0), st.col_int(1));
}

}  // namespace rwd::store
