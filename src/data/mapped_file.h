// A file mapped read-only into memory for the life of the object. Opening throws DataError naming
// the file and why (missing, not a regular file, mmap refused), with `hint` as its HINT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::data {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path,
                      const std::string& hint = "is data.path the directory `keel prepare` wrote?");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  // Never null: an empty file maps to an empty string's bytes.
  const uint8_t* data() const { return data_ ? data_ : reinterpret_cast<const uint8_t*>(""); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace keel::data
