// safetensors writer/reader: bit-exact round trips, Python's byte layout, a strict reader.
#include "checkpoint/tensor_file.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "common/error.h"
#include "scratch_dir.h"

namespace keel::checkpoint {
namespace {

namespace fs = std::filesystem;
using keel::testing::ScratchDir;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_.emplace(std::string("st_") +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = scratch_->path();
  }
  void TearDown() override { scratch_.reset(); }

  void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  // The CheckpointError message reading `bytes` from a file produces ("" if none is thrown).
  std::string read_error(const std::string& bytes) {
    fs::path p = dir_ / "bad.safetensors";
    fs::remove(p);
    write_bytes(p, bytes);
    try {
      read_safetensors(p);
    } catch (const CheckpointError& e) {
      return e.what();
    }
    return "";
  }

  std::optional<ScratchDir> scratch_;
  fs::path dir_;
};

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

// Random bit patterns (NaN payloads, denormals, -0 included): bit-exactness, not value equality.
torch::Tensor random_bits(torch::ScalarType dtype, std::vector<int64_t> shape, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  if (dtype == torch::kBool)
    return torch::randint(0, 2, shape, gen, torch::kUInt8).to(torch::kBool);
  int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  return torch::randint(0, 256, {nbytes}, gen, torch::kUInt8).view(dtype).reshape(shape);
}

// The hand-built file: what Python's safetensors.torch.save_file writes for
// {"a": tensor([1., 2.]), "b": tensor([7])} with metadata {"format": "pt"}: I64 before F32
// (descending alignment), __metadata__ first, header padded with spaces to 144 bytes.
std::string python_reference_bytes() {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"
      "     ";
  std::string bytes("\x90\0\0\0\0\0\0\0", 8);
  bytes += header;
  bytes += std::string("\x07\0\0\0\0\0\0\0", 8);                // int64 7
  bytes += std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // float 1.0, 2.0
  return bytes;
}

TEST_F(SafetensorsTest, RoundTripEachDtypeIsBitExact) {
  const torch::ScalarType dtypes[] = {
      torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kInt64, torch::kInt32,
      torch::kUInt8,   torch::kBool,     torch::kFloat64, torch::kInt16, torch::kInt8};
  TensorMap in;
  uint64_t seed = 1;
  for (auto dt : dtypes) {
    std::string name = safetensors_dtype(dt);
    in["t." + name] = random_bits(dt, {3, 5, 7}, seed++);
    in["scalar." + name] = random_bits(dt, {}, seed++);
    in["empty." + name] = random_bits(dt, {0, 4}, seed++);
  }
  in["transposed"] = random_bits(torch::kFloat32, {6, 9}, 99).t();  // non-contiguous input
  fs::path p = dir_ / "all.safetensors";
  FileDigest written = write_safetensors(p, in, {{"format", "pt"}, {"note", "ünïcödé"}});
  EXPECT_EQ(written.size, fs::file_size(p));

  FileDigest read_digest;
  SafetensorsContents out = read_safetensors(p, &read_digest);
  EXPECT_EQ(read_digest.size, written.size);
  EXPECT_EQ(read_digest.xxh3, written.xxh3);
  EXPECT_EQ(hash_file(p).xxh3, written.xxh3);
  EXPECT_EQ(out.metadata.at("note"), "ünïcödé");
  ASSERT_EQ(out.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(t, out.tensors.at(name))) << name;
  }
  // The in-memory encoder produces the very same bytes.
  std::ifstream f(p, std::ios::binary);
  std::string on_disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(encode_safetensors(in, {{"format", "pt"}, {"note", "ünïcödé"}}), on_disk);
}

// Written tensor by tensor from declared names, dtypes and shapes, a file has the bytes
// write_safetensors gives it; each tensor is asked for once, in the file's order; any range of a
// tensor reads back alone; a tensor produced with another shape than declared is refused.
TEST_F(SafetensorsTest, StreamedWriterWritesTheSameBytesAndPartsReadBackAlone) {
  TensorMap in = {{"w", random_bits(torch::kFloat32, {4, 6}, 1)},
                  {"b", random_bits(torch::kBFloat16, {5}, 2)},
                  {"i", random_bits(torch::kInt64, {3}, 3)},
                  {"e", random_bits(torch::kFloat32, {0}, 4)}};
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : in) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  std::vector<std::string> asked;
  const fs::path p = dir_ / "streamed.safetensors";
  const FileDigest d = write_safetensors_streamed(p, specs,
                                                  [&](const std::string& name) {
                                                    asked.push_back(name);
                                                    return in.at(name);
                                                  },
                                                  {{"format", "pt"}});
  std::ifstream f(p, std::ios::binary);
  std::string on_disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(on_disk, encode_safetensors(in, {{"format", "pt"}}));
  EXPECT_EQ(d.xxh3, hash_file(p).xxh3);
  EXPECT_EQ(asked, (std::vector<std::string>{"i", "e", "w", "b"}));  // by width, then name

  const SafetensorsHeader h = read_safetensors_header(p);
  for (const auto& e : h.tensors) {
    if (e.name != "w") continue;
    EXPECT_TRUE(torch::equal(read_safetensors_elements(p, h, e, 7, 10),
                             in.at("w").reshape({-1}).narrow(0, 7, 10)));
    EXPECT_THROW(read_safetensors_elements(p, h, e, 20, 5), CheckpointError);
  }
  specs[0].shape = {2};
  EXPECT_THROW(write_safetensors_streamed(dir_ / "bad.safetensors", specs,
                                          [&](const std::string& name) { return in.at(name); }),
               std::logic_error);
}

