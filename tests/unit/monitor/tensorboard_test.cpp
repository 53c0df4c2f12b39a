// The events files are read back by a TFRecord + protobuf decoder of the test's own, which checks
// both CRCs of every record: what TensorBoard itself reads is checked by
// tests/tools/read_tensorboard.py. Reference CRCs: RFC 3720 (iSCSI) B.4 and TensorBoard's
// pure-Python masked_crc32c (tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py).
#include "monitor/tensorboard.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/file_io.h"
#include "common/error.h"
#include "scratch_dir.h"

namespace keel::monitor {
namespace {

namespace fs = std::filesystem;
using keel::testing::ScratchDir;

// --- A minimal protobuf decoder: enough for the messages the writer produces. ---

struct Field {
  uint32_t wire = 0;
  uint64_t number = 0;  // varint, fixed64 or fixed32 payload
  std::string bytes;    // length-delimited payload
};
using Message = std::multimap<uint32_t, Field>;  // field number -> occurrences

uint64_t take_le(std::string_view& in, size_t n) {
  if (in.size() < n) throw std::runtime_error("truncated fixed-width field");
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  in.remove_prefix(n);
  return v;
}

uint64_t take_varint(std::string_view& in) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (in.empty()) throw std::runtime_error("truncated varint");
    const auto byte = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    v |= uint64_t{byte & 0x7Fu} << shift;
    if (!(byte & 0x80)) return v;
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

Message parse(std::string_view in) {
  Message m;
  while (!in.empty()) {
    const uint64_t key = take_varint(in);
    Field f;
    f.wire = key & 7;
    switch (f.wire) {
      case 0:
        f.number = take_varint(in);
        break;
      case 1:
        f.number = take_le(in, 8);
        break;
      case 5:
        f.number = take_le(in, 4);
        break;
      case 2: {
        const uint64_t n = take_varint(in);
        if (n > in.size()) throw std::runtime_error("truncated length-delimited field");
        f.bytes = std::string(in.substr(0, n));
        in.remove_prefix(n);
        break;
      }
      default:
        throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    m.emplace(static_cast<uint32_t>(key >> 3), f);
  }
  return m;
}

// The one occurrence of `number` with wire type `wire`; throws when absent, repeated or mistyped.
const Field& one(const Message& m, uint32_t number, uint32_t wire) {
  if (m.count(number) != 1)
    throw std::runtime_error("field " + std::to_string(number) + " occurs " +
                             std::to_string(m.count(number)) + " times");
  const Field& f = m.find(number)->second;
  if (f.wire != wire) throw std::runtime_error("field " + std::to_string(number) + ": wire type");
  return f;
}

// Every record of a TFRecord file, both CRCs verified; throws on a torn or corrupt record.
std::vector<std::string> read_records(const std::string& path) {
  const std::string all = checkpoint::read_file(path);
  std::string_view in = all;
  std::vector<std::string> records;
  while (!in.empty()) {
    if (in.size() < 12) throw std::runtime_error("truncated record header");
    const std::string_view length_bytes = in.substr(0, 8);
    const uint64_t length = take_le(in, 8);
    if (take_le(in, 4) != mask_crc32c(crc32c(length_bytes.data(), 8)))
      throw std::runtime_error("length crc mismatch");
    if (in.size() < length + 4) throw std::runtime_error("truncated record");
    const std::string_view data = in.substr(0, length);
    in.remove_prefix(length);
    if (take_le(in, 4) != mask_crc32c(crc32c(data.data(), data.size())))
      throw std::runtime_error("data crc mismatch");
    records.emplace_back(data);
  }
  return records;
}

// An Event with a one-value Summary, decoded.
struct SummaryEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string tag;
  Message value;  // the Summary.Value
};

SummaryEvent decode_summary_event(const std::string& record) {
  const Message event = parse(record);
  SummaryEvent e;
  e.wall_time = std::bit_cast<double>(one(event, 1, 1).number);
  e.step = static_cast<int64_t>(one(event, 2, 0).number);
  const Message summary = parse(one(event, 5, 2).bytes);
  e.value = parse(one(summary, 1, 2).bytes);
  e.tag = one(e.value, 1, 2).bytes;
  return e;
}

float simple_value(const SummaryEvent& e) {
  return std::bit_cast<float>(static_cast<uint32_t>(one(e.value, 2, 5).number));
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// The first record of every events file: wall_time and file_version, nothing else.
void expect_file_version_event(const std::string& record) {
  const Message event = parse(record);
  EXPECT_EQ(one(event, 3, 2).bytes, "brain.Event:2");
  EXPECT_NEAR(std::bit_cast<double>(one(event, 1, 1).number), now(), 60.0);
  EXPECT_EQ(event.count(5), 0u);
}

// --- CRC-32C ---

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xFF');
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
}

TEST(Crc32c, ContinuesAcrossPieces) {
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0, 0xE3069283u), 0xE3069283u);
}

