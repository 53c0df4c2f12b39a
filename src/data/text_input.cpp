#include "data/text_input.h"

#include <glob.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "data/parquet_input.h"

namespace keel::data {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_compression(const std::string& path) {
  for (const char* ext : {".gz", ".zst", ".zstd"})
    if (ends_with(path, ext)) return path.substr(0, path.size() - std::strlen(ext));
  return path;
}

// Whether the file starts with zstd's frame magic (28 B5 2F FD): the bytes decide, not the name
// (a .gz name over zstd bytes was read as plain text).
bool starts_as_zstd(const std::string& path) {
  unsigned char head[4] = {0, 0, 0, 0};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;  // the open below says why
  const size_t got = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  return got == 4 && head[0] == 0x28 && head[1] == 0xB5 && head[2] == 0x2F && head[3] == 0xFD;
}

}  // namespace

// A byte stream over a plain, gzip or zstd file, told apart by their first bytes.
class DocumentReader::Stream {
 public:
  explicit Stream(const std::string& path) : path_(path) {
    if (starts_as_zstd(path)) {
      file_ = std::fopen(path.c_str(), "rb");
      if (!file_) throw DataError(path + ": cannot open (" + std::strerror(errno) + ")");
      zstd_ = ZSTD_createDStream();
      ZSTD_initDStream(zstd_);
      in_buf_.resize(ZSTD_DStreamInSize());
    } else {
      // gzopen reads uncompressed files transparently too.
      gz_ = gzopen(path.c_str(), "rb");  // gzip by its magic, plain text otherwise
      if (!gz_) throw DataError(path + ": cannot open (" + std::strerror(errno) + ")");
      gzbuffer(gz_, 1 << 17);
    }
  }
  ~Stream() {
    if (gz_) gzclose(gz_);
    if (zstd_) ZSTD_freeDStream(zstd_);
    if (file_) std::fclose(file_);
  }
  // Up to `n` bytes; 0 at the end.
  size_t read(char* out, size_t n) {
    if (gz_) {
      int got = gzread(gz_, out, static_cast<unsigned>(n));
      int err = Z_OK;
      const char* what = got <= 0 ? gzerror(gz_, &err) : nullptr;
      if (got < 0)  // a bad CRC or length is Z_DATA_ERROR here
        throw DataError(path_ + ": corrupt gzip input (" + what + ")");
      // zlib ends a stream cut short like a whole one, but for Z_BUF_ERROR on record.
      if (got == 0 && err == Z_BUF_ERROR)
        throw DataError(path_ +
                        ": truncated gzip input: the file ends inside a compressed stream\nHINT: "
                        "a download or copy cut short? fetch it again (`gzip -t FILE` checks one)");
      return static_cast<size_t>(got);
    }
    ZSTD_outBuffer ob{out, n, 0};
    while (ob.pos == 0) {
      if (in_.pos == in_.size) {
        size_t got = std::fread(in_buf_.data(), 1, in_buf_.size(), file_);
        if (got == 0) {
          if (!frame_done_) throw DataError(path_ + ": truncated zstd input");
          return 0;
        }
        in_ = {in_buf_.data(), got, 0};
      }
      size_t r = ZSTD_decompressStream(zstd_, &ob, &in_);
      if (ZSTD_isError(r))
        throw DataError(path_ + ": corrupt zstd input (" + ZSTD_getErrorName(r) + ")");
      frame_done_ = r == 0;
    }
    return ob.pos;
  }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
  ZSTD_DStream* zstd_ = nullptr;
  std::FILE* file_ = nullptr;
  std::vector<char> in_buf_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  bool frame_done_ = true;
};

namespace {

// Every matched file was skipped as binary: how many, the first, and when they are parquet read
// under a forced --format, that.
[[noreturn]] void refuse_all_binary(const std::vector<std::string>& binary,
                                    const std::string& format) {
  const bool parquet = std::any_of(binary.begin(), binary.end(), [](const std::string& p) {
    return ends_with(p, ".parquet") || is_parquet_file(p);
  });
  throw DataError(
      "--input: every matched file was skipped as binary (" + std::to_string(binary.size()) +
      " file(s), the first " + (binary.empty() ? std::string("?") : binary.front()) +
      ": a NUL byte in its first 4 KiB)" +
      (parquet ? "; HINT: they are parquet files and --format " + format +
                     " reads text: drop --format (auto) or give --format parquet"
       : format != "auto" ? "; HINT: --format " + format +
                                " reads text; binary files are skipped whatever the format"
                          : std::string("; HINT: give text, JSONL or parquet files")));
}

}  // namespace

