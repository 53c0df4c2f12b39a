// Low-level file helpers of the checkpoint module: writes that hash (xxh3-64) as they go, fsync of
// files and directories, atomic small-file replacement, streaming file hashes.
// Every failure throws CheckpointError whose message names the file and carries strerror(errno)
// (ENOSPC reads "No space left on device"), so a full disk is reported as such, not as a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "common/paths.h"

struct XXH3_state_s;

namespace keel::checkpoint {

// Size in bytes and xxh3-64 of a file's whole content.
struct FileDigest {
  uint64_t size = 0;
  uint64_t xxh3 = 0;
};

// 16 lowercase hex digits, the form MANIFEST.json stores.
std::string xxh3_hex(uint64_t h);
// xxh3-64 of `bytes` in that form: the same on every build and toolchain (unlike std::hash).
std::string xxh3_hex_of(std::string_view bytes);

// Creates a new file (fails if it exists) and appends to it, hashing every byte written.
// Not thread-safe; owns the descriptor (closed by finish() or the destructor).
class HashingWriter {
 public:
  explicit HashingWriter(const std::filesystem::path& path);
  ~HashingWriter();
  HashingWriter(const HashingWriter&) = delete;
  HashingWriter& operator=(const HashingWriter&) = delete;

  // One write(2) loop per call: callers pass whole tensors, not small pieces.
  void write(const void* data, size_t n);
  // Optionally fsyncs, then closes; close/fsync errors (EIO, ENOSPC on NFS) throw too.
  FileDigest finish(bool do_fsync);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  XXH3_state_s* state_ = nullptr;
  uint64_t size_ = 0;
};

// Writes `content` to a new file at `path` and fsyncs it.
FileDigest write_new_file(const std::filesystem::path& path, std::string_view content);

// Replaces `path` atomically: writes path.tmp-<pid>, fsyncs, renames over `path`, fsyncs the
// directory. A reader sees the old content or the new one, never a mix.
void replace_file_atomic(const std::filesystem::path& path, std::string_view content);

// fsync on a directory, making renames and creations inside it durable.
void fsync_dir(const std::filesystem::path& dir);

// Streams the file through xxh3 (4 MiB reads).
FileDigest hash_file(const std::filesystem::path& path);

using keel::remove_tree;  // common/paths.h

// Whole content of a (small) file.
std::string read_file(const std::filesystem::path& path);

// "PATH: what failed: strerror(err)".
[[noreturn]] void throw_io_error(const std::filesystem::path& path, std::string_view what, int err);

}  // namespace keel::checkpoint
