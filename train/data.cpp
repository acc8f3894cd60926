// Memory-mapped token files, batch sampling and corpus generators.
#include "train/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "common/error.h"
#include "common/switches.h"
#include "common/hash.h"

namespace rwd::train {

namespace {

Error data_error(const std::string& what) { return Error(ExitCode::kData, what); }

void write_all(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw data_error("cannot write '" + path + "': " + std::strerror(errno));
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  if (!out) throw data_error("short write to '" + path + "'");
}

}  // namespace

TokenFile::TokenFile(const std::string& path) : path_(path) {
  // Keep the absolute path: recordings store it, and replay may run from another directory.
  if (char* abs = ::realpath(path.c_str(), nullptr)) {
    path_ = abs;
    std::free(abs);
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw data_error("cannot open token file '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw data_error("token file '" + path + "' is not a regular file");
  }
  if (st.st_size % 2 != 0 || st.st_size < 4) {
    ::close(fd);
    throw data_error("token file '" + path + "' is not a uint16 token file (size " +
                     std::to_string(st.st_size) + " bytes)");
  }
  id_ = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
         static_cast<int64_t>(st.st_mtim.tv_sec), static_cast<int64_t>(st.st_mtim.tv_nsec)};
  mapped_bytes_ = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw data_error("cannot map '" + path + "': " + std::strerror(errno));
  tokens_ = static_cast<const uint16_t*>(p);
  n_ = mapped_bytes_ / 2;
}

TokenFile::~TokenFile() {
  if (tokens_) ::munmap(const_cast<uint16_t*>(tokens_), mapped_bytes_);
}

bool TokenFile::Identity::operator<(const Identity& o) const {
  return std::tie(dev, ino, size, mtime_s, mtime_ns) < std::tie(o.dev, o.ino, o.size, o.mtime_s, o.mtime_ns);
}

namespace {

// What a process has computed of each token file it opened (see TokenFile::Identity).
struct FileFacts {
  std::string fingerprint;  // "" until computed
  int max_token = -1;       // -1 until computed
};

std::mutex g_facts_mu;

// Entries "dev,ino,size,mtime_s,mtime_ns,fingerprint,max_token" joined by ';'.
void parse_facts(const char* text, std::map<TokenFile::Identity, FileFacts>& into) {
  std::stringstream all(text);
  for (std::string entry; std::getline(all, entry, ';');) {
    std::stringstream f(entry);
    std::vector<std::string> v;
    for (std::string field; std::getline(f, field, ',');) v.push_back(field);
    if (v.size() != 7) continue;
    try {
      TokenFile::Identity id{std::stoull(v[0]), std::stoull(v[1]), std::stoull(v[2]),
                             std::stoll(v[3]), std::stoll(v[4])};
      FileFacts facts{v[5], std::stoi(v[6])};
      if (facts.max_token > 65535) continue;
      into[id] = facts;
    } catch (const std::exception&) {
      continue;  // a malformed entry is only a lost shortcut
    }
  }
}

std::map<TokenFile::Identity, FileFacts>& facts() {  // with g_facts_mu held
  static std::map<TokenFile::Identity, FileFacts> m;
  static bool loaded = false;
  if (!loaded) {
    loaded = true;
    parse_facts(switches::text(switches::Switch::kTokenFileFacts).c_str(), m);
  }
  return m;
}

}  // namespace

std::string token_file_facts_env() {
  std::lock_guard<std::mutex> lock(g_facts_mu);
  std::string out;
  for (const auto& [id, f] : facts()) {
    if (f.fingerprint.empty() || f.max_token < 0) continue;
    out += (out.empty() ? "" : ";") + std::to_string(id.dev) + "," + std::to_string(id.ino) + "," +
           std::to_string(id.size) + "," + std::to_string(id.mtime_s) + "," + std::to_string(id.mtime_ns) + "," +
           f.fingerprint + "," + std::to_string(f.max_token);
  }
  return out.empty() ? "" : std::string(switches::name(switches::Switch::kTokenFileFacts)) + "=" + out;
}

namespace {

// facts()[id].*field, computed by `compute` (outside the lock) the first time it is `unset`.
template <class T, class F>
T remembered(const TokenFile::Identity& id, T FileFacts::*field, const T& unset, F compute) {
  {
    std::lock_guard<std::mutex> lock(g_facts_mu);
    const T& known = facts()[id].*field;
    if (known != unset) return known;
  }
  T value = compute();
  std::lock_guard<std::mutex> lock(g_facts_mu);
  return facts()[id].*field = value;
}

}  // namespace

std::string TokenFile::fingerprint() const {
  return remembered(id_, &FileFacts::fingerprint, std::string(),
                    [this] { return std::to_string(n_) + ":" + hex64(fnv1a64(tokens_, n_ * 2)); });
}

uint16_t TokenFile::max_token() const {
  return static_cast<uint16_t>(remembered(id_, &FileFacts::max_token, -1, [this] {
    return static_cast<int>(*std::max_element(tokens_, tokens_ + n_));
  }));
}

Batch batch_from_offsets(const TokenFile& f, const std::vector<int64_t>& offsets, int block) {
  Batch b;
  b.offsets = offsets;
  b.x.resize(offsets.size() * block);
  b.y.resize(offsets.size() * block);
  uint64_t h = kFnvOffset;
  for (size_t r = 0; r < offsets.size(); ++r) {
    if (offsets[r] < 0 || static_cast<size_t>(offsets[r]) + block + 1 > f.size())
      throw data_error("batch offset " + std::to_string(offsets[r]) + " outside token file '" +
                       f.path() + "'");
    const uint16_t* src = f.data() + offsets[r];
    h = fnv1a64(src, (block + 1) * sizeof(uint16_t), h);
    for (int t = 0; t < block; ++t) {
      b.x[r * block + t] = src[t];
      b.y[r * block + t] = src[t + 1];
    }
  }
  b.hash = h;
  return b;
}

Batch sample_batch(const TokenFile& f, uint64_t data_seed, int64_t step, int micro, int batch,
                   int block) {
  if (f.size() < static_cast<size_t>(block) + 2)
    throw data_error("token file '" + f.path() + "' has fewer tokens than block_size + 2");
  const uint64_t range = f.size() - block - 1;
  std::vector<int64_t> offsets(batch);
  for (int r = 0; r < batch; ++r) {
    uint64_t key = splitmix64(data_seed ^ splitmix64(static_cast<uint64_t>(step) * 1000003u +
                                                     static_cast<uint64_t>(micro) * 7919u + r));
    offsets[r] = static_cast<int64_t>(key % range);
  }
  return batch_from_offsets(f, offsets, block);
}

void write_synth_tokens(const std::string& path, size_t n_tokens, int vocab, uint64_t seed) {
  if (vocab < 4 || vocab > 65536) throw UsageError("data synth: vocab must be in 4..65536");
  // Next token: with p=0.6 a fixed successor of the previous token (bigram structure a small
  // model learns in tens of steps), p=0.3 a fixed successor of the previous two tokens (needs
  // attention), p=0.1 uniform noise. Entropy ~1.3 nats vs log(vocab) for a fresh model.
  std::vector<uint16_t> tokens(n_tokens);
  uint64_t state = seed;
  auto next_rand = [&state]() { return splitmix64(state++); };
  uint16_t a = 0, b = 1;
  for (size_t i = 0; i < n_tokens; ++i) {
    const uint64_t r = next_rand() % 10;
    uint64_t key;
    if (r < 6) key = splitmix64(seed * 31 + b);
    else if (r < 9) key = splitmix64(seed * 131 + a * 65537ull + b);
    else key = next_rand();
    const uint16_t c = static_cast<uint16_t>(key % static_cast<uint64_t>(vocab));
    tokens[i] = c;
    a = b;
    b = c;
  }
  write_all(path, tokens);
}

size_t write_text_tokens(const std::string& text_path, const std::string& out_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw data_error("cannot read '" + text_path + "': " + std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<uint16_t> tokens(bytes.begin(), bytes.end());
  for (size_t i = 0; i < bytes.size(); ++i) tokens[i] = static_cast<unsigned char>(bytes[i]);
  write_all(out_path, tokens);
  return tokens.size();
}

}  // namespace rwd::train
