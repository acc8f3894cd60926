// rewind's recording store: one SQLite file (WAL) per recording holding runs, steps,
// content-addressed zstd blobs, checkpoints, tensors, metrics, bisect probes and a kv table.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "store/bytes.h"
#include "store/dtype.h"
#include "store/records.h"
#include "store/retention.h"
#include "store/sqlite_db.h"
#include "store/store_error.h"
#include "store/zstd_codec.h"

namespace rwd::store {

// Schema version written to PRAGMA user_version. Bump it together with a migration in
// schema.cpp; older files are migrated on read-write open (read-only they are read as they
// are), newer ones are refused. Version 2 added the row checksums (row_sum.h).
constexpr int kSchemaVersion = 2;
// PRAGMA application_id: the magic number that marks a SQLite file as a rewind store ("RWND").
constexpr int32_t kApplicationId = 0x52574E44;
// Raw bytes per zstd frame; SQLite caps one value at 1 GB, so big blobs are split.
constexpr size_t kChunkBytes = size_t(64) << 20;

enum class Mode { kReadOnly, kReadWrite };

// One blob for Store::put_blobs: `size` bytes at `data`, which must stay valid and unchanged
// until put_blobs returns; shuffle_elem as for put_blob.
struct BlobSource {
  const void* data = nullptr;
  size_t size = 0;
  int shuffle_elem = 1;
};

struct StoreOptions {
  // zstd level of newly written blobs (recorded per blob). 1: on byte-shuffled FP32/BF16 it
  // compresses as well as 3 or better (store_bench: 1.186 vs 1.168 on a gpt2-small checkpoint)
  // at half the CPU (1.2 vs 2.5 s a GB on the dev VM).
  int zstd_level = 1;
  // Threads that compress blobs (0 = the calling thread only). put_blobs prepares (hashes,
  // byte-shuffles, compresses) that many blob chunks at once, each thread with its own
  // single-threaded zstd context; put_blob compresses each frame with that many zstd worker
  // threads (capped at what libzstd supports).
  int zstd_workers = 0;
  int busy_timeout_ms = 10000;  // how long a connection waits for another's lock
  // SQLite page size of a new file (an existing one keeps its own). 64 KiB pages copy a big
  // checkpoint faster (store_bench pieces, 1 GB: inserts + WAL fsync + WAL checkpoint 4.9 s
  // against 6.5 s at 16 KiB) but every step commit writes its changed pages whole into the
  // WAL, 3-4x the bytes, and a new store starts at ~0.8 MB: a test recording on a 3 MiB tmpfs
  // could not commit its first step. So 16 KiB stays the default.
  int page_size = 16384;
  // WAL pages after which a commit copies the WAL into the main file and fsyncs it (SQLite's
  // auto-checkpoint; 1000 is its default). 0: commits never do; the owner calls checkpoint_wal()
  // on its own schedule (and put_blobs, see overlap_checkpoint_bytes). The recorder turns it off on both of its connections: a checkpoint's
  // blob commits each ran a WAL checkpoint (store_bench: the writer stopped scaling at 2-4
  // threads), and a step commit landing on one waited for it.
  int wal_autocheckpoint = 1000;
  // With wal_autocheckpoint 0, a put_blobs call writing at least this many raw bytes of new
  // blobs outside a transaction copies the WAL into the main file on a helper connection (a
  // PASSIVE checkpoint each time half as many stored bytes were committed) while it goes on
  // compressing and inserting, so the copy and its fsyncs overlap that work instead of all
  // following it in the owner's checkpoint_wal. 0: never.
  size_t overlap_checkpoint_bytes = size_t(256) << 20;
  // Byte-shuffle tensor blobs by element size before zstd. store_bench (H100 host, level 3):
  // ratio 1.08 -> 1.17 on FP32 weights, 1.29 -> 1.41 on BF16 activations, at the cost of
  // write speed (165 -> 128 and 201 -> 110 MB/s). The content hash is of the raw bytes.
  bool byte_shuffle = true;
};

class Store {
 public:
  // Creates a new store. Fails (kData) if `path` exists, unless it is a file-level stub (an
  // empty file, an SQLite file with no tables: see stub_reason) that holds nothing, which is
  // replaced; anything else is never overwritten (a rewind store with no run in it included:
  // the process that created it may still be about to add one).
  // The schema is written under a temporary name beside `path` and linked into place once
  // complete, so a process killed while creating leaves no file at `path` or a whole store.
  static Store create(const std::string& path, const StoreOptions& options = {});
  // Why the file at `path` is a stub that holds nothing, or nullopt: "an empty file" (0 bytes),
  // "an SQLite file with no tables" (a file created by an older rewind killed before its
  // schema was in, a hot rollback journal beside it included), "a rewind store with no run in
  // it" (no row in any table) or "... with no checkpoint and no step in it" (a run added and
  // killed before its first checkpoint; unused blobs and kv rows may be left). Reads only.
  static std::optional<std::string> stub_reason(const std::string& path);
  // Opens an existing store. Anything that is not a rewind store (missing, directory, random
  // bytes, truncated, other SQLite database, newer schema) fails with one-line StoreError(kData)
  // before a single byte of the file is written. kReadOnly never writes the store; like any
  // SQLite WAL reader it may leave empty `-wal`/`-shm` side files, removed by the next writer.
  // kReadWrite on a file SQLite can only open read-only (permissions, read-only file system)
  // fails with StoreError(kData, lib_code SQLITE_READONLY) instead of at the first write.
  static Store open(const std::string& path, Mode mode, const StoreOptions& options = {});
  // Opens read-write when `path` holds a store; creates it when missing or empty.
  static Store open_or_create(const std::string& path, const StoreOptions& options = {});

