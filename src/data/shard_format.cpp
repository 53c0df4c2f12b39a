#include "data/shard_format.h"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

namespace keel::data {

uint64_t xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

FileHeader make_header(const char (&magic)[8], uint32_t elem_bytes, uint64_t count,
                       uint64_t payload_xxh3, uint64_t aux) {
  FileHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, magic, 8);
  h.version = kShardFormatVersion;
  h.elem_bytes = elem_bytes;
  h.count = count;
  h.payload_xxh3 = payload_xxh3;
  h.aux = aux;
  h.header_xxh3 = xxh3(&h, offsetof(FileHeader, header_xxh3));
  return h;
}

std::string hex64(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string shard_file_name(const std::string& split, int64_t shard) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "_%05lld.bin", static_cast<long long>(shard));
  return split + buf;
}

std::string index_file_name(const std::string& split) { return split + ".idx"; }

}  // namespace keel::data