std::vector<InputFile> expand_inputs(const std::vector<std::string>& specs,
                                     const InputOptions& options,
                                     std::vector<std::string>* skipped) {
  if (options.format != "auto" && options.format != "text" && options.format != "jsonl" &&
      options.format != "parquet")
    throw DataError("--format " + options.format + ": expected auto, text, jsonl or parquet");
  std::vector<std::string> paths;
  for (const auto& spec : specs) {
    std::vector<std::string> matched;
    std::error_code ec;
    if (fs::is_directory(spec, ec)) {
      for (auto it = fs::recursive_directory_iterator(
               spec, fs::directory_options::follow_directory_symlink, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (ec) break;
        if (fs::is_regular_file(it->path(), ec)) matched.push_back(it->path().string());
      }
    } else if (fs::is_regular_file(spec, ec)) {
      matched.push_back(spec);
    } else {
      glob_t g;
      if (::glob(spec.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i)
          if (fs::is_regular_file(g.gl_pathv[i], ec)) matched.push_back(g.gl_pathv[i]);
      }
      globfree(&g);
    }
    if (matched.empty())
      throw DataError("--input " + spec +
                      ": matches no readable file; HINT: check the path or "
                      "quote the glob");
    std::sort(matched.begin(), matched.end());
    paths.insert(paths.end(), matched.begin(), matched.end());
  }
  std::vector<InputFile> files;
  std::vector<std::string> binary;  // skipped: a NUL byte in their first 4 KiB
  std::set<std::string> seen;
  for (const auto& p : paths) {
    std::error_code ec;
    auto canonical = fs::canonical(p, ec).string();
    if (ec || !seen.insert(canonical).second) continue;  // the same file named twice
    std::string base = strip_compression(p);
    bool compressed = base != p;
    if (options.format == "parquet" || (options.format == "auto" && !compressed &&
                                        (ends_with(base, ".parquet") || is_parquet_file(p)))) {
      files.push_back({p, false, true});
      continue;
    }
    if (!compressed) {
      // A NUL byte in the first 4 KiB marks a binary file (e.g. fortune's .dat indexes).
      std::FILE* f = std::fopen(p.c_str(), "rb");
      if (!f) throw DataError(p + ": cannot open (" + std::strerror(errno) + ")");
      char buf[4096];
      size_t n = std::fread(buf, 1, sizeof buf, f);
      std::fclose(f);
      if (std::memchr(buf, 0, n)) {
        if (skipped) skipped->push_back(p);
        binary.push_back(p);
        continue;
      }
    }
    bool jsonl =
        options.format == "jsonl" ||
        (options.format == "auto" && (ends_with(base, ".jsonl") || ends_with(base, ".ndjson")));
    files.push_back({p, jsonl});
  }
  if (files.empty()) refuse_all_binary(binary, options.format);
  return files;
}

DocumentReader::DocumentReader(std::vector<InputFile> files, InputOptions options, bool defer_json)
    : files_(std::move(files)), options_(std::move(options)), defer_json_(defer_json) {}

bool parse_json_record(Document& doc, const InputOptions& options, const std::string& path,
                       std::string* why) {
  doc.json_record = false;
  auto j = nlohmann::json::parse(doc.text, nullptr, /*allow_exceptions=*/false);
  auto it = j.is_object() ? j.find(options.text_field) : j.end();
  if (!j.is_object() || it == j.end() || !it->is_string()) {
    if (why)
      *why = path + ":" + std::to_string(doc.line) + ": not a JSON object with a string '" +
             options.text_field + "'";
    return false;
  }
  doc.text = std::move(it->get_ref<std::string&>());
  doc.id.clear();
  if (auto id = j.find(options.id_field); id != j.end())
    doc.id = id->is_string()   ? id->get<std::string>()
             : id->is_number() ? id->dump()
                               : std::string();
  return true;
}

DocumentReader::~DocumentReader() = default;

int64_t DocumentReader::bytes_read() const {
  return bytes_ + (parquet_ ? parquet_->bytes_read() : 0);
}

bool DocumentReader::open_next_file() {
  stream_.reset();
  parquet_.reset();
  if (++current_ >= static_cast<int64_t>(files_.size())) return false;
  const InputFile& f = files_[current_];
  if (f.parquet) {
    parquet_ = std::make_unique<ParquetRows>(f.path, options_.text_field, options_.id_field);
    return true;
  }
  stream_ = std::make_unique<Stream>(f.path);
  buffer_.clear();
  buffer_pos_ = 0;
  line_no_ = 0;
  eof_ = false;
  return true;
}

bool DocumentReader::read_line(std::string& line) {
  line.clear();
  line_cut_ = false;
  const auto keep = [&](size_t from, size_t n) {  // what fits under the cap, the rest skipped
    const size_t room = kMaxDocumentBytes + 1 - std::min(line.size(), kMaxDocumentBytes + 1);
    if (n > room) line_cut_ = true;
    line.append(buffer_, from, std::min(n, room));
  };
  while (true) {
    size_t nl = buffer_.find('\n', buffer_pos_);
    if (nl != std::string::npos) {
      keep(buffer_pos_, nl + 1 - buffer_pos_);
      buffer_pos_ = nl + 1;
      ++line_no_;
      return true;
    }
    keep(buffer_pos_, buffer_.size() - buffer_pos_);
    buffer_.clear();
    buffer_pos_ = 0;
    if (eof_) {
      if (!line.empty()) ++line_no_;
      return !line.empty();
    }
    buffer_.resize(1 << 16);
    size_t n = stream_->read(buffer_.data(), buffer_.size());
    buffer_.resize(n);
    bytes_ += static_cast<int64_t>(n);
    if (n == 0) eof_ = true;
  }
}

namespace {

// Appends `line` to the document, or drops its text once it passes kMaxDocumentBytes.
void add_line(Document& doc, const std::string& line, bool line_cut) {
  if (doc.oversized) return;
  if (line_cut || doc.text.size() + line.size() > kMaxDocumentBytes) {
    doc.oversized = true;
    std::string().swap(doc.text);
    return;
  }
  doc.text += line;
}

}  // namespace

bool DocumentReader::next(Document& doc) {
  std::string line;
  while (true) {
    if (!stream_ && !parquet_ && !open_next_file()) return false;
    const InputFile& f = files_[current_];
    doc.file = current_;
    doc.text.clear();
    doc.id.clear();
    doc.json_record = false;
    doc.oversized = false;
    if (f.parquet) {
      if (parquet_->next(doc.text, doc.id, doc.line)) {
        if (doc.text.size() > kMaxDocumentBytes) {
          doc.oversized = true;
          std::string().swap(doc.text);
        }
        return true;
      }
      if (parquet_->null_rows() > 0 && invalid_ == 0)
        first_invalid_ = f.path + ": a row whose '" + options_.text_field + "' is null";
      invalid_ += parquet_->null_rows();
      bytes_ += parquet_->bytes_read();
      parquet_.reset();
      continue;
    } else if (f.jsonl) {
      while (read_line(line)) {
        if (line_cut_) {  // too long to be kept: dropped unparsed
          doc.line = line_no_;
          doc.oversized = true;
          return true;
        }
        if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
        doc.text = std::move(line);
        line = std::string();
        doc.line = line_no_;
        doc.json_record = true;
        if (defer_json_) return true;
        std::string why;
        if (parse_json_record(doc, options_, f.path, invalid_ == 0 ? &why : nullptr)) return true;
        if (invalid_++ == 0) first_invalid_ = why;
      }
    } else if (options_.separator.empty()) {
      doc.line = 1;
      while (read_line(line)) add_line(doc, line, line_cut_);
      stream_.reset();
      return true;
    } else {
      bool any = false;
      while (read_line(line)) {
        std::string_view content(line);
        while (!content.empty() && (content.back() == '\n' || content.back() == '\r'))
          content.remove_suffix(1);
        if (content == options_.separator) {
          if (any) return true;
          continue;  // empty document between two separators
        }
        if (!any) doc.line = line_no_;
        any = true;
        add_line(doc, line, line_cut_);
      }
      if (any) return true;
    }
    stream_.reset();  // end of this file
  }
}

}  // namespace keel::data