  Store(Store&&) noexcept = default;
  Store& operator=(Store&&) noexcept = default;
  ~Store() = default;

  const std::string& path() const { return db_.path(); }
  bool read_only() const { return mode_ == Mode::kReadOnly; }
  int schema_version() const { return schema_version_; }

  // One transaction per recorded step: everything written until commit() (step row, blobs,
  // tensors, metrics) becomes visible to readers at once, or not at all after a crash.
  // Methods called outside such a transaction each run in their own. The Transaction points
  // into this Store: do not move the Store while one is open.
  Transaction begin_step();
  // Throws StoreError(kData, lib_code SQLITE_READONLY_DBMOVED) if the file was deleted or
  // renamed since it was opened: SQLite would go on writing into the unlinked file unharmed,
  // so a recorder asks before each commit rather than record into nothing.
  void check_in_place();

  // Blobs: content-addressed by content_hash() of the raw bytes; putting an existing blob is a
  // no-op. get_blob decompresses, checks every frame and the hash, throws kData on mismatch.
  // shuffle_elem (1, 2, 4 or 8): element size for the byte-shuffle filter, 1 = none.
  // Hashing and compression run before the write lock is taken (when no transaction is open),
  // so a big blob, e.g. a checkpoint tensor written by a background thread, does not stall the
  // commits of other connections while it is compressed.
  std::string put_blob(const void* data, size_t size, int shuffle_elem = 1);
  // put_blob for many blobs at once, returning their hashes in order; the stored rows and
  // frames are the same whatever the thread count. Hashing, byte-shuffling and compressing run
  // on StoreOptions::zstd_workers threads, over blobs and their 64 MiB chunks (the whole input
  // is hashed first, so blobs already stored, or repeated in `blobs`, are not compressed);
  // SQLite is used only on the calling thread, each new blob inserted in a short transaction of
  // its own as soon as its chunks are ready (inside an open transaction: in that one). The
  // chunks being compressed or waiting for their insert hold at most (threads + 2) x 64 MiB of
  // raw bytes (besides the frames of the blob being completed), which bounds the memory in
  // flight however large the input is.
  // The first error (of a thread or an insert) is rethrown once the threads have stopped;
  // blobs inserted before it stay stored, unreferenced until a row refers to them.
  std::vector<std::string> put_blobs(const std::vector<BlobSource>& blobs);
  // The byte-shuffle element size this store applies to tensors of `dtype` (1 = none).
  int tensor_shuffle(Dtype dtype) const;
  std::vector<uint8_t> get_blob(const std::string& hash);
  // get_blob for many blobs: frames read here, decompressed and hashed on `threads` threads
  // (0: this thread), at most ~256 MiB of frames read ahead. Same checks, same errors.
  std::vector<std::vector<uint8_t>> get_blobs(const std::vector<std::string>& hashes, int threads);
  // get_blobs into the caller's memory: dest(i, raw_size) returns where blob i goes (raw_size
  // writable bytes; it may throw, before any frame is read). The threads decompress straight
  // into it: no zero-filled buffer, no second copy (a checkpoint restore's tensors).
  void get_blobs_into(const std::vector<std::string>& hashes, int threads,
                      const std::function<uint8_t*(size_t, size_t)>& dest);
  // The tensors of these rows (e.g. checkpoint_entries), their blobs read by get_blobs.
  std::vector<TensorRecord> read_tensors(std::vector<TensorInfo> infos, int threads);
  // read_tensors into the caller's memory: dest(i) returns tensor i's buffer of
  // shape_numel(shape) x dtype_size(dtype) bytes; a blob of another size is a kData error.
  void read_tensors_into(const std::vector<TensorInfo>& infos, int threads,
                         const std::function<uint8_t*(size_t)>& dest);
  bool has_blob(const std::string& hash);
  std::optional<BlobInfo> blob_info(const std::string& hash);

