#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "checkpoint/layout.h"
#include "common/error.h"
#include "common/log.h"

namespace keel::checkpoint {

namespace fs = std::filesystem;

void throw_io_error(const fs::path& path, std::string_view what, int err) {
  std::string msg = path.string() + ": " + std::string(what) + ": " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT)
    msg +=
        "\nHINT: the disk holding the checkpoints is full; free space or point checkpoint.dir "
        "elsewhere. Earlier checkpoints are untouched.";
  throw CheckpointError(msg);
}

std::string xxh3_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string xxh3_hex_of(std::string_view bytes) {
  return xxh3_hex(XXH3_64bits(bytes.data(), bytes.size()));
}

HashingWriter::HashingWriter(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io_error(path_, "cannot create", errno);
  state_ = XXH3_createState();
  XXH3_64bits_reset(state_);
}

HashingWriter::~HashingWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (state_) XXH3_freeState(state_);
}

void HashingWriter::write(const void* data, size_t n) {
  XXH3_64bits_update(state_, data, n);
  auto* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    ssize_t w = ::write(fd_, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_io_error(path_, "write failed", errno);
    }
    if (w == 0) throw_io_error(path_, "write made no progress", ENOSPC);
    p += w;
    left -= static_cast<size_t>(w);
  }
  size_ += n;
}

FileDigest HashingWriter::finish(bool do_fsync) {
  if (do_fsync && ::fsync(fd_) != 0) throw_io_error(path_, "fsync failed", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_io_error(path_, "close failed", errno);
  return {size_, XXH3_64bits_digest(state_)};
}

FileDigest write_new_file(const fs::path& path, std::string_view content) {
  HashingWriter w(path);
  w.write(content.data(), content.size());
  return w.finish(true);
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error(dir, "cannot open directory for fsync", errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw_io_error(dir, "fsync of directory failed", err);
}

void replace_file_atomic(const fs::path& path, std::string_view content) {
  fs::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // a leftover of ours from a failed attempt
  try {
    write_new_file(tmp, content);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_io_error(path, "rename failed", errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

FileDigest hash_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io_error(path, "cannot open", errno);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(4 << 20);
  uint64_t size = 0;
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      XXH3_freeState(st);
      throw_io_error(path, "read failed", err);
    }
    if (r == 0) break;
    XXH3_64bits_update(st, buf.data(), static_cast<size_t>(r));
    size += static_cast<uint64_t>(r);
  }
  ::close(fd);
  FileDigest d{size, XXH3_64bits_digest(st)};
  XXH3_freeState(st);
  return d;
}

std::string read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_io_error(path, "cannot open", errno);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw_io_error(path, "read failed", err);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

std::string internal::utc_now_iso(std::chrono::system_clock::time_point now) {
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void internal::remove_quietly(const fs::path& p) {
  std::error_code ec;
  remove_tree(p, ec);
  if (ec) log::warn("ckpt", "could not remove {}: {}", p.string(), ec.message());
}

}  // namespace keel::checkpoint