TEST(Crc32c, MaskedAsTfRecordStoresIt) {
  EXPECT_EQ(mask_crc32c(0), 0xA282EAD8u);
  EXPECT_EQ(mask_crc32c(crc32c("123456789", 9)), 0xC78AB0E5u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(mask_crc32c(crc32c(zeros.data(), zeros.size())), 0x0FD7FFFAu);
}

// --- The writer ---

TEST(TensorBoardWriter, WritesVersionThenScalarsReadableAfterFlush) {
  const ScratchDir dir("tensorboard_scalars");
  const std::string tb_dir = dir / "run/tensorboard";  // created, parents included
  TensorBoardWriter w(tb_dir);
  ASSERT_EQ(files_in(tb_dir), std::vector<std::string>{w.path()});
  EXPECT_EQ(fs::path(w.path()).filename().string().rfind("events.out.tfevents.", 0), 0u)
      << w.path();
  w.add_scalar("train/loss", 0, 2.5);
  w.add_scalar("train/lr", 1, 3e-4);
  w.add_scalar("train/loss", int64_t{1} << 40, -1.0 / 3.0);
  w.flush();  // readable while the writer is open

  const std::vector<std::string> records = read_records(w.path());
  ASSERT_EQ(records.size(), 4u);
  expect_file_version_event(records[0]);
  struct Expected {
    std::string tag;
    int64_t step;
    float value;
  };
  const std::vector<Expected> expected = {{"train/loss", 0, 2.5f},
                                          {"train/lr", 1, static_cast<float>(3e-4)},
                                          {"train/loss", int64_t{1} << 40, -1.0f / 3.0f}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const SummaryEvent e = decode_summary_event(records[i + 1]);
    EXPECT_EQ(e.tag, expected[i].tag);
    EXPECT_EQ(e.step, expected[i].step);
    EXPECT_EQ(std::bit_cast<uint32_t>(simple_value(e)), std::bit_cast<uint32_t>(expected[i].value))
        << e.tag;
    EXPECT_NEAR(e.wall_time, now(), 60.0);
  }
}

TEST(TensorBoardWriter, TextIsAStringTensorOfTheTextPlugin) {
  const ScratchDir dir("tensorboard_text");
  const std::string text = "model:\n  d_model: 64\n  name: \"tiny\" \xC3\xBC\n";  // UTF-8 ü
  std::string path;
  {
    TensorBoardWriter w(dir.str());
    w.add_text("config", 7, text);
    path = w.path();
  }  // the destructor flushes
  const std::vector<std::string> records = read_records(path);
  ASSERT_EQ(records.size(), 2u);
  const SummaryEvent e = decode_summary_event(records[1]);
  EXPECT_EQ(e.tag, "config");
  EXPECT_EQ(e.step, 7);
  EXPECT_EQ(e.value.count(2), 0u);  // no simple_value
  const Message tensor = parse(one(e.value, 8, 2).bytes);
  EXPECT_EQ(one(tensor, 1, 0).number, 7u);   // DT_STRING
  EXPECT_EQ(one(tensor, 2, 2).bytes, "");    // shape []: one string
  EXPECT_EQ(one(tensor, 8, 2).bytes, text);  // string_val
  const Message metadata = parse(one(e.value, 9, 2).bytes);
  const Message plugin_data = parse(one(metadata, 1, 2).bytes);
  EXPECT_EQ(one(plugin_data, 1, 2).bytes, "text");  // plugin_name
  EXPECT_EQ(one(metadata, 4, 0).number, 2u);        // DATA_CLASS_TENSOR
}

TEST(TensorBoardWriter, DefaultConstructedAndMovedFromWritersDiscard) {
  TensorBoardWriter none;
  none.add_scalar("loss", 1, 1.0);
  none.add_text("config", 0, "x");
  EXPECT_NO_THROW(none.flush());
  EXPECT_TRUE(none.path().empty());

  const ScratchDir dir("tensorboard_moved");
  TensorBoardWriter a(dir.str());
  TensorBoardWriter b = std::move(a);
  a.add_scalar("loss", 1, 1.0);  // NOLINT(bugprone-use-after-move): moved-from discards
  EXPECT_NO_THROW(a.flush());
  b.add_scalar("loss", 2, 2.0);
  b.flush();
  none = std::move(b);
  none.add_scalar("loss", 3, 3.0);
  none.flush();
  const std::vector<std::string> files = files_in(dir.str());
  ASSERT_EQ(files.size(), 1u);
  const std::vector<std::string> records = read_records(files[0]);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(decode_summary_event(records[1]).step, 2);
  EXPECT_EQ(decode_summary_event(records[2]).step, 3);
}

TEST(TensorBoardWriter, TwoWritersInOneDirectoryMakeTwoFiles) {
  const ScratchDir dir("tensorboard_two");
  TensorBoardWriter first(dir.str());
  TensorBoardWriter second(dir.str());  // same second, same process: a file of its own all the same
  EXPECT_NE(first.path(), second.path());
  first.add_scalar("loss", 1, 1.0);
  second.add_scalar("loss", 2, 2.0);
  first.flush();
  second.flush();
  EXPECT_EQ(files_in(dir.str()).size(), 2u);
  for (const auto& [w, step] : {std::pair{&first, 1}, std::pair{&second, 2}}) {
    const std::vector<std::string> records = read_records(w->path());
    ASSERT_EQ(records.size(), 2u) << w->path();
    expect_file_version_event(records[0]);
    EXPECT_EQ(decode_summary_event(records[1]).step, step);
  }
}

TEST(TensorBoardWriter, UncreatableDirectoryIsAUserError) {
  EXPECT_THROW(TensorBoardWriter("/dev/null/tensorboard"), UserError);
}

TEST(TensorBoardWriter, DeletedFileThrowsRecordError) {
  const ScratchDir dir("tensorboard_deleted");
  TensorBoardWriter w(dir.str());
  fs::remove(w.path());  // as a removed run directory would
  w.add_scalar("loss", 1, 1.0);
  EXPECT_THROW(w.flush(), RecordError);
}

// A failed write (here EFBIG from a file-size limit, as ENOSPC from a full disk) names the file and
// leaves it ending at the last flushed record, so that it still reads and later writes continue it.
TEST(TensorBoardWriter, FailedWriteThrowsRecordErrorAndLeavesNoTornRecord) {
  const ScratchDir dir("tensorboard_full");
  TensorBoardWriter w(dir.str());
  w.add_scalar("loss", 1, 1.0);
  w.flush();
  const auto size = static_cast<rlim_t>(fs::file_size(w.path()));

  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct Restore {  // even when an assertion below returns early
    rlimit limit;
    void (*handler)(int);
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &limit);
      std::signal(SIGXFSZ, handler);
    }
  } restore{saved, std::signal(SIGXFSZ, SIG_IGN)};  // EFBIG instead of the signal
  struct rlimit small = saved;
  small.rlim_cur = size + 100;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    w.add_text("big", 2, std::string(1 << 16, 'x'));  // larger than stdio's buffer: written
    w.flush();                                        // part-way, then refused
    FAIL() << "a write past the file-size limit succeeded";
  } catch (const RecordError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(w.path()), std::string::npos) << what;
    EXPECT_NE(what.find("File too large"), std::string::npos) << what;
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);

  EXPECT_EQ(fs::file_size(w.path()), size);
  w.add_scalar("loss", 3, 3.0);
  w.flush();
  const std::vector<std::string> records = read_records(w.path());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(decode_summary_event(records[1]).step, 1);
  EXPECT_EQ(decode_summary_event(records[2]).step, 3);
}

}  // namespace
}  // namespace keel::monitor
