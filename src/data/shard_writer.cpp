#include "data/shard_writer.h"

#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace keel::data {
namespace {

std::FILE* open_or_throw(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw DataError(path + ": cannot create (" + std::strerror(errno) + ")");
  return f;
}

void write_or_throw(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n && std::fwrite(data, 1, n, f) != n)
    throw DataError(path + ": write failed (" + std::strerror(errno) +
                    "); HINT: is the disk full?");
}

void write_header(std::FILE* f, const FileHeader& h, const std::string& path) {
  if (std::fseek(f, 0, SEEK_SET) != 0) throw DataError(path + ": seek failed");
  write_or_throw(f, &h, sizeof h, path);
}

}  // namespace

SplitWriter::SplitWriter(std::string dir, std::string split, uint32_t token_bytes,
                         int64_t vocab_size, uint32_t boundary_id, int64_t shard_tokens)
    : dir_(std::move(dir)),
      split_(std::move(split)),
      token_bytes_(token_bytes),
      vocab_size_(vocab_size),
      boundary_(boundary_id),
      shard_tokens_(std::max<int64_t>(shard_tokens, 1)),
      shard_hash_(XXH3_createState()),
      index_hash_(XXH3_createState()) {
  std::string path = dir_ + "/" + index_file_name(split_);
  index_ = open_or_throw(path);
  FileHeader zero{};
  write_or_throw(index_, &zero, sizeof zero, path);
  XXH3_64bits_reset(index_hash_);
}

SplitWriter::~SplitWriter() {
  if (shard_) std::fclose(shard_);
  if (index_) std::fclose(index_);
  XXH3_freeState(shard_hash_);
  XXH3_freeState(index_hash_);
}

void SplitWriter::open_shard() {
  std::string path = dir_ + "/" + shard_file_name(split_, shard_count_);
  shard_ = open_or_throw(path);
  FileHeader zero{};
  write_or_throw(shard_, &zero, sizeof zero, path);
  XXH3_64bits_reset(shard_hash_);
  in_shard_ = 0;
}

void SplitWriter::close_shard() {
  if (!shard_) return;
  std::string name = shard_file_name(split_, shard_count_);
  std::string path = dir_ + "/" + name;
  if (!buffer_.empty()) {
    XXH3_64bits_update(shard_hash_, buffer_.data(), buffer_.size());
    write_or_throw(shard_, buffer_.data(), buffer_.size(), path);
    buffer_.clear();
  }
  uint64_t sum = XXH3_64bits_digest(shard_hash_);
  write_header(shard_, make_header(kShardMagic, token_bytes_, in_shard_, sum, vocab_size_), path);
  if (std::fclose(shard_) != 0) throw DataError(path + ": close failed");
  shard_ = nullptr;
  shards_.push_back({{"file", name}, {"tokens", in_shard_}, {"xxh3", hex64(sum)}});
  ++shard_count_;
}

void SplitWriter::put(uint32_t token) {
  if (!shard_) open_shard();
  uint8_t bytes[4] = {static_cast<uint8_t>(token), static_cast<uint8_t>(token >> 8),
                      static_cast<uint8_t>(token >> 16), static_cast<uint8_t>(token >> 24)};
  buffer_.insert(buffer_.end(), bytes, bytes + token_bytes_);
  if (buffer_.size() >= (1u << 20)) {
    XXH3_64bits_update(shard_hash_, buffer_.data(), buffer_.size());
    write_or_throw(shard_, buffer_.data(), buffer_.size(), dir_ + "/" + split_);
    buffer_.clear();
  }
  ++in_shard_;
  ++total_tokens_;
  if (in_shard_ >= shard_tokens_) close_shard();
}

void SplitWriter::add_document(std::span<const uint32_t> tokens, uint64_t doc_id,
                               uint32_t cluster) {
  IndexRecord r{static_cast<uint64_t>(total_tokens_), doc_id,
                static_cast<uint32_t>(std::min<size_t>(tokens.size(), UINT32_MAX)), cluster};
  XXH3_64bits_update(index_hash_, &r, sizeof r);
  write_or_throw(index_, &r, sizeof r, dir_ + "/" + index_file_name(split_));
  for (uint32_t t : tokens) put(t);
  put(boundary_);
  ++documents_;
}

void SplitWriter::add_fill(int64_t n) {
  for (int64_t i = 0; i < n; ++i) put(boundary_);
}

nlohmann::json SplitWriter::finish() {
  if (finished_) throw std::logic_error("SplitWriter::finish called twice");
  finished_ = true;
  close_shard();
  std::string name = index_file_name(split_);
  std::string path = dir_ + "/" + name;
  uint64_t sum = XXH3_64bits_digest(index_hash_);
  write_header(index_,
               make_header(kIndexMagic, sizeof(IndexRecord), documents_, sum, total_tokens_), path);
  if (std::fclose(index_) != 0) throw DataError(path + ": close failed");
  index_ = nullptr;
  return {{"shards", shards_},
          {"index", {{"file", name}, {"records", documents_}, {"xxh3", hex64(sum)}}},
          {"documents", documents_},
          {"tokens", total_tokens_}};
}

}  // namespace keel::data
