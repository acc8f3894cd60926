// Reading blobs. One by one (threads 0): the frames are read on the store's connection and
// decompressed, unshuffled and hashed on the calling thread. On threads: each thread opens its
// own read-only connection and reads, decompresses and unshuffles whole chunks, so that the
// SQLite reads (walking a 64 MiB frame's overflow pages) run in parallel too; a blob is hashed
// once all its chunks are in.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "store/blob_format.h"
#include "store/byte_shuffle.h"
#include "store/content_hash.h"
#include "store/sqlite_db.h"
#include "store/store.h"
#include "store/store_error.h"

namespace rwd::store {

namespace {

// Runs work(i, worker) for i in [0, n) on `threads` threads (0: the calling thread, worker 0);
// rethrows the first exception once all have stopped.
template <class F>
void parallel_for(size_t n, int threads, F work) {
  if (threads <= 0 || n <= 1) {
    for (size_t i = 0; i < n; ++i) work(i, 0);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  std::vector<std::thread> pool;
  const int count = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
  for (int w = 0; w < count; ++w)
    pool.emplace_back([&, w] {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        try {
          work(i, w);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          next = n;
        }
      }
    });
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

std::vector<uint8_t> Store::get_blob(const std::string& hash) { return std::move(get_blobs({hash}, 0).front()); }

std::vector<std::vector<uint8_t>> Store::get_blobs(const std::vector<std::string>& hashes, int threads) {
  std::vector<std::vector<uint8_t>> out(hashes.size());
  get_blobs_into(hashes, threads, [&](size_t b, size_t bytes) {
    out[b].resize(bytes);
    return out[b].data();
  });
  return out;
}

void Store::get_blobs_into(const std::vector<std::string>& hashes, int threads,
                           const std::function<uint8_t*(size_t, size_t)>& dest) {
  std::vector<BlobInfo> infos;
  for (const std::string& hash : hashes) {
    std::optional<BlobInfo> info = blob_info(hash);
    const std::string what = "store " + path() + ": blob " + hash;
    if (!info) throw data_error(what + " is missing");
    if (info->raw_size < 0 || !valid_shuffle(info->shuffle) ||
        info->n_chunks != int64_t(chunk_count(static_cast<size_t>(info->raw_size))))
      throw data_error(what + ": inconsistent size/chunk count/shuffle in its row");
    infos.push_back(*info);
  }
  // Every destination asked for before any frame is read (the caller may throw on a size).
  std::vector<uint8_t*> out(hashes.size());
  for (size_t b = 0; b < hashes.size(); ++b) out[b] = dest(b, static_cast<size_t>(infos[b].raw_size));
  auto size_of = [&](size_t b) { return static_cast<size_t>(infos[b].raw_size); };
  // A chunk's frame into its place in out[b]: decompressed and unshuffled with the worker's
  // decompressor and scratch. The destination's pages are first touched here, on the threads.
  auto unpack = [&](size_t b, int64_t idx, const void* frame, size_t size, ZstdDecompressor& z, Bytes& scratch) {
    const size_t off = static_cast<size_t>(idx) * kChunkBytes;
    const size_t len = std::min(kChunkBytes, size_of(b) - off);
    const std::string what = "store " + path() + ": blob " + hashes[b] + " chunk " + std::to_string(idx);
    if (infos[b].shuffle == 1) {
      z.decompress(frame, size, out[b] + off, len, what.c_str());
    } else {
      resize_for_overwrite(scratch, len);
      z.decompress(frame, size, scratch.data(), len, what.c_str());
      byte_unshuffle(scratch.data(), len, static_cast<size_t>(infos[b].shuffle), out[b] + off);
    }
  };
  auto check_hash = [&](size_t b) {
    if (content_hash(out[b], size_of(b)) != hashes[b])
      throw data_error("store " + path() + ": blob " + hashes[b] + ": content hash mismatch after decompression");
  };
  if (threads <= 0) {
    for (size_t b = 0; b < hashes.size(); ++b) {
      const std::string what = "store " + path() + ": blob " + hashes[b];
      Statement st(db_, "SELECT idx, frame FROM blob_chunks WHERE hash=? ORDER BY idx");
      st.bind(1, hashes[b]);
      int64_t idx = 0;
      for (; st.step(); ++idx) {
        if (st.col_int(0) != idx || idx >= infos[b].n_chunks)
          throw data_error(what + ": unexpected chunk " + std::to_string(st.col_int(0)));
        unpack(b, idx, st.col_blob(1), st.col_bytes(1), decompressor_, scratch_);
      }
      if (idx != infos[b].n_chunks)
        throw data_error(what + ": has " + std::to_string(idx) + " of " + std::to_string(infos[b].n_chunks) + " chunks");
      check_hash(b);
    }
    return;
  }
  // Every chunk a unit of work, largest blobs first (they bound the wall).
  struct Unit {
    size_t blob;
    int64_t idx;
  };
  std::vector<Unit> units;
  std::vector<size_t> order(hashes.size());
  for (size_t b = 0; b < order.size(); ++b) order[b] = b;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return infos[x].raw_size > infos[y].raw_size; });
  for (size_t b : order)
    for (int64_t i = 0; i < infos[b].n_chunks; ++i) units.push_back({b, i});
  std::vector<std::atomic<int64_t>> left(hashes.size());
  for (size_t b = 0; b < hashes.size(); ++b) left[b] = infos[b].n_chunks;
  const int count = static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), units.size())));
  std::vector<Db> conns;
  for (int w = 0; w < count; ++w) conns.emplace_back(path(), SQLITE_OPEN_READONLY, immutable_);
  std::vector<ZstdDecompressor> zs(static_cast<size_t>(count));
  std::vector<Bytes> scratch(static_cast<size_t>(count));
  std::vector<std::optional<Statement>> stmts(static_cast<size_t>(count));
  parallel_for(units.size(), count, [&](size_t u, int w) {
    const Unit& unit = units[u];
    auto& st = stmts[static_cast<size_t>(w)];
    if (!st) st.emplace(conns[static_cast<size_t>(w)], "SELECT frame FROM blob_chunks WHERE hash=? AND idx=?");
    st->reset();
    st->bind(1, hashes[unit.blob]).bind(2, unit.idx);
    if (!st->step())
      throw data_error("store " + path() + ": blob " + hashes[unit.blob] + ": has no chunk " + std::to_string(unit.idx) +
                       " of " + std::to_string(infos[unit.blob].n_chunks));
    unpack(unit.blob, unit.idx, st->col_blob(0), st->col_bytes(0), zs[static_cast<size_t>(w)],
           scratch[static_cast<size_t>(w)]);
    st->reset();
    if (left[unit.blob].fetch_sub(1) == 1) check_hash(unit.blob);
  });
}


}  // namespace rwd::store
