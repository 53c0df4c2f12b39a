// libFuzzer target over the reader's entry points for the three files of a dataset: token shards,
// the document index and meta.json (src/data/shard_reader.h). The first input byte picks the file
// kind; expectations come from the input's own header, so a well-formed header reaches the
// checksum, size and token-range checks. Contract: every input is accepted or refused with
// keel::DataError — anything else (a crash, a sanitizer report, another exception) is a bug.
//
// Built only with clang (-DKEEL_FUZZ=ON, tests/fuzz/CMakeLists.txt); the same entry points run
// under the g++ build in tests/unit/data/shard_reader_test.cpp
// (ReplayOfCorruptedInputsNeverCrashes).
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/error.h"
#include "data/shard_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace keel::data;
  if (size < 1) return 0;
  const int kind = data[0] % 3;
  ++data;
  --size;
  FileHeader h{};
  if (size >= sizeof h) std::memcpy(&h, data, sizeof h);
  try {
    if (kind == 0) {
      ShardEntry expect{"shard", static_cast<int64_t>(h.count & 0xffffffffffull), h.payload_xxh3};
      uint32_t token_bytes = h.elem_bytes == 4 ? 4 : 2;
      check_shard_bytes(data, size, "shard", expect, token_bytes,
                        static_cast<int64_t>(h.aux & 0xffffffffull));
    } else if (kind == 1) {
      SplitMeta expect;
      expect.records = static_cast<int64_t>(h.count & 0xffffffffffull);
      expect.tokens = static_cast<int64_t>(h.aux & 0xffffffffffffull);
      expect.index_xxh3 = h.payload_xxh3;
      check_index_bytes(data, size, "index", expect);
    } else {
      parse_meta(std::string_view(reinterpret_cast<const char*>(data), size), "meta.json");
    }
  } catch (const keel::DataError&) {
  }
  return 0;
}
