#include "checkpoint/tensor_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/error.h"

namespace keel::checkpoint {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; keel writes memory as-is");

namespace {

// Same limit as the Rust reader: a larger header is a corrupt length field, not a real file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeInfo {
  torch::ScalarType type;
  const char* name;
  // Position in safetensors' Rust `Dtype` enum; files list tensors by descending rank so that
  // every tensor starts aligned to its element size (the header is padded to 8 bytes).
  int rank;
};

constexpr DtypeInfo kDtypes[] = {
    {torch::kBool, "BOOL", 0},  {torch::kUInt8, "U8", 1},    {torch::kInt8, "I8", 2},
    {torch::kInt16, "I16", 3},  {torch::kFloat16, "F16", 5}, {torch::kBFloat16, "BF16", 6},
    {torch::kInt32, "I32", 7},  {torch::kFloat32, "F32", 9}, {torch::kFloat64, "F64", 10},
    {torch::kInt64, "I64", 11},
};

const DtypeInfo* find_dtype(torch::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return &d;
  return nullptr;
}

[[noreturn]] void fail(std::string_view file, const std::string& what) {
  throw CheckpointError(std::string(file) + ": " + what);
}

// A tensor ready to write: contiguous CPU memory.
struct Prepared {
  std::string name;
  const DtypeInfo* dtype;
  torch::Tensor cpu;  // undefined for a tensor declared now and produced later
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// write_safetensors' order: descending dtype rank (alignment), then name.
void sort_for_file(std::vector<Prepared>& ts) {
  std::stable_sort(ts.begin(), ts.end(), [](const Prepared& a, const Prepared& b) {
    if (a.dtype->rank != b.dtype->rank) return a.dtype->rank > b.dtype->rank;
    return a.name < b.name;
  });
}

std::vector<Prepared> prepare(const TensorMap& tensors) {
  std::vector<Prepared> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw CheckpointError("tensor '" + name + "' is undefined; cannot save it");
    if (t.layout() != torch::kStrided)
      throw CheckpointError("tensor '" + name + "' is not dense; safetensors holds dense tensors");
    const DtypeInfo* d = find_dtype(t.scalar_type());
    if (!d)
      throw CheckpointError("tensor '" + name + "' has dtype " +
                            std::string(c10::toString(t.scalar_type())) +
                            ", which keel's safetensors writer does not support");
    torch::Tensor c = t.detach();
    if (!c.device().is_cpu()) c = c.to(torch::kCPU);
    c = c.contiguous();
    out.push_back(
        {name, d, c, c.sizes().vec(), static_cast<uint64_t>(c.numel()) * c.element_size()});
  }
  sort_for_file(out);
  return out;
}

// Header bytes (already padded) for prepared tensors; ordered_json keeps Python's key order:
// __metadata__ first, tensors in data order, fields dtype/shape/data_offsets.
std::string header_for(const std::vector<Prepared>& ts, const StringMap& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const auto& p : ts) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = p.dtype->name;
    e["shape"] = p.shape;
    e["data_offsets"] = {offset, offset + p.nbytes};
    offset += p.nbytes;
    h[p.name] = std::move(e);
  }
  std::string s = h.dump();
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

std::string length_prefix(uint64_t n) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);  // little-endian host (static_assert above)
  return out;
}

uint64_t read_u64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t json_u64(std::string_view file, const std::string& tensor, const char* field,
                  const nlohmann::json& v) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    fail(file,
         "tensor '" + tensor + "': " + field + " must hold non-negative integers, got " + v.dump());
  return v.get<uint64_t>();
}

// One tensor's header entry: its dtype, shape and data offsets, checked against each other and
// the data's size.
TensorEntry parse_entry(std::string_view file, const std::string& name, const nlohmann::json& v,
                        uint64_t data_size) {
  if (!v.is_object()) fail(file, "tensor '" + name + "': entry must be an object");
  if (!v.contains("dtype") || !v["dtype"].is_string())
    fail(file, "tensor '" + name + "': missing dtype");
  if (!v.contains("shape") || !v["shape"].is_array())
    fail(file, "tensor '" + name + "': missing shape");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    fail(file, "tensor '" + name + "': data_offsets must be [begin, end]");
  TensorEntry e;
  e.name = name;
  std::string dt = v["dtype"].get<std::string>();
  auto t = dtype_from_safetensors(dt);
  if (!t) fail(file, "tensor '" + name + "': unsupported dtype '" + dt + "'");
  e.dtype = *t;
  uint64_t numel = 1;
  for (const auto& d : v["shape"]) {
    uint64_t dim = json_u64(file, name, "shape", d);
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel))
      fail(file, "tensor '" + name + "': shape " + v["shape"].dump() + " overflows");
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  e.begin = json_u64(file, name, "data_offsets", v["data_offsets"][0]);
  e.end = json_u64(file, name, "data_offsets", v["data_offsets"][1]);
  std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.end < e.begin) fail(file, "tensor '" + name + "': data_offsets " + range + " are reversed");
  if (e.end > data_size)
    fail(file, "tensor '" + name + "': data_offsets " + range + " run past the end of the data (" +
                   std::to_string(data_size) + " bytes; file truncated?)");
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(e.dtype)), &nbytes) ||
      nbytes != e.end - e.begin)
    fail(file, "tensor '" + name + "': shape " + v["shape"].dump() + " of " + dt + " needs " +
                   std::to_string(numel * c10::elementSize(e.dtype)) + " bytes but data_offsets " +
                   range + " hold " + std::to_string(e.end - e.begin));
  return e;
}

