#include "monitor/tensorboard.h"

#include <stdio_ext.h>  // __fpurge
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/error.h"
#include "common/host_name.h"

namespace keel::monitor {
namespace {

// Byte-at-a-time with one 256-entry table (about 0.5 GB/s): a logged step is tens of records of
// tens of bytes, so slicing-by-8 or the SSE4.2 crc32 instruction would buy nothing measurable.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0u);
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Field numbers of the messages keel writes, as tensorboard/compat/proto/{event,summary,tensor,
// tensor_shape,types}.proto define them (TensorBoard 2.21).
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
constexpr uint32_t kEventSessionLog = 7;   // SessionLog
constexpr uint32_t kSessionLogStatus = 1;  // enum SessionStatus
constexpr uint64_t kSessionStart = 1;
constexpr uint32_t kSummaryValue = 1;      // repeated Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float
constexpr uint32_t kValueTensor = 8;       // TensorProto
constexpr uint32_t kValueMetadata = 9;     // SummaryMetadata
constexpr uint32_t kMetadataPluginData = 1;
constexpr uint32_t kMetadataDataClass = 4;  // enum DataClass
constexpr uint32_t kPluginDataPluginName = 1;
constexpr uint32_t kTensorDtype = 1;  // enum DataType
constexpr uint32_t kTensorShape = 2;  // TensorShapeProto
constexpr uint32_t kTensorStringVal = 8;
constexpr uint64_t kDtString = 7;
// Said explicitly rather than left for the reader to infer from the plugin name: TensorBoard's
// own text summaries do, and its Rust data server files a value by its data class.
constexpr uint64_t kDataClassTensor = 2;

// Protobuf's wire format: each field is the varint key (number << 3 | wire type), then a varint,
// 8 or 4 little-endian bytes, or a varint length and that many bytes (strings, nested messages).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7F) | 0x80);
  out += static_cast<char>(v);
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, field << 3 | type);
}

// A negative int64 is its two's complement, 10 bytes, as protobuf encodes int64.
void put_varint_field(std::string& out, uint32_t field, uint64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, v);
}

void put_double(std::string& out, uint32_t field, double v) {
  put_key(out, field, kFixed64);
  put_le(out, std::bit_cast<uint64_t>(v), 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  put_key(out, field, kFixed32);
  put_le(out, std::bit_cast<uint32_t>(v), 4);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event holding a Summary of one Summary.Value (serialized in `value`).
std::string summary_event(int64_t step, const std::string& value) {
  std::string summary;
  put_bytes(summary, kSummaryValue, value);
  std::string event;
  put_double(event, kEventWallTime, unix_time_now());
  put_varint_field(event, kEventStep, static_cast<uint64_t>(step));
  put_bytes(event, kEventSummary, summary);
  return event;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError("cannot create " + dir + ": " + ec.message());
  // TensorBoard reads a directory's files in name order: the zero-padded time keeps a resumed
  // run's file after the earlier ones. The counter separates writers of one process and second.
  char time_part[32];
  std::snprintf(time_part, sizeof time_part, "%010lld", static_cast<long long>(std::time(nullptr)));
  const std::string stem = dir + "/events.out.tfevents." + time_part + "." +
                           host_name("localhost") + "." + std::to_string(::getpid()) + ".";
  for (int n = 0; !file_; ++n) {
    path_ = stem + std::to_string(n);
    file_ = std::fopen(path_.c_str(), "wbx");  // x: O_EXCL, an existing file is never reused
    const int err = errno;
    if (!file_ && (err != EEXIST || n == 999))
      throw UserError("cannot create " + path_ + ": " + std::strerror(err));
  }
  std::string event;
  put_double(event, kEventWallTime, unix_time_now());
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  try {
    write_record(event);
    flush();  // a file that exists at all is a valid one
  } catch (...) {
    std::fclose(file_);
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)),
      path_(std::move(other.path_)),
      flushed_(other.flushed_) {}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
    path_ = std::move(other.path_);
    flushed_ = other.flushed_;
  }
  return *this;
}

void TensorBoardWriter::add_scalar(const std::string& tag, int64_t step, double value) {
  if (!file_) return;
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_float(v, kValueSimpleValue, static_cast<float>(value));
  write_record(summary_event(step, v));
}

void TensorBoardWriter::add_text(const std::string& tag, int64_t step, const std::string& text) {
  if (!file_) return;
  std::string tensor;  // a string scalar: shape [] (an empty TensorShapeProto), one string_val
  put_varint_field(tensor, kTensorDtype, kDtString);
  put_bytes(tensor, kTensorShape, "");
  put_bytes(tensor, kTensorStringVal, text);
  std::string plugin_data;
  put_bytes(plugin_data, kPluginDataPluginName, "text");
  std::string metadata;
  put_bytes(metadata, kMetadataPluginData, plugin_data);
  put_varint_field(metadata, kMetadataDataClass, kDataClassTensor);
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_bytes(v, kValueTensor, tensor);
  put_bytes(v, kValueMetadata, metadata);
  write_record(summary_event(step, v));
}

void TensorBoardWriter::restart_at(int64_t step) {
  if (!file_) return;
  std::string session_log;
  put_varint_field(session_log, kSessionLogStatus, kSessionStart);
  std::string event;
  put_double(event, kEventWallTime, unix_time_now());
  put_varint_field(event, kEventStep, static_cast<uint64_t>(step));
  put_bytes(event, kEventSessionLog, session_log);
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& event) {
  if (!file_) return;
  std::string record;
  record.reserve(event.size() + 16);
  put_le(record, event.size(), 8);
  put_le(record, mask_crc32c(crc32c(record.data(), 8)), 4);
  record += event;
  put_le(record, mask_crc32c(crc32c(event.data(), event.size())), 4);
  errno = 0;
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) fail(errno);
}

void TensorBoardWriter::flush() {
  if (!file_) return;
  errno = 0;
  if (std::fflush(file_) != 0) fail(errno);
  flushed_ = ::ftello(file_);
  // An open file outlives its directory: without this a deleted run directory would swallow the
  // events silently.
  struct stat st {};
  if (::fstat(::fileno(file_), &st) == 0 && st.st_nlink == 0)
    throw RecordError("cannot write " + path_ + ": the file was deleted (run directory removed?)");
}

void TensorBoardWriter::fail(int err) {
  // No torn record: drop what is still buffered (fclose would write it later) and cut the file
  // back to its last flushed record (best effort), where a later write would continue.
  __fpurge(file_);
  (void)!::ftruncate(::fileno(file_), flushed_);
  (void)::fseeko(file_, flushed_, SEEK_SET);
  std::clearerr(file_);
  throw RecordError("cannot write " + path_ + ": " +
                    (err != 0 ? std::strerror(err) : "short write"));
}

}  // namespace keel::monitor
