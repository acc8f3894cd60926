// torch.save zip files read with LibTorch's zip reader (caffe2::serialize::PyTorchStreamReader)
// and a Python-pickle reader of our own: LibTorch's Unpickler turns every
// collections.OrderedDict into None (it expects one only as a tensor's backward hooks), and a
// model's state_dict() is an OrderedDict. Covers the opcodes of pickle protocols 2-5.
#include <caffe2/serialize/inline_container.h>
#include <torch/types.h>

#include <cstring>
#include <fstream>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <algorithm>
#include <optional>
#include <vector>

#include "interop/pickle_io.h"

namespace rwd::interop {

namespace {

c10::ScalarType storage_dtype(const std::string& cls) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"torch.FloatStorage", c10::kFloat},   {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},     {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},     {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},   {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},     {"torch.BoolStorage", c10::kBool}};
  auto it = types.find(cls);
  if (it == types.end()) throw InteropError("checkpoint: unsupported tensor storage " + cls);
  return it->second;
}

class Reader {
 public:
  Reader(const std::string& bytes, const RecordReader& records) : p_(bytes), records_(records) {}

  c10::IValue run() {
    for (;;) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                                   // PROTO
        case 0x95: n(8); break;                                   // FRAME
        case '.': return pop().v;                                 // STOP
        case '(': marks_.push_back(stack_.size()); break;         // MARK
        case 'N': push(c10::IValue()); break;
        case 0x88: push(true); break;
        case 0x89: push(false); break;
        case 'K': push(static_cast<int64_t>(u8())); break;        // BININT1
        case 'M': push(static_cast<int64_t>(le(2))); break;       // BININT2
        case 'J': push(static_cast<int64_t>(static_cast<int32_t>(le(4)))); break;
        case 0x8a: push(long1(u8())); break;                      // LONG1
        case 'G': push(binfloat()); break;
        case 'X': push(text(le(4))); break;                       // BINUNICODE
        case 0x8c: case 'U': case 'C': push(text(u8())); break;   // short strings / bytes
        case 0x8d: case 0x8e: push(text(le(8))); break;           // BINUNICODE8, BINBYTES8
        case 'T': case 'B': push(text(le(4))); break;
        case '}': push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())); break;
        case ']': push(c10::impl::GenericList(c10::AnyType::get())); break;
        case ')': push(c10::ivalue::Tuple::create(std::vector<c10::IValue>{})); break;
        case 't': push(tuple(pop_mark())); break;
        case 0x85: case 0x86: case 0x87: {                        // TUPLE1..3
          std::vector<Item> items(op - 0x84);
          for (size_t i = items.size(); i-- > 0;) items[i] = pop();
          push(tuple(items));
          break;
        }
        case 'l': push(list_of(pop_mark())); break;
        case 'd': push(dict_of(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()), pop_mark())); break;
        case 'a': append({pop()}); break;
        case 'e': append(pop_mark()); break;
        case 's': { Item v = pop(), k = pop(); set_items({k, v}); break; }
        case 'u': set_items(pop_mark()); break;
        case 'q': memo_[u8()] = top(); break;                     // BINPUT
        case 'r': memo_[le(4)] = top(); break;                    // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;            // MEMOIZE
        case 'h': push(memo(u8())); break;                        // BINGET
        case 'j': push(memo(le(4))); break;                       // LONG_BINGET
        case 'c': { std::string m = line(); push_global(m + "." + line()); break; }
        case 0x93: { Item name = pop(), mod = pop(); push_global(mod.v.toStringRef() + "." + name.v.toStringRef()); break; }
        case 'R': case 0x81: { Item args = pop(), fn = pop(); push(call(fn, args)); break; }
        case 'b': pop(); break;  // BUILD: the state of an OrderedDict (_metadata) or a Parameter
        case 'Q': push(storage(pop())); break;                    // BINPERSID
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case '2': push(top()); break;
        default:
          throw InteropError("checkpoint: unsupported pickle opcode 0x" + hex(op) + " at byte " + std::to_string(pos_ - 1));
      }
    }
  }

 private:
  struct Item {
    c10::IValue v;
    std::string global;  // a class or function named by GLOBAL, not yet called
  };

  static std::string hex(uint8_t b) {
    const char* d = "0123456789abcdef";
    return {d[b >> 4], d[b & 15]};
  }
  const char* n(size_t k) {
    if (k > p_.size() - pos_) throw InteropError("checkpoint: the pickle ends early");
    const char* at = p_.data() + pos_;
    pos_ += k;
    return at;
  }
  uint8_t u8() { return static_cast<uint8_t>(*n(1)); }
  uint64_t le(size_t k) {
    const auto* b = reinterpret_cast<const uint8_t*>(n(k));
    uint64_t v = 0;
    for (size_t i = 0; i < k; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    return v;
  }
  int64_t long1(size_t k) {
    if (k > 8) throw InteropError("checkpoint: an integer wider than 64 bits");
    uint64_t v = le(k);
    if (k > 0 && k < 8 && (v >> (8 * k - 1)) & 1) v |= ~uint64_t{0} << (8 * k);  // sign-extend
    return static_cast<int64_t>(v);
  }
  double binfloat() {
    const auto* b = reinterpret_cast<const uint8_t*>(n(8));
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | b[i];  // big-endian
    double d;
    std::memcpy(&d, &bits, 8);
    return d;
  }
  std::string text(uint64_t k) { return std::string(n(k), k); }
  std::string line() {
    const size_t end = p_.find('\n', pos_);
    if (end == std::string::npos) throw InteropError("checkpoint: the pickle ends early");
    std::string s = p_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  void push(c10::IValue v) { stack_.push_back({std::move(v), ""}); }
  void push(Item it) { stack_.push_back(std::move(it)); }
  void push_global(const std::string& name) { stack_.push_back({c10::IValue(), name}); }
  Item pop() {
    if (stack_.empty()) throw InteropError("checkpoint: malformed pickle (stack underflow)");
    Item it = std::move(stack_.back());
    stack_.pop_back();
    return it;
  }
  Item& top() {
    if (stack_.empty()) throw InteropError("checkpoint: malformed pickle (stack underflow)");
    return stack_.back();
  }
  std::vector<Item> pop_mark() {
    if (marks_.empty()) throw InteropError("checkpoint: malformed pickle (no mark)");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) throw InteropError("checkpoint: malformed pickle (a mark below the stack)");
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + m), std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }
  Item memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) throw InteropError("checkpoint: malformed pickle (memo " + std::to_string(k) + ")");
    return it->second;
  }
  // An item as a container element: a bare global (a storage class) becomes its name.
  static c10::IValue value(const Item& i) { return i.global.empty() ? i.v : c10::IValue(i.global); }
  // Containers: a list or dict is filled while it is on the stack, then stored in its parent,
  // after which it is sealed (a pickle that changes it then is refused). So no container can
  // hold itself, and the nesting depth (which LibTorch's destructors and to_json recurse over)
  // is known exactly and bounded.
  static constexpr int kMaxDepth = 64;
  static const void* container(const c10::IValue& v) {
    return v.isList() || v.isGenericDict() || v.isTuple() ? v.internalToPointer() : nullptr;
  }
  // `child` goes into `parent` (a new container or one being filled).
  void contain(const c10::IValue& parent, const c10::IValue& child) {
    const void* c = container(child);
    if (!c) return;
    const void* p = container(parent);
    if (c == p) throw InteropError("checkpoint: malformed pickle (a container inside itself)");
    sealed_.insert(c);
    int& d = depth_[p];
    d = std::max(d, depth_[c] + 1);
    if (d > kMaxDepth)
      throw InteropError("checkpoint: containers nested deeper than " + std::to_string(kMaxDepth));
  }
  void fill(const c10::IValue& target) {
    if (sealed_.count(container(target)))
      throw InteropError("checkpoint: malformed pickle (a container changed after it was stored)");
  }
  c10::IValue tuple(const std::vector<Item>& items) {
    std::vector<c10::IValue> v;
    for (const Item& i : items) v.push_back(value(i));
    c10::IValue t = c10::ivalue::Tuple::create(std::move(v));
    for (const c10::IValue& e : t.toTupleRef().elements()) contain(t, e);
    return t;
  }
  c10::IValue list_of(const std::vector<Item>& items) {
    c10::impl::GenericList l(c10::AnyType::get());
    const c10::IValue lv(l);
    for (const Item& i : items) {
      contain(lv, value(i));
      l.push_back(value(i));
    }
    return lv;
  }
  void append(const std::vector<Item>& items) {
    Item& target = top();
    if (!target.v.isList()) throw InteropError("checkpoint: malformed pickle (APPEND to a non-list)");
    fill(target.v);
    c10::impl::GenericList l = target.v.toList();
    for (const Item& i : items) {
      contain(target.v, value(i));
      l.push_back(value(i));
    }
  }
  c10::IValue dict_of(c10::impl::GenericDict d, const std::vector<Item>& kv) {
    const c10::IValue dv(d);
    for (size_t i = 0; i + 1 < kv.size(); i += 2) {
      // LibTorch's dict hashes only these (and throws from a noexcept path for others).
      const c10::IValue key = value(kv[i]);
      if (!key.isString() && !key.isInt() && !key.isDouble() && !key.isBool())
        throw InteropError(std::string("checkpoint: a dict key of kind ") + key.tagKind() +
                           " (torch.save checkpoints key by strings and integers)");
      contain(dv, value(kv[i]));
      contain(dv, value(kv[i + 1]));
      d.insert_or_assign(value(kv[i]), value(kv[i + 1]));
    }
    return dv;
  }
  void set_items(const std::vector<Item>& kv) {
    if (!top().v.isGenericDict()) throw InteropError("checkpoint: malformed pickle (SETITEMS on a non-dict)");
    fill(top().v);
    dict_of(top().v.toGenericDict(), kv);
  }

  // What REDUCE / NEWOBJ make of the globals torch.save uses; any other object becomes a
  // string naming it, which the checkpoint reader refuses where it needs a value.
  c10::IValue call(const Item& fn, const Item& args_item) {
    const std::string& f = fn.global;
    std::vector<c10::IValue> args;
    if (args_item.v.isTuple())
      for (const c10::IValue& a : args_item.v.toTupleRef().elements()) args.push_back(a);
    if (f == "collections.OrderedDict") return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
    if ((f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") && args.size() >= 4) {
      const torch::Tensor flat = args[0].toTensor();
      auto ints = [](const c10::IValue& t) {
        std::vector<int64_t> v;
        for (const c10::IValue& e : t.toTupleRef().elements()) v.push_back(e.toInt());
        return v;
      };
      return flat.as_strided(ints(args[2]), ints(args[3]), args[1].toInt());
    }
    if ((f == "torch._utils._rebuild_parameter" || f == "torch._utils._rebuild_parameter_with_state") && !args.empty())
      return args[0];
    if (f == "torch.device" && !args.empty()) return args[0];
    return std::string("<unreadable pickled object ") + (f.empty() ? "?" : f) + ">";
  }

  // ('storage', storage class, key, location, numel) -> a flat CPU tensor of the record,
  // one per key (tensors sharing a storage share it here too).
  c10::IValue storage(const Item& pid) {
    if (!pid.v.isTuple() || pid.v.toTupleRef().elements().size() < 5)
      throw InteropError("checkpoint: unsupported persistent id (not a tensor storage)");
    const auto& e = pid.v.toTupleRef().elements();
    const std::string key = e[2].toStringRef();
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    const c10::ScalarType dtype = storage_dtype(e[1].toStringRef());
    const int64_t numel = e[4].toInt();
    std::optional<std::pair<at::DataPtr, size_t>> rec = records_("data/" + key);
    if (!rec) throw InteropError("checkpoint: tensor data 'data/" + key + "' is missing from the zip file");
    const size_t item = c10::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > rec->second / item)
      throw InteropError("checkpoint: tensor data 'data/" + key + "' is shorter than its storage");
    torch::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
    if (numel > 0) std::memcpy(t.data_ptr(), rec->first.get(), static_cast<size_t>(numel) * item);
    storages_[key] = t;
    return t;
  }

  const std::string& p_;
  const RecordReader& records_;
  size_t pos_ = 0;
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Item> memo_;
  std::unordered_map<std::string, torch::Tensor> storages_;
  std::unordered_map<const void*, int> depth_;  // nesting depth of each container made so far
  std::unordered_set<const void*> sealed_;      // containers stored in another one
};

}  // namespace

