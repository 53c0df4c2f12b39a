// Tensors to and from files in the safetensors format (https://github.com/huggingface/safetensors):
//   [u64 little-endian N][N bytes of JSON header, space-padded to a multiple of 8][raw bytes]
//   header: {"__metadata__": {..}, NAME: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// Offsets are relative to the start of the raw bytes, which tensors cover without gap or overlap.
// The writer lays files out exactly as Python's safetensors.torch.save_file does (tensors sorted by
// dtype alignment then name, __metadata__ first), so Hugging Face tools load keel's files as-is.
// The reader is strict: anything malformed throws CheckpointError naming the file and the defect.
// Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Bytes are little-endian (x86/ARM).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/file_io.h"

namespace keel::checkpoint {

using TensorMap = std::map<std::string, torch::Tensor>;
using StringMap = std::map<std::string, std::string>;

// "F32" etc.; throws CheckpointError for a dtype safetensors/keel does not support.
std::string safetensors_dtype(torch::ScalarType t);
std::optional<torch::ScalarType> dtype_from_safetensors(std::string_view name);

// Writes a new file (fails if `path` exists). Tensors may live on any device and have any strides:
// each is copied to contiguous CPU memory if needed, one at a time, and written with one write.
// Returns the file's size and xxh3, computed while writing (no second read).
FileDigest write_safetensors(const std::filesystem::path& path, const TensorMap& tensors,
                             const StringMap& metadata = {}, bool do_fsync = true);

// A tensor of a file written tensor by tensor.
struct TensorSpec {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};

// The file write_safetensors writes, for tensors that need not all be in memory at once: the
// header comes from `specs`, then `produce(name)` is called for each tensor in the file's order,
// and each is written (and freed) before the next is asked for. Memory: one tensor.
FileDigest write_safetensors_streamed(
    const std::filesystem::path& path, const std::vector<TensorSpec>& specs,
    const std::function<torch::Tensor(const std::string& name)>& produce,
    const StringMap& metadata = {}, bool do_fsync = true);

// The bytes write_safetensors would produce, in memory (tests, small files).
std::string encode_safetensors(const TensorMap& tensors, const StringMap& metadata = {});

struct TensorEntry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// The parsed header: entries sorted by offset, metadata, where the data section starts.
struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;
  StringMap metadata;
  uint64_t data_start = 0;  // 8 + header length
};

struct SafetensorsContents {
  TensorMap tensors;  // CPU, contiguous, owning their memory
  StringMap metadata;
};

// Reads only the header (inspect: names, shapes, parameter counts without loading the data).
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

// Elements [first, first + count) of `entry` (row-major) of the file `path` whose header is
// `header`, read with pread into a new 1-D CPU tensor of the entry's dtype: a part of a tensor
// without the rest, or the file, in memory.
torch::Tensor read_safetensors_elements(const std::filesystem::path& path,
                                        const SafetensorsHeader& header, const TensorEntry& entry,
                                        int64_t first, int64_t count);

// Reads the whole file with pread straight into freshly allocated tensors. When `digest` is given
// it receives the size and xxh3 of the file, computed in the same pass (checksum check for free).
SafetensorsContents read_safetensors(const std::filesystem::path& path,
                                     FileDigest* digest = nullptr);

// Parses bytes already in memory; `name` is used in error messages.
SafetensorsContents parse_safetensors(std::string_view name, const void* data, size_t size);

}  // namespace keel::checkpoint
