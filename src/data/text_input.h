// The inputs of `keel prepare`: which files (paths, directories walked recursively, shell globs),
// how to read them (plain, gzip, zstd by extension) and how to cut them into documents (a file per
// document, documents separated by a line equal to a separator, JSONL records with a text field,
// or parquet rows with a text column, data/parquet_input.h). Reading is streaming: one document
// (parquet: one row group) at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace keel::data {

class ParquetRows;

// A document longer than this is never held whole: its reader keeps reading to its end without
// keeping it, and prepare drops it and counts it (report.json's removed_too_long). Real text is far
// shorter (a long book is a few MB); the per-document filters take memory in proportion to the
// document (the repetition filter 16 bytes a byte), so one decompression bomb's line could
// otherwise take the machine down.
inline constexpr size_t kMaxDocumentBytes = size_t{16} << 20;

struct InputOptions {
  // auto|text|jsonl|parquet; auto: .jsonl/.ndjson (+.gz/.zst) are JSONL, .parquet (or a file that
  // starts with parquet's magic) parquet, the rest text
  std::string format = "auto";
  std::string text_field = "text";  // JSONL key / parquet column holding the document text
  std::string id_field = "id";  // JSONL key / parquet column of the record's own id (provenance)
  std::string separator;        // text: a line equal to this ends a document; "" = one per file
};

struct InputFile {
  std::string path;
  bool jsonl = false;
  bool parquet = false;
  const char* format() const { return parquet ? "parquet" : jsonl ? "jsonl" : "text"; }
};

// Expands files, directories and globs into a sorted, de-duplicated list of readable files
// (symlinks to the same file count once; files that look binary are skipped and listed in
// `skipped`). Throws DataError when a spec matches nothing.
std::vector<InputFile> expand_inputs(const std::vector<std::string>& specs,
                                     const InputOptions& options,
                                     std::vector<std::string>* skipped);

struct Document {
  std::string text;
  int64_t file = 0;  // index into the expanded input list
  int64_t line = 0;  // 1-based line where the document starts (JSONL: its record's line); for
                     // parquet its 0-based row
  std::string id;    // JSONL, parquet: the record's id field (a string, or a number as written)
  bool json_record = false;  // `text` is still a JSONL line (a reader that defers parsing)
  bool oversized = false;    // longer than kMaxDocumentBytes: `text` is empty, the document dropped
};

// Parses a JSONL line a reader deferred (Document::json_record) in place: text and id from their
// fields. False for a line that is not a JSON object with a string text field; `why` then says so
// as DocumentReader::first_invalid() would. Thread-safe.
bool parse_json_record(Document& doc, const InputOptions& options, const std::string& path,
                       std::string* why);

// Reads every document of the input files, in order.
class DocumentReader {
 public:
  // `defer_json`: JSONL lines come back unparsed (Document::json_record), for the caller to parse
  // on its threads (parse_json_record) and count what is invalid; next() parses them otherwise.
  DocumentReader(std::vector<InputFile> files, InputOptions options, bool defer_json = false);
  ~DocumentReader();
  // False at the end of the inputs. JSONL lines that are not JSON objects with a string text
  // field are skipped and counted (invalid_records()); the first is named in first_invalid().
  bool next(Document& doc);
  int64_t bytes_read() const;
  int64_t invalid_records() const { return invalid_; }
  const std::string& first_invalid() const { return first_invalid_; }

 private:
  // False at the end of the current file; a line past kMaxDocumentBytes is read to its end and
  // cut there (line_cut_).
  bool read_line(std::string& line);
  bool open_next_file();

  class Stream;
  std::vector<InputFile> files_;
  InputOptions options_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<ParquetRows> parquet_;
  int64_t current_ = -1, line_no_ = 0, bytes_ = 0, invalid_ = 0;
  std::string first_invalid_;
  std::string buffer_;
  size_t buffer_pos_ = 0;
  bool eof_ = true;
  bool line_cut_ = false;
  bool defer_json_ = false;
};

}  // namespace keel::data