// The data must be covered exactly by `tensors` (sorted by offset): no overlap (two names sharing
// bytes would alias on load), no gap or trailing bytes (a sign of corruption or a foreign file).
void check_coverage(std::string_view file, const std::vector<TensorEntry>& tensors,
                    uint64_t data_size) {
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& e : tensors) {
    if (e.begin < pos)
      fail(file, "tensor '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "] overlaps tensor '" + prev->name + "' [" +
                     std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    if (e.begin > pos)
      fail(file, "bytes [" + std::to_string(pos) + ", " + std::to_string(e.begin) +
                     ") of the data belong to no tensor (gap before '" + e.name + "')");
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size)
    fail(file, std::to_string(data_size - pos) + " trailing bytes belong to no tensor");
}

// Everything the reader checks lives here, shared by the file and in-memory paths.
SafetensorsHeader parse_header(std::string_view file, std::string_view text, uint64_t data_size) {
  SafetensorsHeader h;
  h.data_start = 8 + text.size();
  if (text.empty() || text.front() != '{')
    fail(file, "safetensors header does not start with '{' (not a safetensors file, or corrupt)");
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail(file, "safetensors header is not a valid JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name != "__metadata__") {
      h.tensors.push_back(parse_entry(file, name, v, data_size));
      continue;
    }
    if (!v.is_object()) fail(file, "__metadata__ must be an object of strings");
    for (auto m = v.begin(); m != v.end(); ++m) {
      if (!m.value().is_string())
        fail(file, "__metadata__['" + m.key() + "'] must be a string, got " + m.value().dump());
      h.metadata[m.key()] = m.value().get<std::string>();
    }
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  check_coverage(file, h.tensors, data_size);
  return h;
}

// Reads exactly n bytes at offset or throws.
void pread_full(int fd, const fs::path& path, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_io_error(path, "read failed", errno);
    }
    if (r == 0) fail(path.string(), "unexpected end of file (truncated while reading?)");
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

class Fd {
 public:
  explicit Fd(const fs::path& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw_io_error(path, "cannot open", errno);
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct RawHeader {
  std::string prefix_and_text;  // the 8 length bytes + the header text, as in the file
  SafetensorsHeader header;
};

RawHeader read_raw_header(int fd, const fs::path& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw_io_error(path, "stat failed", errno);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    fail(path.string(),
         "file is " + std::to_string(size) + " bytes, too short for a safetensors header length");
  RawHeader r;
  r.prefix_and_text.resize(8);
  pread_full(fd, path, r.prefix_and_text.data(), 8, 0);
  uint64_t n = read_u64(r.prefix_and_text.data());
  if (n > kMaxHeaderBytes || n > size - 8)
    fail(path.string(), "header length " + std::to_string(n) + " is impossible for a file of " +
                            std::to_string(size) + " bytes (truncated or not safetensors)");
  r.prefix_and_text.resize(8 + n);
  pread_full(fd, path, r.prefix_and_text.data() + 8, n, 8);
  r.header =
      parse_header(path.string(), std::string_view(r.prefix_and_text).substr(8), size - 8 - n);
  return r;
}

}  // namespace

std::string safetensors_dtype(torch::ScalarType t) {
  const DtypeInfo* d = find_dtype(t);
  if (!d)
    throw CheckpointError("dtype " + std::string(c10::toString(t)) +
                          " is not supported in keel's safetensors files");
  return d->name;
}

std::optional<torch::ScalarType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  return std::nullopt;
}

FileDigest write_safetensors(const fs::path& path, const TensorMap& tensors,
                             const StringMap& metadata, bool do_fsync) {
  auto prepared = prepare(tensors);
  std::string header = header_for(prepared, metadata);
  std::string prefix = length_prefix(header.size());
  HashingWriter w(path);
  w.write(prefix.data(), prefix.size());
  w.write(header.data(), header.size());
  for (auto& p : prepared) {
    if (p.nbytes > 0) w.write(p.cpu.data_ptr(), p.nbytes);
    p.cpu = torch::Tensor();  // a GPU tensor's CPU copy is freed as soon as it is on disk
  }
  return w.finish(do_fsync);
}