c10::IValue read_pickle(const std::string& pickle, const RecordReader& records) {
  try {
    return Reader(pickle, records).run();
  } catch (const c10::Error& e) {
    throw InteropError(std::string("checkpoint: not a readable torch.save pickle: ") + e.what_without_backtrace());
  }
}

c10::IValue load_torch_file(const std::string& path) {
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw InteropError("cannot read '" + path + "'");
  char magic[2] = {0, 0};
  probe.read(magic, 2);
  if (magic[0] != 'P' || magic[1] != 'K')
    throw InteropError("'" + path + "' is not a zip-format torch.save file (saved by torch < 1.6 "
                       "or not a checkpoint; re-save it with a newer torch)");
  try {
    caffe2::serialize::PyTorchStreamReader zip(path);
    if (!zip.hasRecord("data.pkl")) throw InteropError("'" + path + "' has no data.pkl (not a torch.save file)");
    auto [data, size] = zip.getRecord("data.pkl");
    const std::string bytes(static_cast<const char*>(data.get()), size);
    return read_pickle(bytes, [&](const std::string& name) -> std::optional<std::pair<at::DataPtr, size_t>> {
      if (!zip.hasRecord(name)) return std::nullopt;
      auto [record, n] = zip.getRecord(name);
      return std::make_pair(std::move(record), n);
    });
  } catch (const c10::Error& e) {
    throw InteropError("'" + path + "': not a readable torch.save file: " + e.what_without_backtrace());
  }
}

}  // namespace rwd::interop
