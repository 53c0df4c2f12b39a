// A keel data file written streaming: a FileHeader (shard_format.h) placeholder, the payload as it
// comes (hashed with xxh3 on the way), then the real header written over the placeholder at
// close(). Readers check it with check_file_header (file_header_check.h). Used for provenance and
// for the parts of a split prepare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace keel::data {

class HeaderedFileWriter {
 public:
  // Creates (truncates) `path`; DataError naming it when that fails.
  explicit HeaderedFileWriter(std::string path);
  ~HeaderedFileWriter();
  HeaderedFileWriter(const HeaderedFileWriter&) = delete;
  HeaderedFileWriter& operator=(const HeaderedFileWriter&) = delete;

  void put(const void* data, size_t n);
  // Writes the header ({magic, elem_bytes, count, the payload's xxh3, aux}) and closes; returns
  // the payload's xxh3.
  uint64_t close(const char (&magic)[8], uint32_t elem_bytes, uint64_t count, uint64_t aux = 0);
  const std::string& path() const { return path_; }

 private:
  void write(const void* data, size_t n);
  std::string path_;
  std::FILE* f_ = nullptr;
  void* hash_ = nullptr;  // XXH3_state_t, kept out of this header
};

}  // namespace keel::data
