// Content-addressed blobs of the store: hashed, chunked into zstd frames (byte-shuffled per
// element size), written once whatever the number of writers (store.cpp: lifecycle and runs).
#include "store/store.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "store/blob_format.h"
#include "store/byte_shuffle.h"
#include "store/content_hash.h"
#include "store/ordered_work.h"
#include "store/wal_checkpointer.h"

namespace rwd::store {
namespace {

// Chunk `idx` of a blob as one zstd frame in `frame`, byte-shuffled through `scratch` first
// when shuffle_elem > 1 (kChunkBytes is a multiple of 8, so every chunk starts on an element
// boundary).
void compress_chunk(ZstdCompressor& zstd, Bytes& scratch, const void* data, size_t size,
                    size_t idx, int shuffle_elem, Bytes& frame) {
  const size_t off = idx * kChunkBytes;
  const size_t len = std::min(kChunkBytes, size - off);
  const uint8_t* raw = static_cast<const uint8_t*>(data) + off;
  if (shuffle_elem > 1) {
    resize_for_overwrite(scratch, len);
    byte_shuffle(raw, len, static_cast<size_t>(shuffle_elem), scratch.data());
    raw = scratch.data();
  }
  zstd.compress(raw, len, frame);
}

void check_shuffle(int shuffle_elem) {
  if (!valid_shuffle(shuffle_elem)) {
    throw StoreError(ExitCode::kInternal, "put_blob: shuffle element size must be 1, 2, 4 or 8");
  }
}

}  // namespace

std::string Store::put_blob(const void* data, size_t size, int shuffle_elem) {
  require_writable("writing a blob");
  check_shuffle(shuffle_elem);
  std::string hash = content_hash(data, size);
  if (blob_exists(hash, size)) return hash;  // a read: in WAL mode it takes no write lock
  const PreparedBlob b = prepare_blob(hash, data, size, shuffle_elem);
  in_transaction(db_, [&] {
    if (!blob_exists(b.hash, b.size)) insert_blob(b);  // another connection may have meanwhile
  });
  return hash;
}

std::vector<std::string> Store::put_blobs(const std::vector<BlobSource>& blobs) {
  require_writable("writing blobs");
  for (const BlobSource& b : blobs) check_shuffle(b.shuffle_elem);
  const int threads = options_.zstd_workers;
  std::vector<std::string> hashes(blobs.size());
  run_ordered(
      blobs.size(), threads, blobs.size(),
      [&](size_t i, int) { hashes[i] = content_hash(blobs[i].data, blobs[i].size); },
      [](size_t) {});
  // The chunks to compress: those of blobs not stored yet (a read: no write lock), each once.
  struct Chunk {
    size_t blob, idx;
    bool last;
  };
  std::vector<Chunk> chunks;
  std::map<std::string, size_t> fresh;  // hash -> size of a new blob already in `chunks`
  size_t fresh_bytes = 0;
  for (size_t i = 0; i < blobs.size(); ++i) {
    if (blob_exists(hashes[i], blobs[i].size)) continue;
    const auto [it, first] = fresh.emplace(hashes[i], blobs[i].size);
    if (!first) {
      if (it->second != blobs[i].size) throw size_mismatch(hashes[i], it->second, blobs[i].size);
      continue;
    }
    const size_t n = chunk_count(blobs[i].size);
    for (size_t c = 0; c < n; ++c) chunks.push_back({i, c, c + 1 == n});
    fresh_bytes += blobs[i].size;
  }
  // A writer that checkpoints the WAL on its own schedule would otherwise copy a whole
  // checkpoint's blobs into the main file (and fsync the WAL and the file) only once they are
  // all written: a helper connection does it while the blobs are still being compressed and
  // inserted, and the owner's checkpoint_wal finds little left.
  std::optional<WalCheckpointer> overlap;
  const size_t overlap_bytes = options_.overlap_checkpoint_bytes;
  if (options_.wal_autocheckpoint == 0 && overlap_bytes > 0 &&
      sqlite3_get_autocommit(db_.get()) && fresh_bytes >= overlap_bytes) {
    overlap.emplace(path(), options_, overlap_bytes / 2);
  }
  // Each thread compresses with a context of its own and no zstd workers: the frames are the
  // same bytes whichever thread compresses them, so the store does not depend on the count.
  struct ChunkWorker {
    ZstdCompressor zstd;
    Bytes scratch;
  };
  std::vector<ChunkWorker> workers;
  for (int w = 0; w < std::max(1, threads); ++w) {
    workers.push_back({ZstdCompressor(compressor_.level()), {}});
  }
  std::vector<Bytes> frames(chunks.size());  // filled and emptied in a window
  // Inserted frames' buffers are reused, so the frames of a whole checkpoint cost no more
  // allocations (and page faults) than the window's.
  std::mutex spare_mu;
  std::vector<Bytes> spare;
  PreparedBlob b;
  const auto chunk_len = [&](size_t k) {
    return std::min(kChunkBytes, blobs[chunks[k].blob].size - chunks[k].idx * kChunkBytes);
  };
  run_ordered(
      chunks.size(), threads, static_cast<size_t>(std::max(1, threads) + 2) * kChunkBytes,
      [&](size_t k, int w) {
        {
          std::lock_guard<std::mutex> lock(spare_mu);
          if (!spare.empty()) {
            frames[k] = std::move(spare.back());
            spare.pop_back();
          }
        }
        const BlobSource& src = blobs[chunks[k].blob];
        compress_chunk(workers[w].zstd, workers[w].scratch, src.data, src.size, chunks[k].idx,
                       src.shuffle_elem, frames[k]);
      },
      [&](size_t k) {
        b.stored += static_cast<int64_t>(frames[k].size());
        b.frames.push_back(std::move(frames[k]));
        if (!chunks[k].last) return;
        const size_t i = chunks[k].blob;
        b.hash = hashes[i];
        b.size = blobs[i].size;
        b.shuffle = blobs[i].shuffle_elem;
        in_transaction(db_, [&] {
          if (!blob_exists(b.hash, b.size)) insert_blob(b);  // another connection may have
        });
        if (overlap) overlap->committed(static_cast<size_t>(b.stored));
        std::lock_guard<std::mutex> lock(spare_mu);
        for (Bytes& f : b.frames) spare.push_back(std::move(f));
        b = PreparedBlob{};
      },
      chunk_len);
  if (overlap) overlap->finish();
  return hashes;
}

int Store::tensor_shuffle(Dtype dtype) const {
  return options_.byte_shuffle ? static_cast<int>(dtype_size(dtype)) : 1;
}

bool Store::blob_exists(const std::string& hash, size_t size) {
  Statement st(db_, "SELECT raw_size FROM blobs WHERE hash=?");
  st.bind(1, hash);
  if (!st.step()) return false;
  if (st.col_int(0) != static_cast<int64_t>(size)) {
    throw size_mismatch(hash, static_cast<size_t>(st.col_int(0)), size);
  }
  return true;
}

StoreError Store::size_mismatch(const std::string& hash, size_t stored, size_t size) const {
  return data_error("store " + path() + ": blob " + hash + " exists with " +
                    std::to_string(stored) + " bytes but new content has " +
                    std::to_string(size) + " (hash collision or corrupt row)");
}

Store::PreparedBlob Store::prepare_blob(std::string hash, const void* data, size_t size,
                                        int shuffle_elem) {
  PreparedBlob b;
  b.hash = std::move(hash);
  b.size = size;
  b.shuffle = shuffle_elem;
  for (size_t i = 0; i < chunk_count(size); ++i) {
    b.frames.emplace_back();
    compress_chunk(compressor_, scratch_, data, size, i, shuffle_elem, b.frames.back());
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

}  // namespace rwd::store
