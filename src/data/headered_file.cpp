#include "data/headered_file.h"

#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "data/shard_format.h"

namespace keel::data {

HeaderedFileWriter::HeaderedFileWriter(std::string path)
    : path_(std::move(path)), hash_(XXH3_createState()) {
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) {
    XXH3_freeState(static_cast<XXH3_state_t*>(hash_));
    throw DataError(path_ + ": cannot create (" + std::strerror(errno) + ")");
  }
  const FileHeader zero{};
  write(&zero, sizeof zero);
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(hash_));
}

HeaderedFileWriter::~HeaderedFileWriter() {
  if (f_) std::fclose(f_);
  XXH3_freeState(static_cast<XXH3_state_t*>(hash_));
}

void HeaderedFileWriter::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, f_) != n)
    throw DataError(path_ + ": write failed (" + std::strerror(errno) +
                    "); HINT: is the disk full?");
}

void HeaderedFileWriter::put(const void* data, size_t n) {
  write(data, n);
  XXH3_64bits_update(static_cast<XXH3_state_t*>(hash_), data, n);
}

uint64_t HeaderedFileWriter::close(const char (&magic)[8], uint32_t elem_bytes, uint64_t count,
                                   uint64_t aux) {
  const uint64_t digest = XXH3_64bits_digest(static_cast<XXH3_state_t*>(hash_));
  const FileHeader h = make_header(magic, elem_bytes, count, digest, aux);
  if (std::fseek(f_, 0, SEEK_SET) != 0) throw DataError(path_ + ": seek failed");
  write(&h, sizeof h);
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok) throw DataError(path_ + ": close failed; HINT: is the disk full?");
  return digest;
}

}  // namespace keel::data