TEST_F(SafetensorsTest, WriterMatchesPythonByteLayout) {
  TensorMap in = {{"a", torch::tensor({1.0f, 2.0f})}, {"b", torch::tensor({int64_t{7}})}};
  EXPECT_EQ(encode_safetensors(in, {{"format", "pt"}}), python_reference_bytes());
  // Every tensor starts at a multiple of its element size (header padded to 8, sorted by width).
  std::string bytes = encode_safetensors(
      {{"x", torch::zeros({3}, torch::kUInt8)}, {"y", torch::zeros({2}, torch::kFloat64)}}, {});
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(SafetensorsTest, ReadsHandBuiltPythonFile) {
  fs::path p = dir_ / "py.safetensors";
  write_bytes(p, python_reference_bytes());
  SafetensorsContents c = read_safetensors(p);
  EXPECT_EQ(c.metadata.at("format"), "pt");
  EXPECT_TRUE(torch::equal(c.tensors.at("a"), torch::tensor({1.0f, 2.0f})));
  EXPECT_EQ(c.tensors.at("b").scalar_type(), torch::kInt64);
  EXPECT_EQ(c.tensors.at("b").item<int64_t>(), 7);
  auto h = read_safetensors_header(p);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "b");  // offset order
  EXPECT_EQ(h.data_start, 152u);
}

TEST_F(SafetensorsTest, StrictReaderRejectsMalformedFiles) {
  const std::string good = python_reference_bytes();
  auto with_header = [](std::string header, std::string data) {
    header.append((8 - header.size() % 8) % 8, ' ');
    uint64_t n = header.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
  };
  const std::string sixteen(16, '\0');
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;  // a substring of the message
  };
  const Case cases[] = {
      {"empty file", "", "too short"},
      {"truncated data", good.substr(0, good.size() - 1), "run past the end"},
      {"truncated header", good.substr(0, 100), "impossible"},
      {"huge header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + good.substr(8),
       "impossible"},
      {"header not JSON", with_header("{not json", sixteen), "not a valid JSON"},
      {"header not an object", with_header("[1,2]", sixteen), "does not start with '{'"},
      {"overlapping offsets",
       with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   std::string(12, '\0')),
       "overlaps"},
      {"gap", with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", sixteen),
       "belong to no tensor"},
      {"trailing bytes",
       with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", sixteen),
       "trailing bytes"},
      {"shape disagrees with offsets",
       with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", sixteen),
       "needs 12 bytes"},
      {"unknown dtype",
       with_header(R"({"a":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]}})", sixteen),
       "unsupported dtype"},
      {"negative offset",
       with_header(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[-1,16]}})", sixteen),
       "non-negative"},
      {"reversed offsets",
       with_header(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[16,0]}})", sixteen),
       "reversed"},
      {"metadata not strings", with_header(R"({"__metadata__":{"k":1}})", ""), "must be a string"},
      {"overflowing shape",
       with_header(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,16]}})",
                   sixteen),
       "overflows"},
  };
  for (const auto& c : cases) {
    std::string msg = read_error(c.bytes);
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
    // The in-memory parser applies the same rules.
    EXPECT_THROW(parse_safetensors("mem", c.bytes.data(), c.bytes.size()), CheckpointError)
        << c.what;
  }
}

TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  TensorMap in = {{"w", random_bits(torch::kFloat32, {4, 4}, 5)},
                  {"b", random_bits(torch::kBFloat16, {4}, 6)}};
  const std::string good = encode_safetensors(in, {{"format", "pt"}});
  std::mt19937_64 rng(42);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    int flips = 1 + static_cast<int>(rng() % 3);
    // Mostly the length and header, where a flip changes structure rather than values.
    for (int f = 0; f < flips; ++f)
      bad[rng() % std::min<size_t>(bad.size(), 160)] ^= 1 << (rng() % 8);
    if (rng() % 4 == 0) bad.resize(rng() % bad.size());
    try {
      parse_safetensors("fuzz", bad.data(), bad.size());
    } catch (const CheckpointError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST_F(SafetensorsTest, WriterRefusesExistingFileAndUnsupportedDtype) {
  fs::path p = dir_ / "x.safetensors";
  write_safetensors(p, {{"a", torch::ones({2})}});
  EXPECT_THROW(write_safetensors(p, {{"a", torch::ones({2})}}), CheckpointError);
  EXPECT_THROW(
      write_safetensors(dir_ / "c.safetensors", {{"c", torch::ones({2}, torch::kComplexFloat)}}),
      CheckpointError);
}

}  // namespace
}  // namespace keel::checkpoint
