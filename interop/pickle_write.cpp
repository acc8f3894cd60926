// torch.save-compatible zip files written with LibTorch's zip writer
// (caffe2::serialize::PyTorchStreamWriter) and a pickle writer of our own: torch::pickle_save
// wraps every dict and list in torch.jit._pickle.restore_type_tag, which torch.load's
// weights_only mode (the default since torch 2.6, used by nanoGPT's train.py) refuses. This
// writes plain protocol-2 dicts, lists and tuples and torch._utils._rebuild_tensor_v2 tensors.
#include <caffe2/serialize/inline_container.h>
#include <torch/types.h>

#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "interop/pickle_io.h"

namespace rwd::interop {

namespace {

const char* storage_class(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "FloatStorage";
    case c10::kDouble: return "DoubleStorage";
    case c10::kHalf: return "HalfStorage";
    case c10::kBFloat16: return "BFloat16Storage";
    case c10::kLong: return "LongStorage";
    case c10::kInt: return "IntStorage";
    case c10::kBool: return "BoolStorage";
    case c10::kByte: return "ByteStorage";
    default: throw InteropError(std::string("cannot save a tensor of dtype ") + c10::toString(t));
  }
}

class Writer {
 public:
  std::string out;
  std::vector<torch::Tensor> storages;  // record "data/<index>"

  void value(const c10::IValue& v) {
    if (v.isNone()) return op('N');
    if (v.isBool()) return op(v.toBool() ? '\x88' : '\x89');
    if (v.isInt()) return integer(v.toInt());
    if (v.isDouble()) {
      uint64_t bits;
      const double d = v.toDouble();
      std::memcpy(&bits, &d, 8);
      op('G');
      for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
      return;
    }
    if (v.isString()) return str(v.toStringRef());
    if (v.isTensor()) return tensor(v.toTensor());
    if (v.isTuple()) return tuple(v.toTupleRef().elements());
    if (v.isList()) {
      op(']');
      if (v.toListRef().empty()) return;
      op('(');
      for (const c10::IValue& e : v.toListRef()) value(e);
      return op('e');
    }
    if (v.isGenericDict()) {
      op('}');
      if (v.toGenericDict().size() == 0) return;
      op('(');
      for (const auto& e : v.toGenericDict()) {
        value(e.key());
        value(e.value());
      }
      return op('u');
    }
    throw InteropError(std::string("cannot save a value of type ") + v.tagKind());
  }

 private:
  void op(char c) { out.push_back(c); }
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void integer(int64_t i) {
    if (i >= 0 && i < 256) { op('K'); le(static_cast<uint64_t>(i), 1); }
    else if (i >= 0 && i < 65536) { op('M'); le(static_cast<uint64_t>(i), 2); }
    else if (i >= INT32_MIN && i <= INT32_MAX) { op('J'); le(static_cast<uint32_t>(i), 4); }
    else { op('\x8a'); le(8, 1); le(static_cast<uint64_t>(i), 8); }
  }
  void str(const std::string& s) {
    op('X');
    le(s.size(), 4);
    out += s;
  }
  void global(const char* module, const char* name) {
    op('c');
    out += std::string(module) + "\n" + name + "\n";
  }
  template <typename Seq>
  void tuple(const Seq& items) {
    if (items.size() == 0) return op(')');
    op('(');
    for (const auto& e : items) value(e);
    op('t');
  }
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, OrderedDict()) with the
  // storage as persistent id ('storage', torch.<T>Storage, key, 'cpu', numel); tensors that
  // share a storage (the tied wte / lm_head) share one record, as torch.save writes them.
  void tensor(const torch::Tensor& t) {
    const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    size_t key = storages.size();
    for (size_t i = 0; i < storages.size(); ++i)
      if (storages[i].data_ptr() == c.data_ptr() && storages[i].sizes() == c.sizes()) key = i;
    if (key == storages.size()) storages.push_back(c);
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    op('(');
    str("storage");
    global("torch", storage_class(c.scalar_type()));
    str(std::to_string(key));
    str("cpu");
    integer(c.numel());
    op('t');
    op('Q');
    integer(0);
    tuple(std::vector<c10::IValue>(c.sizes().begin(), c.sizes().end()));
    tuple(std::vector<c10::IValue>(c.strides().begin(), c.strides().end()));
    op('\x89');
    global("collections", "OrderedDict");
    op(')');
    op('R');
    op('t');
    op('R');
  }
};

}  // namespace

void save_torch_file(const std::string& path, const c10::IValue& value) {
  Writer w;
  w.out = "\x80\x02";
  w.value(value);
  w.out.push_back('.');
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw InteropError("cannot write '" + path + "'");
  try {
    // Through a writer function the archive's folder is "archive", as torch.save names it,
    // whatever the file is called (so the bytes do not depend on the path).
    caffe2::serialize::PyTorchStreamWriter zip([&file](const void* buf, size_t n) -> size_t {
      file.write(static_cast<const char*>(buf), static_cast<std::streamsize>(n));
      return file ? n : 0;
    });
    zip.writeRecord("data.pkl", w.out.data(), w.out.size());
    zip.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < w.storages.size(); ++i) {
      const torch::Tensor& s = w.storages[i];
      zip.writeRecord("data/" + std::to_string(i), s.data_ptr(), s.numel() * s.element_size());
    }
    zip.writeEndOfFile();
  } catch (const c10::Error& e) {
    throw InteropError("cannot write '" + path + "': " + e.what_without_backtrace());
  }
  file.close();
  if (!file) throw InteropError("cannot write '" + path + "'");
}

}  // namespace rwd::interop