FileDigest write_safetensors_streamed(
    const fs::path& path, const std::vector<TensorSpec>& specs,
    const std::function<torch::Tensor(const std::string&)>& produce, const StringMap& metadata,
    bool do_fsync) {
  std::vector<Prepared> declared;
  for (const auto& spec : specs) {
    const DtypeInfo* d = find_dtype(spec.dtype);
    if (!d) safetensors_dtype(spec.dtype);  // throws, naming the dtype
    declared.push_back(
        {spec.name, d, torch::Tensor(), spec.shape,
         static_cast<uint64_t>(c10::multiply_integers(spec.shape)) * c10::elementSize(spec.dtype)});
  }
  sort_for_file(declared);
  std::string header = header_for(declared, metadata);
  std::string prefix = length_prefix(header.size());
  HashingWriter w(path);
  w.write(prefix.data(), prefix.size());
  w.write(header.data(), header.size());
  for (const auto& p : declared) {
    torch::Tensor t = produce(p.name).detach();
    if (t.scalar_type() != p.dtype->type || t.sizes() != c10::IntArrayRef(p.shape))
      throw std::logic_error("write_safetensors_streamed: " + p.name +
                             " was produced with another dtype or shape than declared");
    t = t.to(torch::kCPU).contiguous();
    if (p.nbytes > 0) w.write(t.data_ptr(), p.nbytes);
  }
  return w.finish(do_fsync);
}

std::string encode_safetensors(const TensorMap& tensors, const StringMap& metadata) {
  auto prepared = prepare(tensors);
  std::string header = header_for(prepared, metadata);
  std::string out = length_prefix(header.size()) + header;
  for (const auto& p : prepared) out.append(static_cast<const char*>(p.cpu.data_ptr()), p.nbytes);
  return out;
}

SafetensorsHeader read_safetensors_header(const fs::path& path) {
  Fd fd(path);
  return read_raw_header(fd.get(), path).header;
}

torch::Tensor read_safetensors_elements(const fs::path& path, const SafetensorsHeader& header,
                                        const TensorEntry& entry, int64_t first, int64_t count) {
  const int64_t size = static_cast<int64_t>(c10::elementSize(entry.dtype));
  const int64_t numel = static_cast<int64_t>(entry.end - entry.begin) / size;
  if (first < 0 || count < 0 || first + count > numel)
    fail(path.string(), "elements [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") asked of '" + entry.name +
                            "', which has " + std::to_string(numel));
  torch::Tensor t = torch::empty({count}, torch::TensorOptions().dtype(entry.dtype));
  Fd fd(path);
  if (count > 0)
    pread_full(fd.get(), path, t.data_ptr(), static_cast<uint64_t>(count * size),
               header.data_start + entry.begin + static_cast<uint64_t>(first * size));
  return t;
}

SafetensorsContents read_safetensors(const fs::path& path, FileDigest* digest) {
  Fd fd(path);
  RawHeader raw = read_raw_header(fd.get(), path);
  XXH3_state_t* st = nullptr;
  if (digest) {
    st = XXH3_createState();
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, raw.prefix_and_text.data(), raw.prefix_and_text.size());
  }
  SafetensorsContents out;
  out.metadata = raw.header.metadata;
  uint64_t size = raw.header.data_start;
  try {
    // Offset order, which the header check proved contiguous: hashing tensor by tensor in this
    // order hashes the file byte for byte.
    for (const auto& e : raw.header.tensors) {
      torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
      uint64_t n = e.end - e.begin;
      if (n > 0) pread_full(fd.get(), path, t.data_ptr(), n, raw.header.data_start + e.begin);
      if (st) XXH3_64bits_update(st, t.data_ptr(), n);
      size += n;
      out.tensors.emplace(e.name, std::move(t));
    }
  } catch (...) {
    if (st) XXH3_freeState(st);
    throw;
  }
  if (digest) {
    *digest = {size, XXH3_64bits_digest(st)};
    XXH3_freeState(st);
  }
  return out;
}

SafetensorsContents parse_safetensors(std::string_view name, const void* data, size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  if (size < 8)
    fail(name,
         "file is " + std::to_string(size) + " bytes, too short for a safetensors header length");
  uint64_t n = read_u64(bytes);
  if (n > kMaxHeaderBytes || n > size - 8)
    fail(name, "header length " + std::to_string(n) + " is impossible for a file of " +
                   std::to_string(size) + " bytes (truncated or not safetensors)");
  SafetensorsHeader h = parse_header(name, std::string_view(bytes + 8, n), size - 8 - n);
  SafetensorsContents out;
  out.metadata = h.metadata;
  for (const auto& e : h.tensors) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes + h.data_start + e.begin, e.end - e.begin);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

}  // namespace keel::checkpoint
