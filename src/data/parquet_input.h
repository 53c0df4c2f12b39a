// Parquet input for `keel prepare` (FineWeb, FineWeb-Edu, DCLM are published as parquet): the rows
// of one file, a string column as each document's text and, when the file has it, another column
// as the record's id. Read one row group at a time through Apache Arrow's C++ reader (the pyarrow
// wheel's libparquet; only parquet_input.cpp sees Arrow's headers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace keel::data {

// True when `path` starts with parquet's magic "PAR1".
bool is_parquet_file(const std::string& path);

class ParquetRows {
 public:
  // Opens the file and finds the columns; throws DataError naming the file, the missing or
  // non-string column and the columns there are.
  ParquetRows(const std::string& path, const std::string& text_field, const std::string& id_field);
  ~ParquetRows();
  ParquetRows(const ParquetRows&) = delete;
  ParquetRows& operator=(const ParquetRows&) = delete;
  // The next row (0-based `row`); a null text is skipped and counted in null_rows(). False at the
  // end. `id` is the id column's value as text ("" when null or absent).
  bool next(std::string& text, std::string& id, int64_t& row);
  int64_t null_rows() const { return null_rows_; }
  int64_t bytes_read() const { return bytes_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t null_rows_ = 0, bytes_ = 0;
};

}  // namespace keel::data