  // Runs. config/meta are JSON text (validated by SQLite's json_valid), plan is plan text.
  int64_t add_run(const std::string& config_json, const std::string& plan,
                  const std::string& meta_json);
  std::vector<RunInfo> runs();
  std::optional<RunInfo> run(int64_t id);
  // Replaces a run's plan (the schedule JSON): `train --resume` under another plan records
  // the change at the resume step. StoreError(kData) when the run does not exist.
  void update_run_plan(int64_t run, const std::string& plan);
  // Replaces a run's meta JSON: `train --resume` with another checkpoint retention stores it,
  // so a later resume keeps it. StoreError(kData) when the run does not exist.
  void update_run_meta(int64_t run, const std::string& meta_json);

  // Steps; ranges are inclusive [from, to]. put_step refuses a step that already exists.
  void put_step(const StepRecord& step);
  std::optional<StepRecord> get_step(int64_t run, int64_t step);
  std::vector<StepRecord> steps(int64_t run, int64_t from, int64_t to);
  std::optional<std::pair<int64_t, int64_t>> step_range(int64_t run);  // first, last

  // Checkpoints: named tensors of the training state at a step.
  void put_checkpoint_tensor(int64_t run, int64_t step, const std::string& name, Dtype dtype,
                             const std::vector<int64_t>& shape, const void* data, size_t nbytes);
  // The same row for a tensor whose bytes are already stored as blob `hash` (put_blob(s)), so
  // they are not hashed again: kData if that blob is missing, kInternal if its size is not what
  // dtype and shape need.
  void put_checkpoint_blob(int64_t run, int64_t step, const std::string& name, Dtype dtype,
                           const std::vector<int64_t>& shape, const std::string& hash);
  std::vector<int64_t> checkpoint_steps(int64_t run);
  std::optional<int64_t> nearest_checkpoint(int64_t run, int64_t step);  // largest <= step
  std::vector<TensorInfo> checkpoint_entries(int64_t run, int64_t step);
  std::optional<TensorRecord> get_checkpoint_tensor(int64_t run, int64_t step,
                                                    const std::string& name);

  // Tensors recorded during a step (layer/head -1 when not applicable).
  void put_tensor(const TensorKey& key, Dtype dtype, const std::vector<int64_t>& shape,
                  const void* data, size_t nbytes);
  std::optional<TensorRecord> get_tensor(const TensorKey& key);
  std::vector<TensorInfo> tensors(int64_t run, int64_t from, int64_t to);

  // Scalar metrics per step; key_prefix "" selects all keys.
  void put_metric(int64_t run, int64_t step, const std::string& key, double value);
  // Many metrics of one step through one prepared statement (a recorded gpt2-small step has
  // 576 per-head monitors: preparing the INSERT for each cost more than the inserts).
  void put_metrics(int64_t run, int64_t step, const std::vector<std::pair<std::string, double>>& kv);
  std::vector<MetricRow> metrics(int64_t run, int64_t from, int64_t to,
                                 const std::string& key_prefix = "");
  std::vector<std::string> metric_keys(int64_t run);  // distinct keys, sorted

  // Bisect probe cache; put_probe replaces a probe with the same key.
  void put_probe(const ProbeRecord& probe);
  std::optional<ProbeRecord> get_probe(const std::string& key);
  std::vector<ProbeRecord> probes(const std::string& job = "");  // "" = all jobs

  // Generic key/value text per run (run 0 = store-wide), e.g. divergence curves.
  void put_kv(int64_t run, const std::string& key, const std::string& value);
  std::optional<std::string> get_kv(int64_t run, const std::string& key);
  std::vector<std::string> kv_keys(int64_t run, const std::string& prefix = "");

  // Copies what the WAL holds into the main file and fsyncs it, without waiting for (or
  // blocking) other connections: PRAGMA wal_checkpoint(PASSIVE). Frames a reader still needs
  // stay in the WAL for a later call. A no-op outside WAL mode or on a read-only store.
  // truncate: wal_checkpoint(TRUNCATE), which waits for other writers and empties the WAL file
  // (Db::checkpoint_wal): what a long recording needs after each checkpoint, or its WAL grows
  // by every checkpoint written, retention or not.
  void checkpoint_wal(bool truncate = false);

  // Checkpoint retention. plan_thin says what thin would do to `run` under `rules`
  // (reads only); thin deletes those checkpoints and the blobs no other row refers to, in one
  // transaction (the caller keeps recordings out: store::WriterLock). Steps, metrics, batches
  // and captured tensors stay. The freed pages are reused by later writes; reclaim_space gives
  // them back to the file system: PRAGMA incremental_vacuum on stores created with
  // auto_vacuum=INCREMENTAL (every new one), else a VACUUM that rewrites the file (needing
  // room for a copy of it) and switches it to incremental.
  ThinPlan plan_thin(int64_t run, const ThinRules& rules);
  ThinPlan thin(int64_t run, const ThinRules& rules);
  // Returns whether it ran a VACUUM.
  bool reclaim_space();
  int64_t free_bytes();       // bytes of the free pages (PRAGMA freelist_count x page_size)
  bool incremental_vacuum();  // created (or VACUUMed by thin) with auto_vacuum=INCREMENTAL
  int64_t file_bytes() const; // the main file plus its WAL

  StoreInfo info();
  // Decompresses every blob, checks every hash and frame, and that every referenced blob
  // exists; checks every row checksum (runs, steps, checkpoints, metrics, probes, kv); runs
  // SQLite's quick_check. Empty result = store is sound.
  std::vector<BadItem> verify();
  // Rows that verify() and the readers cannot check, per table (tables with none left out):
  // all rows of a store read at schema version 1 (no checksum column), and rows written before
  // a read-write open added the column.
  std::vector<std::pair<std::string, int64_t>> unchecked_rows();
  // Whether this store's rows carry checksums (schema version 2 and later).
  bool has_row_sums() const { return row_sums_; }

 private:
  Store(Db db, Mode mode, const StoreOptions& options, int schema_version);
  void require_writable(const char* doing) const;
  // A blob hashed and compressed, not yet written (no database access).
  struct PreparedBlob {
    std::string hash;
    size_t size = 0;
    int shuffle = 1;
    int64_t stored = 0;
    std::vector<Bytes> frames;
  };
  PreparedBlob prepare_blob(std::string hash, const void* data, size_t size, int shuffle_elem);
  // Whether the blob exists; kData if a blob of that hash exists with another size.
  bool blob_exists(const std::string& hash, size_t size);
  StoreError size_mismatch(const std::string& hash, size_t stored, size_t size) const;
  void insert_blob(const PreparedBlob& b);  // inside a transaction, of a blob not stored yet
  std::string write_blob(const void* data, size_t size, int shuffle_elem);
  void insert_checkpoint_row(int64_t run, int64_t step, const std::string& name, Dtype dtype,
                             const std::vector<int64_t>& shape, const std::string& hash);
  std::optional<TensorRecord> read_tensor(TensorInfo info);
  // References to a blob, described for humans: "run 1 step 5 checkpoint 'wte'".
  std::vector<std::string> blob_references(const std::string& hash);
  // UPDATE runs SET `column` (plan or meta) of `run`.
  void update_run(int64_t run, const char* column, const std::string& text);
  // Checkpoints of `run` (`steps`, ascending) that stored bisect probes and logs need: the one
  // at or before each window's first step, with the window that needs it.
  std::vector<std::pair<int64_t, std::string>> checkpoint_pins(int64_t run, const std::vector<int64_t>& steps);
  // ", row_sum" where the column exists, else ", NULL": appended to a reader's column list.
  const char* row_sum_column() const { return row_sums_ ? ", row_sum" : ", NULL"; }
  // Throws the "store corrupted" kData error when column `col` of `st` holds a checksum other
  // than `want`; a NULL (a row older than the checksums) passes unchecked. `row` names the row.
  RunInfo read_run(const Statement& st) const;             // columns of kRunColumns + row_sum
  StepRecord read_checked_step(const Statement& st) const;  // columns of kStepColumns + row_sum
  TensorInfo read_checkpoint_info(const Statement& st) const;  // checkpoint_select's columns
  std::string checkpoint_select(const char* where) const;
  ProbeRecord read_checked_probe(const Statement& st) const;
  void check_row(const Statement& st, int col, int64_t want, const char* table,
                 const std::function<std::string()>& row) const;

  Db db_;
  Mode mode_;
  StoreOptions options_;
  int schema_version_;
  bool row_sums_;  // the covered tables have a row_sum column
  bool immutable_ = false;  // read without a -shm (Store::open's fallback); so are its helpers
  ZstdCompressor compressor_;
  ZstdDecompressor decompressor_;
  Bytes scratch_;  // one chunk, shuffled (write) or still shuffled (read)
};

}  // namespace rwd::store
